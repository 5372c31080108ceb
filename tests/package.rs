//! Model package loading: the speech vocabulary derived from tokenizers, and the errors for broken
//! packages.

mod common;

use onebit_tts::package::{ModelPackage, PackageError, SpeechVocab, VocabError};
use tokenizers::Tokenizer;

/// A minimal tokenizer JSON: a word-level base of `base` tokens, the NeuTTS specials, then the
/// given speech token names in id order.
fn tokenizer_with(base: u32, speech: &[String]) -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    for i in 0..base {
        vocab.insert(format!("w{i}"), i.into());
    }
    vocab.insert("[UNK]".into(), base.into());
    let specials = [
        "<|TEXT_PROMPT_START|>",
        "<|TEXT_PROMPT_END|>",
        "<|SPEECH_GENERATION_START|>",
        "<|SPEECH_GENERATION_END|>",
    ];
    let added: Vec<serde_json::Value> = specials
        .iter()
        .map(|s| s.to_string())
        .chain(speech.iter().cloned())
        .zip(base + 1..)
        .map(|(s, id)| {
            serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    Tokenizer::from_bytes(serde_json::to_vec(&json).unwrap()).unwrap()
}

fn speech_names(n: u32) -> Vec<String> {
    (0..n).map(|c| format!("<|speech_{c}|>")).collect()
}

#[test]
fn speech_ids_are_derived_from_the_tokenizer() {
    let tok = tokenizer_with(10, &speech_names(65_536));
    let v = SpeechVocab::from_tokenizer(&tok).unwrap();
    // 10 base + [UNK] + 4 specials.
    assert_eq!(v.first, 15);
    assert_eq!(v.end, 14);
    assert_eq!(v.speech_end_exclusive(), 15 + 65_536);
    assert_eq!(v.id_to_code(15 + 65_535), Some(65_535));
    assert_eq!(v.id_to_code(14), None);
}

#[test]
fn too_few_or_too_many_speech_tokens_are_refused() {
    let tok = tokenizer_with(10, &speech_names(65_535));
    assert_eq!(
        SpeechVocab::from_tokenizer(&tok).unwrap_err(),
        VocabError::WrongCount { found: 65_535 }
    );
    let tok = tokenizer_with(10, &speech_names(65_537));
    let err = SpeechVocab::from_tokenizer(&tok).unwrap_err();
    assert_eq!(err, VocabError::WrongCount { found: 65_537 });
    assert!(err.to_string().contains("expected exactly 65536"), "{err}");
}

#[test]
fn non_contiguous_speech_tokens_are_refused() {
    let mut names = speech_names(65_536);
    names.swap(100, 101);
    let tok = tokenizer_with(10, &names);
    let err = SpeechVocab::from_tokenizer(&tok).unwrap_err();
    assert_eq!(
        err,
        VocabError::NotContiguous {
            code: 100,
            found: 15 + 101,
            expected: 15 + 100
        }
    );
    assert_eq!(
        err.to_string(),
        "speech tokens are not contiguous: <|speech_100|> has id 116, expected 115"
    );
}

#[test]
fn missing_speech_block_is_refused() {
    let tok = tokenizer_with(10, &[]);
    assert_eq!(
        SpeechVocab::from_tokenizer(&tok).unwrap_err(),
        VocabError::MissingToken("<|speech_0|>".into())
    );
}

#[test]
fn shared_neutts_tokenizer_has_the_real_layout() {
    let Some(shared) = common::shared() else {
        common::skip(
            "shared_neutts_tokenizer_has_the_real_layout",
            "../shared absent",
        );
        return;
    };
    let tok =
        Tokenizer::from_file(shared.join("fixtures/neutts-tokenizer/tokenizer.json")).unwrap();
    let v = SpeechVocab::from_tokenizer(&tok).unwrap();
    assert_eq!(v.first, 151_671);
    assert_eq!(v.speech_end_exclusive() - 1, 217_206);
    assert_eq!(v.end, 151_670);
}

#[test]
fn generated_package_loads_with_its_own_layout() {
    let dir = common::model("tiny");
    let exp = common::expect("tiny");
    let pkg = ModelPackage::load(&dir, None).unwrap();
    assert_eq!(
        u64::from(pkg.vocab.first),
        exp["speech_first_id"].as_u64().unwrap()
    );
    assert_eq!(u64::from(pkg.vocab.end), exp["end_id"].as_u64().unwrap());
    assert_eq!(pkg.stop_ids[0], pkg.vocab.end);
    assert!(
        pkg.genai.model.vocab_size > pkg.vocab.speech_end_exclusive() as usize,
        "padding ids exist"
    );
    assert_eq!(pkg.codec.sample_rate, 24_000);
    assert_eq!(pkg.codec.hop_length, 480);
    let s = pkg.summary();
    assert!(s.contains("65536 codes"), "{s}");
}

fn broken_copy(tag: &str) -> std::path::PathBuf {
    let dir = common::tempdir(tag);
    common::copy_dir(&common::model("tiny"), &dir);
    dir
}

#[test]
fn missing_files_name_the_file() {
    for (file, what) in [
        ("genai_config.json", "genai_config.json"),
        ("tokenizer.json", "tokenizer.json"),
        ("model.onnx", "decoder ONNX"),
        ("codec/model.onnx", "NeuCodec decoder"),
    ] {
        let dir = broken_copy(&format!("missing-{}", file.replace('/', "-")));
        std::fs::remove_file(dir.join(file)).unwrap();
        let err = ModelPackage::load(&dir, None).unwrap_err();
        assert!(matches!(err, PackageError::Missing { .. }), "{file}: {err}");
        let msg = err.to_string();
        assert!(
            msg.contains(file.rsplit('/').next().unwrap()) && msg.contains(what),
            "{msg}"
        );
    }
}

#[test]
fn config_that_is_not_json_is_refused() {
    let dir = broken_copy("notjson");
    std::fs::write(dir.join("genai_config.json"), "{ this is not json").unwrap();
    let err = ModelPackage::load(&dir, None).unwrap_err();
    assert!(matches!(err, PackageError::BadJson { .. }), "{err}");
    assert!(err.to_string().contains("genai_config.json"), "{err}");
}

fn edit_config(dir: &std::path::Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("genai_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn vocab_size_smaller_than_the_tokenizer_is_refused() {
    let dir = broken_copy("vocab");
    edit_config(&dir, |v| v["model"]["vocab_size"] = 1000.into());
    let err = ModelPackage::load(&dir, None).unwrap_err().to_string();
    assert!(err.contains("model.vocab_size is 1000"), "{err}");
}

#[test]
fn inconsistent_heads_are_refused() {
    let dir = broken_copy("heads");
    edit_config(&dir, |v| {
        v["model"]["decoder"]["num_attention_heads"] = 3.into()
    });
    let err = ModelPackage::load(&dir, None).unwrap_err().to_string();
    assert!(err.contains("num_attention_heads"), "{err}");
}
