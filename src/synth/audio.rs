//! Codes to audio: decoding each piece (in the vendor's overlapping windows while its codes
//! arrive, or whole once it has ended), the pause and fades where pieces meet, and the output
//! pipeline (speed, rate, encoding). A synthesis and `onebit-tts decode` both go through
//! [`AudioStage`], which is why saved codes decode to the bytes the synthesis wrote.

use std::ops::{ControlFlow, Range};
use std::time::{Duration, Instant};

use crate::audio::{OutputPipeline, OutputSpec};
use crate::codec::stream::{StreamDecoder, StreamError, TailMode, Windows, decode_whole};
use crate::codec::{CodecError, CodecPool};
use crate::runtime::turns::waited_here;

use super::{SynthError, SynthEvent};

/// Pause inserted between pieces of a long text, and the fade that keeps the joins click-free.
pub const PIECE_PAUSE_S: f32 = 0.2;
const PIECE_FADE_S: f32 = 0.01;

/// What the audio stage spent and made.
#[derive(Debug, Clone, Copy, Default)]
pub struct AudioTally {
    /// Decoded samples at the codec rate (before any speed change or resampling).
    pub samples: usize,
    pub bytes: usize,
    pub codec: Duration,
    pub encode: Duration,
    /// From the request's start to the first bytes handed out.
    pub first_audio: Option<Duration>,
    /// A listener's waits after the first audio ([`crate::metrics::StageTimings::stall`]).
    pub stall: Duration,
}

type Decode<'a> = Box<dyn FnMut(&[i32]) -> Result<Vec<f32>, CodecError> + 'a>;

/// The piece being decoded.
struct PieceAudio<'a> {
    stream: Option<StreamDecoder<Decode<'a>, CodecError>>,
    /// No audio of this piece has gone out yet (its fade-in is still to apply).
    first_chunk: bool,
    fade_in: usize,
    fade_out: usize,
}

/// Codes to encoded bytes for one request, piece by piece. Every method that hands bytes to the
/// sink returns `false` when the sink asked to stop.
pub(crate) struct AudioStage<'a> {
    codec: &'a CodecPool,
    pipeline: OutputPipeline,
    /// The voice's codes: left context of the first streamed window of every piece.
    reference: Vec<i32>,
    /// The window layout when decoding while codes arrive; `None`: each piece whole.
    windows: Option<Windows>,
    pieces: usize,
    pause: Vec<f32>,
    /// Codec-rate samples per second of output: a markup pause lasts its time in the output
    /// whatever the speed (the speed change stretches what goes through the pipeline).
    pause_rate: f64,
    fade: usize,
    /// Samples pushed through the output pipeline at a time (one second at the codec's rate).
    block: usize,
    t0: Instant,
    tally: AudioTally,
    piece: Option<PieceAudio<'a>>,
    /// Codec-rate samples emitted before the current (or last) piece's first one: its pause
    /// is behind it.
    piece_start: usize,
}

impl<'a> AudioStage<'a> {
    /// `windows`: decode in overlapping windows of this layout as codes arrive (the streaming
    /// path); `None`: each piece whole. `t0` is the request's start, for the first-audio time.
    pub fn new(
        codec: &'a CodecPool,
        output: &OutputSpec,
        codec_rate: u32,
        reference: &[u32],
        pieces: usize,
        windows: Option<Windows>,
        t0: Instant,
    ) -> Result<Self, SynthError> {
        // Setting up the encoder (LAME, libopus, ...) is part of encoding's cost.
        let t = Instant::now();
        let pipeline = OutputPipeline::new(output, codec_rate)?;
        let tally = AudioTally {
            encode: t.elapsed(),
            ..AudioTally::default()
        };
        Ok(Self {
            codec,
            pipeline,
            reference: as_i32(reference),
            windows,
            pieces,
            pause: vec![0.0f32; (PIECE_PAUSE_S * codec_rate as f32) as usize],
            pause_rate: f64::from(codec_rate) * f64::from(output.speed),
            fade: (PIECE_FADE_S * codec_rate as f32) as usize,
            block: codec_rate.max(1) as usize,
            t0,
            tally,
            piece: None,
            piece_start: 0,
        })
    }

    pub fn tally(&self) -> AudioTally {
        self.tally
    }

