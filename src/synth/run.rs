//! Running: the generation loop over a request's pieces, with the audio of each piece sent on
//! as it is made.

use std::cell::Cell;
use std::ops::ControlFlow;
use std::time::Instant;

use crate::engine::{CancelToken, StopReason};
use crate::metrics::StageTimings;

use super::audio::AudioStage;
use super::plan::piece_limit;
use super::timing::{PieceTiming, Timeline};
use super::{PieceOutcome, SpeechRequest, SynthError, SynthEvent, SynthesisReport, Synthesizer};

impl Synthesizer {
    /// Synthesises one request. `sink` sees progress and audio in order and may stop the request.
    ///
    /// Streaming requests decode in the vendor's overlapping windows while codes are generated, so
    /// the first audio leaves after 30 codes (F + 5 in a layout `L:C:F`); whole requests decode each piece once, as the vendor's
    /// non-streaming path does. Long texts run piece by piece into one continuous output.
    pub fn synthesize(
        &self,
        req: &SpeechRequest,
        cancel: &CancelToken,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<SynthesisReport, SynthError> {
        let t0 = Instant::now();
        let budget = self.budget;
        let plan = self
            .front
            .plan(req, budget, req.generation.min_new_tokens)?;
        let (pieces, voice) = (&plan.pieces, &plan.voice);
        let front_end = t0.elapsed();
        let rate = self.package().codec.sample_rate;
        let mut audio = AudioStage::new(
            &self.codec,
            &req.output,
            rate,
            &voice.codes,
            pieces.len(),
            req.output.streaming.then_some(self.windows),
            t0,
        )?;
        let estimated_codes = pieces.iter().map(|p| p.estimated_codes).sum();
        if sink(SynthEvent::Started {
            prompt_tokens: pieces.iter().map(|p| p.ids.len()).sum(),
            estimated_codes,
        })
        .is_break()
        {
            cancel.cancel();
        }

        let mut out = SynthesisReport {
            codes: Vec::new(),
            prompt_tokens: 0,
            cached_tokens: 0,
            seed: 0,
            stop: StopReason::Length,
            samples: 0,
            sample_rate: rate,
            speed: req.output.speed,
            bytes: 0,
            pieces: Vec::with_capacity(pieces.len()),
            planned_pieces: pieces.len(),
            timeline: Timeline::new(req.output.sample_rate, req.output.speed),
            timings: StageTimings::default(),
            npu_commands: None,
        };
        let mut retried = false;
        // The request's max_new_tokens bounds the whole request: what is left of it carries over
        // from piece to piece.
        let mut left = req.generation.max_new_tokens;
        // Some piece ended at its limit rather than at the end token.
        let mut cut = false;
        for (i, piece) in pieces.iter().enumerate() {
            if cancel.is_cancelled() {
                out.stop = StopReason::Cancelled;
                break;
            }
            if left == Some(0) {
                tracing::warn!(
                    "max_new_tokens ({}) used up after {i} of {} pieces: the rest is not spoken (finish reason length)",
                    req.generation.max_new_tokens.unwrap_or_default(),
                    pieces.len()
                );
                cut = true;
                break;
            }
            let (limit, limited_by) =
                piece_limit(piece, budget, req.generation.min_new_tokens, left);
            let mut params = req.generation.clone();
            params.max_new_tokens = Some(limit);
            if let Some(seed) = params.sampling.seed {
                // Each piece gets its own stream, still fixed by the request's seed.
                params.sampling.seed = Some(seed.wrapping_add(i as u64));
            }
            if sink(SynthEvent::Piece {
                index: i,
                count: pieces.len(),
                text: &piece.text,
                prompt_tokens: piece.ids.len(),
                max_new_tokens: limit,
            })
            .is_break()
                || !audio.begin_piece(i, piece.pause_before, sink)?
            {
                out.stop = StopReason::Cancelled;
                break;
            }
            // Bytes out before this piece: while a whole-file request generates, none go out.
            let sent_before = audio.tally().bytes;
            let mut failure: Option<SynthError> = None;
            let base = out.codes.len();
            let mut stopped_by_sink = false;
            let made = Cell::new(0usize);
            let mut on_code = |code: u32| {
                let index = base + made.get();
                made.set(made.get() + 1);
                if sink(SynthEvent::Code { index, code }).is_break() {
                    stopped_by_sink = true;
                    return ControlFlow::Break(());
                }
                match audio.push_code(code, sink) {
                    Ok(true) => ControlFlow::Continue(()),
                    Ok(false) => {
                        stopped_by_sink = true;
                        ControlFlow::Break(())
                    }
                    Err(e) => {
                        failure = Some(e);
                        ControlFlow::Break(())
                    }
                }
            };
            // One retry per request, after the synthesizer's delay, for a failure a retry may
            // cure ([`EngineError::is_transient`]: the NPU's one-off first-dispatch timeout, a
            // worker that died) — on the batched path as on the one-at-a-time one, and only for
            // a whole-file request before any byte went out: a stream is never retried. The sink
            // then sees this piece's codes again from its first index.
            let generation = loop {
                let err = match self.scheduler.generate_shared(
                    &piece.ids,
                    piece.voice_prefix,
                    &params,
                    cancel,
                    &mut on_code,
                ) {
                    Ok(g) => break g,
                    Err(e) => e,
                };
                let safe = !retried
                    && !req.output.streaming
                    && sent_before == 0
                    && !cancel.is_cancelled()
                    && err.is_transient();
                let Some(delay) = self.retry.filter(|_| safe) else {
                    return Err(err.into());
                };
                tracing::warn!(
                    "{} request failed: {err}; retrying it once in {:.1} s (not streamed, no audio sent yet)",
                    self.device,
                    delay.as_secs_f64()
                );
                std::thread::sleep(delay);
                retried = true;
                made.set(0);
            };
            if let Some(e) = failure.take() {
                return Err(e);
            }
            out.timings.prefill += generation.prefill;
            out.timings.decode += generation.decode;
            out.timings.turn_wait += generation.turn_wait;
            out.prompt_tokens += generation.prompt_tokens;
            out.cached_tokens += generation.cached_tokens;
            if i == 0 {
                out.seed = generation.seed;
            }
            out.stop = generation.stop;
            out.codes.extend_from_slice(&generation.codes);
            if let Some(n) = generation.npu_commands {
                out.npu_commands = Some(out.npu_commands.unwrap_or(0) + n);
            }
            out.pieces.push(PieceOutcome {
                text: piece.text.clone(),
                prompt_ids: piece.ids.clone(),
                max_new_tokens: limit,
                seed: generation.seed,
                stop: generation.stop,
                codes: generation.codes.clone(),
                pause_before: piece.pause_before,
                pause_after: None,
            });
            if generation.stop == StopReason::Cancelled || stopped_by_sink {
                out.stop = StopReason::Cancelled;
                break;
            }
            left = left.map(|l| l.saturating_sub(generation.codes.len()));
            if generation.stop == StopReason::Length {
                tracing::warn!(
                    "piece {}/{} ended at {limit} codes ({limited_by}) without its end token (finish reason length): {:?}",
                    i + 1,
                    pieces.len(),
                    piece.text
                );
                cut = true;
            }
            if !audio.end_piece(&generation.codes, sink)? {
                out.stop = StopReason::Cancelled;
                break;
            }
            // The piece's audio is all out: where it lies is known to the sample, and a stream
            // can send its captions now.
            out.timeline.pieces.push(PieceTiming::new(
                i,
                &piece.text,
                &piece.prepared,
                audio.piece_span(),
                generation.codes.len(),
                f64::from(rate) * f64::from(req.output.speed),
            ));
            if let Some(t) = out.timeline.pieces.last()
                && sink(SynthEvent::Timing(t)).is_break()
            {
                out.stop = StopReason::Cancelled;
                break;
            }
        }
        if cut && out.stop != StopReason::Cancelled {
            out.stop = StopReason::Length;
        }
        // The pause markup asked for after the text, once all of it was spoken.
        if let Some(d) = plan.trailing_pause
            && out.stop != StopReason::Cancelled
            && out.pieces.len() == pieces.len()
        {
            if let Some(last) = out.pieces.last_mut() {
                last.pause_after = Some(d);
            }
            if !audio.silence(d, sink)? {
                out.stop = StopReason::Cancelled;
            }
        }
        let tally = if out.stop == StopReason::Cancelled {
            audio.tally()
        } else {
            audio.finish(sink)?
        };
        out.samples = tally.samples;
        out.timeline.audio_seconds =
            out.samples as f64 / (f64::from(rate) * f64::from(req.output.speed));
        out.bytes = tally.bytes;
        out.timings.codec = tally.codec;
        out.timings.encode = tally.encode;
        out.timings.first_audio = tally.first_audio;
        out.timings.stall = tally.stall;
        out.timings.front_end = front_end;
        out.timings.total = t0.elapsed();
        if out.npu_idle() {
            tracing::warn!(
                "{} codes on --device npu, but the NPU's driver counted no command for this \
                 request: it ran as a CPU fallback",
                out.codes.len()
            );
        }
        Ok(out)
    }
}
