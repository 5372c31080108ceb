//! Ogg Opus (RFC 7845): libopus at the input rate when Opus has it (8, 12, 16, 24, 48 kHz, so
//! the model's 24 kHz goes straight in), other rates resampled to 48 kHz first.

use ogg::writing::{PacketWriteEndInfo, PacketWriter};
use opus::{Application, Bitrate, Channels};

use crate::audio::AudioError;
use crate::audio::format::AudioFormat;
use crate::audio::resample::StreamResampler;

/// The rate decoders play Ogg Opus at; granule positions and the pre-skip always count it.
pub const OPUS_RATE: u32 = 48_000;
/// Rates libopus encodes natively; any other input is resampled to [`OPUS_RATE`].
const NATIVE_RATES: [u32; 5] = [8_000, 12_000, 16_000, 24_000, 48_000];
/// 20 ms frames (in 48 kHz samples): the Opus default, the best quality per bit for speech.
pub const OPUS_FRAME_SAMPLES: usize = 960;
/// libopus' complexity 0..=10 (default 10). Measured on 24 kHz speech (benches/audio.rs): 5
/// costs about half of 10's time for a fraction of a dB of SNR at this bitrate, which keeps a
/// short request's encoding inside the server's overhead budget.
pub const OPUS_COMPLEXITY: i32 = 5;
/// Mono speech is near-transparent here, and it is half of MP3's bandwidth at 44.1 kHz.
pub const OPUS_BITRATE: i32 = 64_000;
/// Largest packet libopus produces for one frame (RFC 6716 §3.2.1 limit is 1275 bytes).
const MAX_PACKET: usize = 1500;
/// Any fixed serial works for a single-stream file.
const SERIAL: u32 = 0x6f6e_6562;
const VENDOR: &str = "onebit-tts libopus";

fn opus_err(message: &str, e: opus::Error) -> AudioError {
    AudioError::codec_source(AudioFormat::Opus, message, e)
}

fn ogg_err(e: std::io::Error) -> AudioError {
    AudioError::codec_source(AudioFormat::Opus, "ogg page", e)
}

fn opus_head(pre_skip: u16, input_rate: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(19);
    h.extend_from_slice(b"OpusHead");
    h.push(1); // version
    h.push(1); // channels
    h.extend_from_slice(&pre_skip.to_le_bytes());
    h.extend_from_slice(&input_rate.to_le_bytes());
    h.extend_from_slice(&0i16.to_le_bytes()); // output gain
    h.push(0); // mapping family: mono/stereo
    h
}

fn opus_tags() -> Vec<u8> {
    let mut t = Vec::with_capacity(16 + VENDOR.len());
    t.extend_from_slice(b"OpusTags");
    t.extend_from_slice(&(VENDOR.len() as u32).to_le_bytes());
    t.extend_from_slice(VENDOR.as_bytes());
    t.extend_from_slice(&0u32.to_le_bytes()); // no user comments
    t
}

pub(super) struct OpusEncoder {
    encoder: opus::Encoder,
    resampler: Option<StreamResampler>,
    writer: PacketWriter<'static, Vec<u8>>,
    /// Samples of one 20 ms frame at the encoder's rate.
    frame_len: usize,
    /// 48 kHz samples per encoder-rate sample (the rates Opus has all divide 48 kHz).
    to_48k: u64,
    /// In 48 kHz samples.
    pre_skip: u64,
    /// Encoder-rate samples not yet in a full frame.
    frame: Vec<f32>,
    /// 48 kHz samples of real audio so far (padding excluded).
    samples_48k: u64,
    packets: u64,
    /// The newest packet, not yet written: the Ogg writer only closes a page on a packet marked
    /// as its end, and whether a packet ends a page (end of a push) or the stream (with the exact
    /// end granule that tells decoders where the audio stops) is known only afterwards.
    held: Option<Vec<u8>>,
    packet_buf: Vec<u8>,
}

