//! The whole front end against the vendor's own prompts: ../shared/golden/prompts.json holds
//! `NeuTTS._apply_chat_template` output over the reconstructed NeuTTS tokenizer and the vendor
//! voices. Our FrontEnd (normalise, espeak-ng phonemes, tokenize, splice) must give the same ids.

mod common;

use std::path::Path;

use onebit_tts::prompt::InputFormat;
use onebit_tts::synth::{FrontEnd, SpeechRequest};
use onebit_tts::voice::{ImportOptions, VoiceStore, import_path};

/// A package dir with the shared NeuTTS tokenizer in place of the tiny one (and the logits width
/// that goes with it); everything else comes from the generated tiny package.
fn package_with_shared_tokenizer(shared: &Path) -> std::path::PathBuf {
    let dir = common::tempdir("golden-pkg");
    common::copy_dir(&common::model("tiny"), &dir);
    std::fs::copy(
        shared.join("fixtures/neutts-tokenizer/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let p = dir.join("genai_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["model"]["vocab_size"] = 217_652.into();
    std::fs::write(&p, v.to_string()).unwrap();
    dir
}

#[test]
fn prompts_equal_the_vendor_template_output() {
    let Some(shared) = common::shared() else {
        common::skip(
            "prompts_equal_the_vendor_template_output",
            "../shared absent",
        );
        return;
    };
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shared.join("golden/prompts.json")).unwrap())
            .unwrap();
    let voices_dir = common::tempdir("golden-voices");
    for name in ["dave", "jo", "greta", "juliette", "mateo"] {
        let lang = match name {
            "greta" => "de",
            "juliette" => "fr-fr",
            "mateo" => "es",
            _ => "en-us",
        };
        let opts = ImportOptions {
            language: Some(lang.into()),
            ..ImportOptions::default()
        };
        for v in import_path(&shared.join(format!("voices-reference/{name}.pt")), &opts).unwrap() {
            VoiceStore::save(&voices_dir, &v, true).unwrap();
        }
    }
    let pkg =
        onebit_tts::package::ModelPackage::load(&package_with_shared_tokenizer(&shared), None)
            .unwrap();
    let store = VoiceStore::open(&[voices_dir]).unwrap();
    let front = FrontEnd::new(pkg, store);
    let cases = golden["cases"].as_array().unwrap();
    let mut checked = 0;
    let mut groups: std::collections::BTreeMap<String, Vec<(Vec<u32>, usize)>> = Default::default();
    for case in cases {
        let format: InputFormat = case["input_format"].as_str().unwrap().parse().unwrap();
        let want_key = match format {
            InputFormat::Phonemes => "ids_bundled_espeak",
            InputFormat::Bpe => "ids",
        };
        let want: Vec<u32> = serde_json::from_value(case[want_key].clone()).unwrap();
        let req = SpeechRequest {
            text: case["text"].as_str().unwrap().to_owned(),
            voice: case["voice"].as_str().unwrap().to_owned(),
            language: Some(case["lang"].as_str().unwrap().parse().unwrap()),
            input_format: Some(format),
            // The vendor reads text as written: its prompts are those of unnormalised text.
            reading: onebit_tts::synth::Reading {
                normalize: false,
                ..Default::default()
            },
            ..SpeechRequest::default()
        };
        let pieces = front.plan(&req, 4096, 50).unwrap().pieces;
        assert_eq!(pieces.len(), 1);
        let ids = &pieces[0].ids;
        assert_eq!(
            ids, &want,
            "{} {} {:?}: {}",
            case["voice"], case["lang"], format, case["text"]
        );
        let key = format!("{} {format:?}", case["voice"]);
        groups
            .entry(key)
            .or_default()
            .push((ids.clone(), pieces[0].voice_prefix));
        checked += 1;
    }
    assert_eq!(checked, cases.len());
    // The voice part of each prompt (what the prefix cache may reuse) is the same in every
    // prompt of the voice, and no token of it differs between two of them: at most the
    // ids both texts happen to begin with lie beyond it.
    for (key, prompts) in &groups {
        let (first, n) = &prompts[0];
        for (ids, m) in prompts {
            let common = first.iter().zip(ids).take_while(|(a, b)| a == b).count();
            assert_eq!(m, n, "{key}: voice parts of other lengths");
            assert!(
                *n > 0 && *n <= common,
                "{key}: voice part {n}, shared {common}"
            );
            eprintln!(
                "{key}: voice part {n} of {} ids, shared {common}",
                ids.len()
            );
        }
    }
    eprintln!("prompt parity: {checked} vendor prompts identical");
}
