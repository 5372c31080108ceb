//! Audio-stage throughput on one core: `cargo bench --bench audio [-- SECONDS]`.
//!
//! Resampling and time-stretch report "x real time per core" (seconds of audio processed per
//! second of one core); encoders report milliseconds of one core per second of 24 kHz audio.
//! Everything runs on the calling thread, so wall time is one core's time.

use std::convert::Infallible;
use std::f64::consts::PI;
use std::hint::black_box;
use std::time::{Duration, Instant};

use onebit_tts::audio::{AudioFormat, EncodeMode, Encoder, StreamResampler, TimeStretcher};
use onebit_tts::codec::stream::{SAMPLES_PER_CODE, StreamDecoder};

const RATE: u32 = 24_000;

fn speech_like(secs: f64, rate: u32) -> Vec<f32> {
    let n = (secs * f64::from(rate)) as usize;
    let sr = f64::from(rate);
    let mut phase = 0.0f64;
    (0..n)
        .map(|i| {
            let t = i as f64 / sr;
            phase += 2.0 * PI * 140.0 * (1.0 + 0.03 * (2.0 * PI * 5.0 * t).sin()) / sr;
            let env = 0.55 + 0.45 * (2.0 * PI * 4.0 * t).sin();
            let s: f64 = (1..=30).map(|k| (k as f64 * phase).sin() / k as f64).sum();
            (0.22 * env * s) as f32
        })
        .collect()
}

/// Best of three runs, to keep scheduler noise out.
fn time<F: FnMut()>(mut f: F) -> Duration {
    (0..3)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// Pieces the size of one streamed chunk (25 codes = 0.5 s), as the service feeds the stage.
const PIECE: usize = 25 * SAMPLES_PER_CODE;

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    let x = speech_like(secs, RATE);
    println!("input: {secs} s of 24 kHz speech-like audio, fed in {PIECE}-sample pieces\n");

    println!("resample (24 kHz in)            x real time per core");
    for out in [16_000u32, 22_050, 44_100, 48_000, 8_000, 17_001] {
        let d = time(|| {
            let mut r = StreamResampler::new(RATE, out).expect("resampler");
            for p in x.chunks(PIECE) {
                black_box(r.process(p).expect("process"));
            }
            black_box(r.finish().expect("finish"));
        });
        println!(
            "  -> {out:>6} Hz                    {:>8.0}x",
            secs / d.as_secs_f64()
        );
    }

    println!("\ntime-stretch (WSOLA, 24 kHz)    x real time per core (input / output audio)");
    for speed in [0.25f32, 0.5, 0.8, 1.25, 1.5, 2.0, 4.0] {
        let d = time(|| {
            let mut t = TimeStretcher::new(RATE, speed).expect("stretcher");
            for p in x.chunks(PIECE) {
                black_box(t.process(p));
            }
            black_box(t.finish());
        });
        let out_secs = secs / f64::from(speed);
        println!(
            "  speed {speed:<4}                   {:>8.0}x / {:>6.0}x",
            secs / d.as_secs_f64(),
            out_secs / d.as_secs_f64()
        );
    }

    println!("\nencoders (24 kHz mono)          ms per second of audio   output kbit/s");
    for format in AudioFormat::ALL {
        for mode in [EncodeMode::Streaming, EncodeMode::Whole] {
            let mut size = 0;
            let d = time(|| {
                let mut e = Encoder::new(format, RATE, mode).expect("encoder");
                size = 0;
                for p in x.chunks(PIECE) {
                    size += e.push(p).expect("push").len();
                }
                size += e.finish().expect("finish").tail.len();
            });
            println!(
                "  {:<5} {:<9}                {:>8.3}             {:>7.1}",
                format.name(),
                format!("{mode:?}"),
                d.as_secs_f64() * 1000.0 / secs,
                size as f64 * 8.0 / secs / 1000.0
            );
        }
    }

    // What one short request pays: a fresh encoder (its set-up included), 0.5 s of audio, finish.
    println!("\none request of 0.5 s (new encoder, push, finish)   ms");
    let short = &x[..PIECE.min(x.len())];
    for format in AudioFormat::ALL {
        let d = time(|| {
            let mut e = Encoder::new(format, RATE, EncodeMode::Whole).expect("encoder");
            black_box(e.push(short).expect("push"));
            black_box(e.finish().expect("finish"));
        });
        println!(
            "  {:<5}                                          {:>8.3}",
            format.name(),
            d.as_secs_f64() * 1000.0
        );
    }

    // The streaming chunker's own cost (overlap-add, bookkeeping) with a free decoder.
    let codes: Vec<i32> = (0..(secs * onebit_tts::package::CODES_PER_SECOND) as i32).collect();
    let reference: Vec<i32> = (0..372).collect();
    let d = time(|| {
        let decode = |c: &[i32]| -> Result<Vec<f32>, Infallible> {
            Ok(vec![0.25; c.len() * SAMPLES_PER_CODE])
        };
        let mut s = StreamDecoder::new(decode, &reference);
        for &c in &codes {
            black_box(s.push(c).expect("push"));
        }
        black_box(s.finish().expect("finish"));
    });
    println!(
        "\nstream chunker (decoder excluded): {:.3} ms per second of audio",
        d.as_secs_f64() * 1000.0 / secs
    );
}