impl OpusEncoder {
    pub(super) fn new(sample_rate: u32) -> Result<Self, AudioError> {
        let native = NATIVE_RATES.contains(&sample_rate);
        let encoder_rate = if native { sample_rate } else { OPUS_RATE };
        let mut encoder = opus::Encoder::new(encoder_rate, Channels::Mono, Application::Audio)
            .map_err(|e| opus_err("init", e))?;
        encoder
            .set_bitrate(Bitrate::Bits(OPUS_BITRATE))
            .map_err(|e| opus_err("bitrate", e))?;
        encoder
            .set_complexity(OPUS_COMPLEXITY)
            .map_err(|e| opus_err("complexity", e))?;
        let to_48k = u64::from(OPUS_RATE / encoder_rate);
        // libopus reports its delay in samples at the rate it was opened with.
        let lookahead = encoder
            .get_lookahead()
            .map_err(|e| opus_err("lookahead", e))?;
        let pre_skip = u64::try_from(lookahead)
            .ok()
            .map(|l| l * to_48k)
            .and_then(|l| u16::try_from(l).ok())
            .ok_or_else(|| {
                AudioError::codec(AudioFormat::Opus, "encoder lookahead out of range")
            })?;
        let frame_len = OPUS_FRAME_SAMPLES / to_48k as usize;
        let resampler = if native {
            None
        } else {
            Some(StreamResampler::new_unchecked_output(
                sample_rate,
                OPUS_RATE,
            )?)
        };
        let mut writer = PacketWriter::new(Vec::new());
        // Both header packets end their pages, as RFC 7845 §3 requires.
        writer
            .write_packet(
                opus_head(pre_skip, sample_rate),
                SERIAL,
                PacketWriteEndInfo::EndPage,
                0,
            )
            .map_err(ogg_err)?;
        writer
            .write_packet(opus_tags(), SERIAL, PacketWriteEndInfo::EndPage, 0)
            .map_err(ogg_err)?;
        Ok(Self {
            encoder,
            resampler,
            writer,
            frame_len,
            to_48k,
            pre_skip: u64::from(pre_skip),
            frame: Vec::with_capacity(frame_len),
            samples_48k: 0,
            packets: 0,
            held: None,
            packet_buf: vec![0; MAX_PACKET],
        })
    }

    /// Encodes the full frame buffer; the previously held packet is written.
    fn encode_frame(&mut self) -> Result<(), AudioError> {
        let n = self
            .encoder
            .encode_float(&self.frame, &mut self.packet_buf)
            .map_err(|e| opus_err("encode", e))?;
        self.frame.clear();
        let packet = self.packet_buf[..n].to_vec();
        if let Some(prev) = self.held.replace(packet) {
            self.write(prev, false)?;
        }
        Ok(())
    }

    /// Writes the packet that ends at `packets + 1` frames, with its granule position.
    fn write(&mut self, packet: Vec<u8>, end_page: bool) -> Result<(), AudioError> {
        self.packets += 1;
        let granule = self.packets * OPUS_FRAME_SAMPLES as u64;
        let info = if end_page {
            PacketWriteEndInfo::EndPage
        } else {
            PacketWriteEndInfo::NormalPacket
        };
        self.writer
            .write_packet(packet, SERIAL, info, granule)
            .map_err(ogg_err)
    }

    fn feed(&mut self, samples: &[f32]) -> Result<(), AudioError> {
        self.samples_48k += samples.len() as u64 * self.to_48k;
        let mut rest = samples;
        while !rest.is_empty() {
            let take = (self.frame_len - self.frame.len()).min(rest.len());
            self.frame.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.frame.len() == self.frame_len {
                self.encode_frame()?;
            }
        }
        Ok(())
    }

    fn take_bytes(&mut self) -> Vec<u8> {
        std::mem::take(self.writer.inner_mut())
    }

    /// `end_page`: close the Ogg page so everything encoded so far can be sent now; without
    /// it only full pages come out, and the page layout is that of one push of everything fed
    /// until the next push that closes one.
    pub(super) fn push(&mut self, samples: &[f32], end_page: bool) -> Result<Vec<u8>, AudioError> {
        let resampled;
        let samples = match self.resampler.as_mut() {
            Some(r) => {
                resampled = r.process(samples)?;
                &resampled[..]
            }
            None => samples,
        };
        self.feed(samples)?;
        if end_page && let Some(p) = self.held.take() {
            self.write(p, true)?;
        }
        Ok(self.take_bytes())
    }

    pub(super) fn finish(mut self) -> Result<Vec<u8>, AudioError> {
        if let Some(r) = self.resampler.take() {
            let tail = r.finish()?;
            self.feed(&tail)?;
        }
        // The decoder output lags the input by the pre-skip, so encode silence until the packets
        // cover pre-skip + audio, and at least one packet so there is one to end the stream; the
        // end granule then trims the padding.
        let needed = self.pre_skip + self.samples_48k;
        let mut covered = (self.packets + u64::from(self.held.is_some()))
            * OPUS_FRAME_SAMPLES as u64
            + self.frame.len() as u64 * self.to_48k;
        while covered < needed || !self.frame.is_empty() || self.held.is_none() {
            let pad = self.frame_len - self.frame.len();
            self.frame.resize(self.frame_len, 0.0);
            covered += pad as u64 * self.to_48k;
            self.encode_frame()?;
        }
        if let Some(last) = self.held.take() {
            self.writer
                .write_packet(last, SERIAL, PacketWriteEndInfo::EndStream, needed)
                .map_err(ogg_err)?;
        }
        Ok(self.take_bytes())
    }
}
