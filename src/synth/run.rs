//! Running: the generation loop over a request's pieces, with the audio of each piece sent on
//! as it is made.

use std::cell::Cell;
use std::ops::ControlFlow;
use std::time::Instant;

use crate::audio::OutputPipeline;
use crate::codec::stream::{StreamDecoder, decode_whole};
use crate::engine::{CancelToken, StopReason};
use crate::metrics::StageTimings;

use super::audio::{PIECE_FADE_S, PIECE_PAUSE_S, as_i32, decode_i32, fade_edges, stream_error};
use super::plan::piece_limit;
use super::{SpeechRequest, SynthError, SynthEvent, SynthesisReport, Synthesizer};

impl Synthesizer {
    /// Synthesises one request. `sink` sees progress and audio in order and may stop the request.
    ///
    /// Streaming requests decode in the vendor's overlapping windows while codes are generated, so
    /// the first audio leaves after 30 codes; whole requests decode each piece once, as the vendor's
    /// non-streaming path does. Long texts run piece by piece into one continuous output.
    pub fn synthesize(
        &self,
        req: &SpeechRequest,
        cancel: &CancelToken,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<SynthesisReport, SynthError> {
        let t0 = Instant::now();
        let mut timings = StageTimings::default();
        let budget = self.budget;
        let (pieces, voice) = self
            .front
            .plan(req, budget, req.generation.min_new_tokens)?;
        timings.front_end = t0.elapsed();
        let rate = self.package().codec.sample_rate;
        // Setting up the encoder (LAME, libopus, ...) is part of encoding's cost.
        let t = Instant::now();
        let mut pipeline = OutputPipeline::new(&req.output, rate)?;
        timings.encode += t.elapsed();
        let estimated_codes = pieces.iter().map(|p| p.estimated_codes).sum();
        if sink(SynthEvent::Started {
            prompt_tokens: pieces.iter().map(|p| p.ids.len()).sum(),
            estimated_codes,
        })
        .is_break()
        {
            cancel.cancel();
        }

        let mut codec = self.codec.lock().map_err(|_| SynthError::Poisoned)?;
        let mut engine = self.engine.lock().map_err(|_| SynthError::Poisoned)?;
        let reference: Vec<i32> = voice.codes.iter().map(|&c| c as i32).collect();
        let pause = vec![0.0f32; (PIECE_PAUSE_S * rate as f32) as usize];
        let fade = (PIECE_FADE_S * rate as f32) as usize;
        let mut out = SynthesisReport {
            codes: Vec::new(),
            prompt_tokens: 0,
            seed: 0,
            stop: StopReason::Length,
            samples: 0,
            sample_rate: rate,
            speed: req.output.speed,
            bytes: 0,
            pieces: pieces.len(),
            timings,
        };
        // Read by the retry decision while the code callback holds `out`.
        let bytes_sent = Cell::new(0usize);
        let mut retried = false;
        // Pushes samples through the output pipeline and hands the bytes to the sink; false when
        // the caller wants to stop.
        let emit = |samples: &[f32],
                    out: &mut SynthesisReport,
                    pipeline: &mut OutputPipeline,
                    sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>|
         -> Result<bool, SynthError> {
            out.samples += samples.len();
            let t = Instant::now();
            let bytes = pipeline.push(samples)?;
            out.timings.encode += t.elapsed();
            if bytes.is_empty() {
                return Ok(true);
            }
            if out.timings.first_audio.is_none() {
                out.timings.first_audio = Some(t0.elapsed());
            }
            out.bytes += bytes.len();
            bytes_sent.set(out.bytes);
            Ok(sink(SynthEvent::Audio(&bytes)).is_continue())
        };

        let many = pieces.len() > 1;
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
            {
                out.stop = StopReason::Cancelled;
                break;
            }
            if i > 0 && !emit(&pause, &mut out, &mut pipeline, sink)? {
                out.stop = StopReason::Cancelled;
                break;
            }
            // Fades only where pieces meet, so a one-piece request is the plain decoder output.
            let fade_in = if i > 0 { fade } else { 0 };
            let fade_out = if many && i + 1 < pieces.len() {
                fade
            } else {
                0
            };
            let mut first_chunk = true;
            let mut failure: Option<SynthError> = None;
            let mut stream = req.output.streaming.then(|| {
                StreamDecoder::new(|codes: &[i32]| decode_i32(&mut codec, codes), &reference)
            });
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
                let Some(stream) = stream.as_mut() else {
                    return ControlFlow::Continue(());
                };
                let t = Instant::now();
                let step = stream.push(code as i32);
                out.timings.codec += t.elapsed();
                match step {
                    Ok(Some(mut samples)) => {
                        if first_chunk {
                            fade_edges(&mut samples, fade_in, 0);
                            first_chunk = false;
                        }
                        match emit(&samples, &mut out, &mut pipeline, sink) {
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
                    }
                    Ok(None) => ControlFlow::Continue(()),
                    Err(e) => {
                        failure = Some(stream_error(e));
                        ControlFlow::Break(())
                    }
                }
            };
            // One retry per request, after the engine's delay, for a failure the engine says a
            // retry may cure (the NPU's one-off first-dispatch timeout, a worker that died) — and
            // only for a whole-file request before any byte went out: a stream is never retried.
            // The sink then sees this piece's codes again from its first index.
            let generation = loop {
                let err = match engine.generate(
                    &self.candidates,
                    &piece.ids,
                    &params,
                    cancel,
                    &mut on_code,
                ) {
                    Ok(g) => break g,
                    Err(e) => e,
                };
                let safe = !retried
                    && !req.output.streaming
                    && bytes_sent.get() == 0
                    && !cancel.is_cancelled();
                let Some(delay) = safe.then(|| engine.retry_delay(&err)).flatten() else {
                    return Err(err.into());
                };
                tracing::warn!(
                    "{} request failed: {err}; retrying it once in {:.1} s (not streamed, no audio sent yet)",
                    engine.device(),
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
            out.prompt_tokens += generation.prompt_tokens;
            if i == 0 {
                out.seed = generation.seed;
            }
            out.stop = generation.stop;
            out.codes.extend_from_slice(&generation.codes);
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
            let t = Instant::now();
            let mut rest = match stream {
                Some(stream) => stream.finish().map_err(stream_error)?,
                None => decode_whole(
                    |codes: &[i32]| decode_i32(&mut codec, codes),
                    &as_i32(&generation.codes),
                )
                .map_err(stream_error)?,
            };
            out.timings.codec += t.elapsed();
            fade_edges(&mut rest, if first_chunk { fade_in } else { 0 }, fade_out);
            if !emit(&rest, &mut out, &mut pipeline, sink)? {
                out.stop = StopReason::Cancelled;
                break;
            }
        }
        if cut && out.stop != StopReason::Cancelled {
            out.stop = StopReason::Length;
        }
        if out.stop != StopReason::Cancelled {
            let t = Instant::now();
            let bytes = pipeline.finish()?;
            out.timings.encode += t.elapsed();
            if !bytes.is_empty() {
                if out.timings.first_audio.is_none() {
                    out.timings.first_audio = Some(t0.elapsed());
                }
                out.bytes += bytes.len();
                let _ = sink(SynthEvent::Audio(&bytes));
            }
        }
        out.timings.front_end = timings.front_end;
        out.timings.total = t0.elapsed();
        Ok(out)
    }
}
