//! Our codec on the real NeuCodec decoder architecture: tests/data/neucodec-decoder holds the
//! `neucodec` package's decoder classes with random weights exported to ONNX (the I/O of
//! `neuphonic/neucodec-onnx-decoder`), torch's own decode of it, and the vendor's streaming decode
//! (`NeuTTS._infer_stream_ggml` of neutts 1.4.1, verbatim) of it, all written by
//! tools/neucodec_reference.py (scripts/neucodec-reference.sh regenerates and compares).

mod common;

use std::path::PathBuf;

use onebit_tts::codec::CodecDecoder;
use onebit_tts::codec::stream::{SAMPLES_PER_CODE, StreamDecoder, TailMode, Windows, decode_whole};
use onebit_tts::package::CodecPackage;
use serde_json::Value;

fn dir() -> PathBuf {
    common::repo().join("tests/data/neucodec-decoder")
}

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("reference.json")).unwrap()).unwrap()
}

fn samples(file: &Value) -> Vec<f32> {
    std::fs::read(dir().join(file.as_str().unwrap()))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

fn ids(v: &Value) -> Vec<i32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_i64().unwrap() as i32)
        .collect()
}

/// The decoder as the product loads a codec directory that holds only the vendor's `model.onnx`.
fn decoder() -> CodecDecoder {
    let pkg = CodecPackage::load(&dir()).unwrap();
    assert_eq!((pkg.sample_rate, pkg.hop_length), (24_000, 480));
    let env = onebit_tts::runtime::environment(None).unwrap();
    CodecDecoder::load(env, &pkg, &Default::default()).unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn scale(a: &[f32]) -> f32 {
    a.iter().map(|x| x.abs()).fold(0.0, f32::max)
}

#[test]
fn the_committed_reference_is_what_its_manifest_says() {
    let m = manifest();
    let listed = m["sha256"].as_object().unwrap();
    let mut present: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "reference.json")
        .collect();
    present.sort();
    let mut names: Vec<&String> = listed.keys().collect();
    names.sort();
    assert_eq!(names, present.iter().collect::<Vec<_>>());
    for (name, want) in listed {
        let got = onebit_tts::package::hub::sha256_file(&dir().join(name)).unwrap();
        assert_eq!(&got, want.as_str().unwrap(), "{name}");
    }
    // The real decoder's settings, not a stand-in's.
    assert_eq!(m["decoder"]["n_fft"], 1920);
    assert_eq!(m["decoder"]["hop"], 480);
    assert_eq!(
        m["decoder"]["fsq_levels"],
        serde_json::json!([4, 4, 4, 4, 4, 4, 4, 4])
    );
    assert_eq!(m["versions"]["neutts"], "1.4.1");
}

#[test]
fn whole_decode_matches_torchs_decode_of_the_real_architecture() {
    let mut codec = decoder();
    for case in manifest()["cases"].as_array().unwrap() {
        let generated = ids(&case["generated"]);
        let want = samples(&case["torch_whole"]);
        let got = decode_whole(|c: &[i32]| codec.decode(&as_codes(c)), &generated).unwrap();
        assert_eq!(got.len(), generated.len() * SAMPLES_PER_CODE);
        let (diff, s) = (max_diff(&got, &want), scale(&want));
        println!("{}: within {diff} of torch (scale {s})", case["name"]);
        // torch's FFT and matmul sum in other orders than ONNX Runtime's: 1.4e-4 of the scale
        // measured. A wrong window, hop, padding or code lookup moves samples by the whole scale.
        assert!(
            diff <= 1e-3 * s,
            "{}: {diff} on a scale of {s}",
            case["name"]
        );
    }
}

fn as_codes(c: &[i32]) -> Vec<u32> {
    c.iter().map(|&x| x as u32).collect()
}

/// Our streaming decoder over the case: the chunks pushed while codes arrive, and the tail.
fn stream(codec: &mut CodecDecoder, case: &Value, mode: TailMode) -> (Vec<Vec<f32>>, Vec<f32>) {
    let (chunks, tail, _) = stream_in(codec, case, mode, Windows::VENDOR);
    (chunks, tail)
}

