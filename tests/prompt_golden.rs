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
fn package_with_shared_tokenizer(shared: &Path, tag: &str) -> std::path::PathBuf {
    let dir = common::tempdir(&format!("golden-pkg-{tag}"));
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

/// The vendor's prompts and a front end over the shared tokenizer and the vendor's voices, in
/// temporary directories named by `tag` (one per test: they run side by side).
fn golden_front_end(shared: &Path, tag: &str) -> (serde_json::Value, FrontEnd) {
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(shared.join("golden/prompts.json")).unwrap())
            .unwrap();
    let voices_dir = common::tempdir(&format!("golden-voices-{tag}"));
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
        onebit_tts::package::ModelPackage::load(&package_with_shared_tokenizer(shared, tag), None)
            .unwrap();
    let store = VoiceStore::open(&[voices_dir]).unwrap();
    let front = FrontEnd::new(pkg, store);
    (golden, front)
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
    let (golden, front) = golden_front_end(&shared, "as-written");
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

/// Every golden text the grammars read something in, with its spoken form: the readings, and
/// nothing else changed (spelling, quotes and spacing of the rest as written). Every other golden
/// text, in all four languages, must come out of the normaliser exactly as written.
const READ: &[(&str, &str, &str)] = &[
    (
        "en-us",
        "Dr. Smith lives at 221B Baker St. in London.",
        "doctor Smith lives at two hundred and twenty one B Baker Street in London.",
    ),
    (
        "en-us",
        "The meeting starts at 10:30 a.m. on Monday, Jan. 3rd.",
        "The meeting starts at ten thirty a m on Monday, January third.",
    ),
    (
        "en-us",
        "There were 1,234,567 people at the event in 2023.",
        "There were one million two hundred and thirty four thousand five hundred and sixty seven people at the event in twenty twenty three.",
    ),
    (
        "en-us",
        "Call me at 555-0123 if you need anything.",
        "Call me at five hundred and fifty five to zero one two three if you need anything.",
    ),
    (
        "en-us",
        "The temperature dropped to -5 degrees overnight.",
        "The temperature dropped to minus five degrees overnight.",
    ),
    (
        "en-us",
        "I've got 99 problems, but a glitch ain't one.",
        "I've got ninety nine problems, but a glitch ain't one.",
    ),
    (
        "en-us",
        "He scored 3/4 of the points, that is 75%.",
        "He scored three quarters of the points, that is seventy five percent.",
    ),
    (
        "en-us",
        "My email is jane.doe@example.com, don't share it.",
        "My email is jane dot doe at example dot com, don't share it.",
    ),
    (
        "en-us",
        "The recipe calls for 2 cups of flour and 1/2 cup of sugar.",
        "The recipe calls for two cups of flour and one half cup of sugar.",
    ),
    (
        "en-us",
        "In 1969, Neil Armstrong became the first person to walk on the Moon, an event watched by an estimated 650 million people around the world.",
        "In nineteen sixty nine, Neil Armstrong became the first person to walk on the Moon, an event watched by an estimated six hundred and fifty million people around the world.",
    ),
    (
        "en-us",
        "The CEO's quarterly report showed a 12.5% increase in revenue.",
        "The CEO's quarterly report showed a twelve point five percent increase in revenue.",
    ),
    (
        "en-us",
        "Is it true that the Earth is 4.5 billion years old?",
        "Is it true that the Earth is four point five billion years old?",
    ),
    (
        "en-us",
        "World War II ended in 1945.",
        "World War two ended in nineteen forty five.",
    ),
    (
        "en-us",
        "The flight departs from Gate B12 at 14:45.",
        "The flight departs from Gate B twelve at fourteen forty five.",
    ),
    (
        "en-us",
        "He's 6'2\" tall and weighs 180 lbs.",
        "He's 6'2\" tall and weighs one hundred and eighty pounds.",
    ),
    (
        "en-us",
        "We'll meet at the 2nd floor of building No. 5.",
        "We'll meet at the second floor of building number five.",
    ),
    (
        "en-us",
        "Version 2.0.1 fixes a bug introduced in v1.9.",
        "Version two point zero point one fixes a bug introduced in v1.9.",
    ),
    (
        "en-us",
        "I can’t believe it’s already 5 o'clock… “Time flies,” they say!",
        "I can’t believe it’s already five o'clock… “Time flies,” they say!",
    ),
    (
        "en-us",
        "The recipe calls for 2 cups of flour and ½ cup of sugar.",
        "The recipe calls for two cups of flour and one half cup of sugar.",
    ),
    (
        "de",
        "Die Straßenbahn kommt um 8:15 Uhr.",
        "Die Straßenbahn kommt um acht Uhr fünfzehn.",
    ),
    (
        "de",
        "Wir haben 25 Äpfel und 3 Birnen gekauft.",
        "Wir haben fünfundzwanzig Äpfel und drei Birnen gekauft.",
    ),
];

/// Normalisation on (the default) changes only what it reads as words (issue 54, item 2): on
/// every golden text of both files it reads nothing in, in en-us, de, fr-fr and es, the text
/// reaches the phonemizer exactly as written (so the vendor's phonemes follow), and every golden
/// prompt of both input formats is the vendor's id for id; where it reads something, the text is
/// the reading with the rest as written, and the prompt is that of the spoken text.
#[test]
fn normalisation_changes_only_what_it_reads() {
    let Some(shared) = common::shared() else {
        common::skip(
            "normalisation_changes_only_what_it_reads",
            "../shared absent",
        );
        return;
    };
    let tn = onebit_tts::text::Normalizer::discover();
    let mut texts: Vec<(String, String)> = Vec::new();
    let phonemes: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(shared.join("golden/phonemes.json")).unwrap(),
    )
    .unwrap();
    let (golden, front) = golden_front_end(&shared, "normalised");
    for case in phonemes["cases"]
        .as_array()
        .unwrap()
        .iter()
        .chain(golden["cases"].as_array().unwrap())
    {
        let t = (
            case["lang"].as_str().unwrap().to_owned(),
            case["text"].as_str().unwrap().to_owned(),
        );
        if !texts.contains(&t) {
            texts.push(t);
        }
    }
    let mut unread = std::collections::BTreeMap::<String, usize>::new();
    for (lang, text) in &texts {
        let language = lang.parse().unwrap();
        let spoken = tn
            .normalize(text, language)
            .unwrap_or_else(|e| panic!("{lang} {text:?}: {e}"))
            .text;
        match READ.iter().find(|(l, t, _)| l == lang && t == text) {
            Some((_, _, want)) => assert_eq!(&spoken, want, "{lang}: {text:?}"),
            None => {
                assert_eq!(&spoken, text, "{lang}: nothing to read, yet changed");
                *unread.entry(lang.clone()).or_default() += 1;
            }
        }
    }
    for (lang, text, _) in READ {
        assert!(
            texts.iter().any(|(l, t)| l == lang && t == text),
            "READ names a text no golden has: {text:?}"
        );
    }
    // Every language has golden text the grammars leave alone.
    assert_eq!(
        unread.keys().map(String::as_str).collect::<Vec<_>>(),
        ["de", "en-us", "es", "fr-fr"],
        "{unread:?}"
    );
    let plan = |text: &str, case: &serde_json::Value, format: InputFormat, normalize: bool| {
        let req = SpeechRequest {
            text: text.to_owned(),
            voice: case["voice"].as_str().unwrap().to_owned(),
            language: Some(case["lang"].as_str().unwrap().parse().unwrap()),
            input_format: Some(format),
            reading: onebit_tts::synth::Reading {
                normalize,
                ..Default::default()
            },
            ..SpeechRequest::default()
        };
        let pieces = front.plan(&req, 4096, 50).unwrap().pieces;
        assert_eq!(pieces.len(), 1);
        pieces[0].ids.clone()
    };
    let mut same = 0;
    for case in golden["cases"].as_array().unwrap() {
        let format: InputFormat = case["input_format"].as_str().unwrap().parse().unwrap();
        let text = case["text"].as_str().unwrap();
        let ids = plan(text, case, format, true);
        let lang = case["lang"].as_str().unwrap();
        match READ.iter().find(|(l, t, _)| *l == lang && *t == text) {
            Some((_, _, spoken)) => assert_eq!(
                ids,
                plan(spoken, case, format, false),
                "{lang} {format:?}: {text:?}"
            ),
            None => {
                let want_key = match format {
                    InputFormat::Phonemes => "ids_bundled_espeak",
                    InputFormat::Bpe => "ids",
                };
                let want: Vec<u32> = serde_json::from_value(case[want_key].clone()).unwrap();
                assert_eq!(ids, want, "{lang} {format:?}: {text:?}");
                same += 1;
            }
        }
    }
    eprintln!(
        "normalised: {} golden texts, {} read, the rest as written ({unread:?}); {same} vendor \
         prompts identical with normalisation on",
        texts.len(),
        READ.len()
    );
}