    /// Starts piece `index`: the pause before it (markup's `pause`, else the usual join after
    /// the first piece), and its decoder.
    pub fn begin_piece(
        &mut self,
        index: usize,
        pause: Option<Duration>,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<bool, SynthError> {
        if let Some(d) = pause {
            if !self.silence(d, sink)? {
                return Ok(false);
            }
        } else if index > 0 {
            let pause = std::mem::take(&mut self.pause);
            let go_on = self.emit(&pause, sink);
            self.pause = pause;
            if !go_on? {
                return Ok(false);
            }
        }
        self.piece_start = self.tally.samples;
        let codec = self.codec;
        let stream = self.windows.map(|windows| {
            let decode: Decode<'a> = Box::new(move |codes: &[i32]| decode_i32(codec, codes));
            StreamDecoder::with_layout(decode, &self.reference, TailMode::default(), windows)
        });
        // Fades only where pieces meet, so a one-piece request is the plain decoder output.
        self.piece = Some(PieceAudio {
            stream,
            first_chunk: true,
            fade_in: if index > 0 { self.fade } else { 0 },
            fade_out: if index + 1 < self.pieces {
                self.fade
            } else {
                0
            },
        });
        Ok(true)
    }

    /// The current piece's samples at the codec rate, counted from the request's first: from
    /// after its pause to what has gone out of it so far (all of it once
    /// [`end_piece`](Self::end_piece) returned). Seconds of output are these over the codec rate
    /// times the speed; resampling changes no time.
    pub fn piece_span(&self) -> Range<usize> {
        self.piece_start..self.tally.samples
    }

    /// One more code of the current piece: with windowed decoding, the audio of every window it
    /// completes goes out at once.
    pub fn push_code(
        &mut self,
        code: u32,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<bool, SynthError> {
        let Some(stream) = self.piece.as_mut().and_then(|p| p.stream.as_mut()) else {
            return Ok(true);
        };
        let (t, waits) = (Instant::now(), waited_here());
        let step = stream.push(code as i32);
        self.tally.codec += t.elapsed().saturating_sub(waited_here() - waits);
        let Some(mut samples) = step.map_err(stream_error)? else {
            return Ok(true);
        };
        if let Some(p) = self.piece.as_mut()
            && p.first_chunk
        {
            fade_edges(&mut samples, p.fade_in, 0);
            p.first_chunk = false;
        }
        self.emit(&samples, sink)
    }

    /// Ends the current piece, whose generated codes are `codes`: the rest of its audio (all of
    /// it when decoding whole) goes out.
    pub fn end_piece(
        &mut self,
        codes: &[u32],
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<bool, SynthError> {
        let Some(piece) = self.piece.take() else {
            return Ok(true);
        };
        let (t, waits) = (Instant::now(), waited_here());
        let mut rest = match piece.stream {
            Some(stream) => stream.finish().map_err(stream_error)?,
            None => decode_whole(|c: &[i32]| decode_i32(self.codec, c), &as_i32(codes))
                .map_err(stream_error)?,
        };
        self.tally.codec += t.elapsed().saturating_sub(waited_here() - waits);
        let fade_in = if piece.first_chunk { piece.fade_in } else { 0 };
        fade_edges(&mut rest, fade_in, piece.fade_out);
        self.emit(&rest, sink)
    }

    /// Silence lasting `d` in the output (a markup pause).
    pub fn silence(
        &mut self,
        d: Duration,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<bool, SynthError> {
        let mut n = (d.as_secs_f64() * self.pause_rate).round() as usize;
        // In blocks of a second at most: a long pause never needs one long buffer.
        let block = vec![0.0f32; n.min(self.pause_rate.ceil() as usize)];
        while n > 0 {
            let k = n.min(block.len());
            if !self.emit(&block[..k], sink)? {
                return Ok(false);
            }
            n -= k;
        }
        Ok(true)
    }

    /// Flushes the output pipeline (the container's end, an encoder's last frames), then hands
    /// out the patches of a whole file's front.
    pub fn finish(
        self,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<AudioTally, SynthError> {
        let t = Instant::now();
        let Self {
            pipeline,
            mut tally,
            t0,
            ..
        } = self;
        let done = pipeline.finish()?;
        tally.encode += t.elapsed();
        if hand_out(&mut tally, t0, &done.tail, sink) {
            for p in &done.patches {
                let patch = SynthEvent::Patch {
                    offset: p.offset,
                    bytes: &p.bytes,
                };
                if sink(patch).is_break() {
                    break;
                }
            }
        }
        Ok(tally)
    }

    /// Plays what went out so far to a listener who started at the first audio and pauses
    /// whenever it runs out: whatever of the time since then it could not fill was a stall.
    fn listen(&mut self) {
        let Some(first) = self.tally.first_audio else {
            return;
        };
        let had = Duration::from_secs_f64(self.tally.samples as f64 / self.pause_rate.max(1.0));
        self.tally.stall += new_stall(
            self.t0.elapsed().saturating_sub(first),
            self.tally.stall,
            had,
        );
    }

    /// Pushes samples through the output pipeline and hands the bytes to the sink, a second of
    /// audio at a time: a long piece decoded whole would otherwise pass through the speed
    /// change, the resampler and the encoder in one go, each making a copy as long as the piece
    /// (at speed 0.25 and 48 kHz, 8 times its samples), and several requests doing that at once
    /// were most of the server's memory. The pipeline's output does not depend on how its input
    /// is cut ([`OutputPipeline::push_part`]).
    fn emit(
        &mut self,
        samples: &[f32],
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<bool, SynthError> {
        self.listen();
        self.tally.samples += samples.len();
        // Empty input is still one push: it closes an Opus page as it always did.
        let blocks = samples.len().div_ceil(self.block).max(1);
        for (i, block) in (0..blocks).zip(samples.chunks(self.block).chain([&[][..]])) {
            let t = Instant::now();
            let bytes = if i + 1 < blocks {
                self.pipeline.push_part(block)?
            } else {
                self.pipeline.push(block)?
            };
            self.tally.encode += t.elapsed();
            if !hand_out(&mut self.tally, self.t0, &bytes, sink) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// The wait a listener adds now, `since_first` after the first audio, having waited `stalled`
/// so far and been given `had` of audio: the play time it could not fill.
fn new_stall(since_first: Duration, stalled: Duration, had: Duration) -> Duration {
    since_first.saturating_sub(stalled).saturating_sub(had)
}

/// Hands encoded bytes to the sink; false when it asked to stop.
fn hand_out(
    tally: &mut AudioTally,
    t0: Instant,
    bytes: &[u8],
    sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
) -> bool {
    if bytes.is_empty() {
        return true;
    }
    if tally.first_audio.is_none() {
        tally.first_audio = Some(t0.elapsed());
    }
    tally.bytes += bytes.len();
    sink(SynthEvent::Audio(bytes)).is_continue()
}

/// Linear fades over the first `fade_in` and last `fade_out` samples.
fn fade_edges(samples: &mut [f32], fade_in: usize, fade_out: usize) {
    let n = samples.len();
    let fi = fade_in.min(n);
    for (i, s) in samples.iter_mut().take(fi).enumerate() {
        *s *= i as f32 / fi as f32;
    }
    let fo = fade_out.min(n);
    for i in 0..fo {
        samples[n - 1 - i] *= i as f32 / fo as f32;
    }
}

fn as_i32(codes: &[u32]) -> Vec<i32> {
    codes.iter().map(|&c| c as i32).collect()
}

/// Decodes on a free codec session, held for this one call: requests running side by side
/// take turns per window, not per request.
fn decode_i32(codec: &CodecPool, codes: &[i32]) -> Result<Vec<f32>, CodecError> {
    let codes: Vec<u32> = codes.iter().map(|&c| c as u32).collect();
    codec.decode(&codes)
}

fn stream_error(e: StreamError<CodecError>) -> SynthError {
    SynthError::Codec(match e {
        StreamError::Decode(e) => e,
        StreamError::WrongLength {
            codes,
            expected,
            got,
        } => CodecError::WrongLength {
            codes,
            expected,
            got,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_waits_only_when_the_audio_runs_out() {
        let s = Duration::from_secs;
        // 2 s of audio went out at the start; 3 s later the next piece comes: 1 s of waiting.
        assert_eq!(new_stall(s(3), s(0), s(2)), s(1));
        // Having waited that second, at 4 s with 3 s given it has played 3 s: no new wait.
        assert_eq!(new_stall(s(4), s(1), s(3)), s(0));
        // Ahead of playback: nothing.
        assert_eq!(new_stall(s(1), s(0), s(5)), s(0));
        // 6 s in, 1 s waited, 4 s given: it ran dry after 5 s of wall time, 1 s more.
        assert_eq!(new_stall(s(6), s(1), s(4)), s(1));
    }
}