#[test]
fn streaming_matches_the_vendors_stream_on_the_real_architecture() {
    let mut codec = decoder();
    for case in manifest()["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let n_gen = case["generated"].as_array().unwrap().len();
        let vendor = samples(&case["vendor_stream"]);
        let vendor_chunks: Vec<usize> = case["vendor_chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(vendor.len(), vendor_chunks.iter().sum::<usize>());
        let s = scale(&vendor);
        for mode in [TailMode::Vendor, TailMode::Aligned] {
            let (chunks, tail) = stream(&mut codec, case, mode);
            // Every chunk emitted while codes arrive is the vendor's, at the same point.
            let streamed: Vec<usize> = chunks.iter().map(Vec::len).collect();
            assert_eq!(
                streamed,
                vendor_chunks[..vendor_chunks.len() - 1],
                "{name} {mode:?}"
            );
            let ours: Vec<f32> = chunks.concat();
            let diff = max_diff(&ours, &vendor[..ours.len()]);
            // The same graph on the same ONNX Runtime version as the vendor's decoder class: 0
            // measured; 1e-6 (1e-5 of the scale) leaves room for another CPU's kernels.
            assert!(diff <= 1e-6, "{name} {mode:?}: {diff}");
            assert_eq!(ours.len() + tail.len(), n_gen * SAMPLES_PER_CODE);
            if mode == TailMode::Vendor {
                // The vendor's final piece, cut to one frame per code (it emits one frame more).
                let all = [ours, tail].concat();
                let diff = max_diff(&all, &vendor[..all.len()]);
                println!("{name}: vendor stream within {diff} (scale {s})");
                assert!(diff <= 1e-6, "{name} tail: {diff}");
            }
        }
    }
}

/// Signal-to-difference ratio of `got` against `want`, in dB.
fn snr_db(want: &[f32], got: &[f32]) -> f64 {
    let (mut s, mut e) = (0f64, 0f64);
    for (w, g) in want.iter().zip(got) {
        s += f64::from(*w).powi(2);
        e += f64::from(w - g).powi(2);
    }
    10.0 * (s / e.max(1e-30)).log10()
}

/// Our streaming decoder over the case in a window layout: the chunks pushed while codes arrive,
/// the tail, and the frames its decoder runs decoded.
fn stream_in(
    codec: &mut CodecDecoder,
    case: &Value,
    mode: TailMode,
    windows: Windows,
) -> (Vec<Vec<f32>>, Vec<f32>, usize) {
    let mut frames = 0;
    let reference = ids(&case["reference"]);
    let mut dec = StreamDecoder::with_layout(
        |c: &[i32]| {
            frames += c.len();
            codec.decode(&as_codes(c))
        },
        &reference,
        mode,
        windows,
    );
    let mut chunks = Vec::new();
    for code in ids(&case["generated"]) {
        if let Some(chunk) = dec.push(code).unwrap() {
            chunks.push(chunk);
        }
    }
    let tail = dec.finish().unwrap();
    (chunks, tail, frames)
}

/// The whole stream of a case in a window layout, with the aligned tail, and its frames decoded.
fn whole_stream(codec: &mut CodecDecoder, case: &Value, windows: Windows) -> (Vec<f32>, usize) {
    let (chunks, tail, frames) = stream_in(codec, case, TailMode::Aligned, windows);
    ([chunks.concat(), tail].concat(), frames)
}

/// What a shorter look-back, longer chunks or a shorter first chunk cost in samples on the real
/// architecture: the decoder's transformer attends over its whole window, so any other layout
/// changes samples.
/// `cargo test --release --test neucodec_reference -- --nocapture layouts` prints the table
/// docs/performance.md quotes.
#[test]
fn other_window_layouts_change_samples_by_a_measured_amount() {
    let mut codec = decoder();
    for case in manifest()["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let n = case["generated"].as_array().unwrap().len();
        let (vendor, vendor_frames) = whole_stream(&mut codec, case, Windows::VENDOR);
        assert_eq!(vendor.len(), n * SAMPLES_PER_CODE);
        for layout in ["25:25", "50:50", "25:50", "10:25", "50:25:10", "25:25:10"] {
            let windows: Windows = layout.parse().unwrap();
            let (ours, frames) = whole_stream(&mut codec, case, windows);
            assert_eq!(ours.len(), vendor.len(), "{name} {layout}");
            let (diff, snr) = (max_diff(&ours, &vendor), snr_db(&vendor, &ours));
            println!(
                "{name} ({n} codes) {layout}: {:.2} frames/code (vendor {:.2}), max |diff| {diff:.4} \
                 on a scale of {:.4}, SNR {snr:.1} dB",
                frames as f64 / n as f64,
                vendor_frames as f64 / n as f64,
                scale(&vendor)
            );
            // A misplaced window moves samples by the whole scale (SNR near 0 dB or below); the
            // layouts above measured 10-31 dB on this random-weight decoder.
            assert!(snr > 8.0, "{name} {layout}: SNR {snr} dB");
            // A shorter first chunk may add one window (its look-back, the chunk, 5 of
            // look-ahead and an overlap frame each side); the other layouts only save frames.
            let extra = if windows.first == Windows::VENDOR.first {
                0
            } else {
                windows.lookback + windows.first + 7
            };
            assert!(
                frames <= vendor_frames + extra,
                "{name} {layout}: {frames} frames"
            );
            if windows.lookback == Windows::VENDOR.lookback
                && windows.first == Windows::VENDOR.first
            {
                // The first chunk's window is the vendor's: its samples are too.
                let first = 25 * SAMPLES_PER_CODE;
                let d = max_diff(
                    &ours[..first.min(n * SAMPLES_PER_CODE)],
                    &vendor[..first.min(n * SAMPLES_PER_CODE)],
                );
                assert_eq!(d, 0.0, "{name} {layout}: first chunk");
            }
        }
    }
}
