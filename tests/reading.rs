//! How a request's text is read, through the real CLI: written-to-spoken normalisation (damga's
//! grammars, installed by scripts/setup.sh), `--no-normalize`, pause and pronunciation markup,
//! lexicons, and saved codes that decode to the same bytes with their pauses.

mod common;

use serde_json::Value;

/// Whether setup.sh's grammars are here; a skip fails in CI.
fn grammars(name: &str) -> bool {
    let ok = common::repo()
        .join(".onebit/tn")
        .join(onebit_tts::text::GRAMMARS)
        .join("en/read.fst")
        .is_file();
    if !ok {
        common::skip(name, "no normalisation grammars: run scripts/setup.sh");
    }
    ok
}

fn prompt_json(args: &[&str]) -> Value {
    let mut all = vec!["prompt", "--json", "--voice", "dave"];
    all.extend_from_slice(args);
    let o = common::cli(&all);
    assert!(o.status.success(), "{}", common::stderr(&o));
    serde_json::from_str(&common::stdout(&o)).unwrap()
}

#[test]
fn prompt_shows_the_spoken_form_and_no_normalize_reads_as_written() {
    if !grammars("prompt_shows_the_spoken_form") {
        return;
    }
    let text = "It costs $5.50 on 12/05/2026 at 10:30 am.";
    let v = prompt_json(&[text]);
    assert_eq!(v["original"], text);
    assert_eq!(
        v["normalized"],
        "It costs five dollars fifty cents on December fifth twenty twenty six at ten thirty a m."
    );
    assert_eq!(v["normalize"], true);
    assert_eq!(v["text"], v["normalized"]);
    // The phonemes are those of the words, not espeak-ng's reading of "$5.50".
    let said = prompt_json(&["--no-normalize", v["normalized"].as_str().unwrap()]);
    assert_eq!(v["prepared"], said["prepared"]);
    assert_eq!(v["ids"], said["ids"]);

    let raw = prompt_json(&["--no-normalize", text]);
    assert_eq!(raw["normalized"], text);
    assert_eq!(raw["normalize"], false);
    assert_ne!(raw["prepared"], v["prepared"]);

    // Other languages use their own grammar (the voice's language, or --lang).
    let de = prompt_json(&["--lang", "de", "Es kostet 5,50 € am 12.05.2026."]);
    assert_eq!(
        de["normalized"],
        "Es kostet fünf Euro fünfzig am zwölften Mai zweitausendsechsundzwanzig."
    );
}

#[test]
fn normalize_command_prints_the_grammar_s_decisions() {
    if !grammars("normalize_command") {
        return;
    }
    let o = common::cli(&["normalize", "--json", "Baker St. is 2.5kg away."]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    assert_eq!(
        v["normalized"],
        "Baker Street is two point five kilograms away."
    );
    assert_eq!(
        v["records"][0],
        "word=\"Baker\" word=\"Street\" word=\"is\" measure(text=\"two point five kilograms\") word=\"away.\""
    );
    // --verbose shows each sentence's reading in the log.
    let o = common::cli(&["--verbose", "normalize", "It is 5 pm."]);
    assert!(
        common::stderr(&o).contains("read as word=\"It\" word=\"is\" time(text=\"five p m\")"),
        "{}",
        common::stderr(&o)
    );
    // Text without anything to normalise passes through as written.
    let o = common::cli(&["normalize", "--language", "fr", "Bonjour à tous."]);
    assert_eq!(common::stdout(&o), "Bonjour à tous.\n");
    let e = common::error_line(&common::cli(&["normalize", "--language", "xx", "a"]));
    assert!(e.contains("unsupported language"), "{e}");
}

/// One flag name for the text's language across the CLI (issue 54, item 5): `--lang`, as `say`
/// and `prompt` take it, with `--language` accepted everywhere as an alias.
#[test]
fn every_command_takes_lang_and_language_alike() {
    if !grammars("every_command_takes_lang_and_language_alike") {
        return;
    }
    let text = "Am 12.05.2026 um 10:30 Uhr.";
    let by_lang = common::cli(&["normalize", "--lang", "de", text]);
    let by_language = common::cli(&["normalize", "--language", "de", text]);
    assert!(by_lang.status.success(), "{}", common::stderr(&by_lang));
    assert_eq!(common::stdout(&by_lang), common::stdout(&by_language));
    assert!(
        common::stdout(&by_lang).contains("zehn Uhr dreißig"),
        "{}",
        common::stdout(&by_lang)
    );
    assert_eq!(
        prompt_json(&["--lang", "de", text]),
        prompt_json(&["--language", "de", text])
    );
    // Both names are listed in each command's help.
    for cmd in ["normalize", "say", "prompt"] {
        let help = common::stdout(&common::cli(&[cmd, "--help"]));
        assert!(help.contains("[alias: --language]"), "{cmd}: {help}");
    }
}

#[test]
fn markup_pauses_cut_pieces_and_ipa_goes_into_the_prompt_as_written() {
    let v = prompt_json(&[
        "--markup",
        "--no-normalize",
        "[pause:0.3s]Hello there.<break strength=\"strong\"/>I like [tomato](/təmˈɑːtoʊ/) soup.[pause:2s]",
    ]);
    let pieces = v["pieces"].as_array().unwrap();
    assert_eq!(pieces.len(), 2);
    assert_eq!(pieces[0]["text"], "Hello there.");
    assert_eq!(pieces[0]["pause_before_s"], 0.3);
    assert_eq!(pieces[1]["text"], "I like tomato soup.");
    assert_eq!(pieces[1]["pause_before_s"], 1.0);
    assert_eq!(v["pause_after_s"], 2.0);
    // The IPA stands as given between the phonemes espeak-ng makes of the words around it.
    let prepared = pieces[1]["prepared"].as_str().unwrap();
    assert!(prepared.contains(" təmˈɑːtoʊ "), "{prepared}");
    let before = prompt_json(&["--no-normalize", "I like"]);
    let after = prompt_json(&["--no-normalize", "soup."]);
    assert_eq!(
        prepared,
        format!(
            "{} təmˈɑːtoʊ {}",
            before["prepared"].as_str().unwrap(),
            after["prepared"].as_str().unwrap()
        )
    );
    // Without --markup the brackets are text.
    let plain = prompt_json(&["--no-normalize", "Hello [pause:1s] there."]);
    assert_eq!(plain["text"], "Hello [pause:1s] there.");
}

#[test]
fn pauses_in_a_row_add_up_to_one_pause_s_limit_and_empty_runs_pass_their_pause_on() {
    let v = prompt_json(&[
        "--markup",
        "--no-normalize",
        "[pause:6s][pause:6s]Hi there.",
    ]);
    assert_eq!(v["pause_before_s"], 10.0);
    // The "." after the pause has nothing to speak: its run is dropped, the pause stays.
    let v = prompt_json(&["--markup", "--no-normalize", "Hi there [pause:1s]."]);
    assert_eq!(v["text"], "Hi there");
    assert_eq!(v["pause_after_s"], 1.0);
    // Punctuation after a pronunciation stays on it.
    let v = prompt_json(&["--markup", "--no-normalize", "Call [Xu](/ʃuː/)."]);
    assert!(v["prepared"].as_str().unwrap().ends_with(" ʃuː."), "{v}");
    // Private-use characters of the placeholders' plane (icon fonts) are not pronunciations.
    let v = prompt_json(&["--markup", "--no-normalize", "Say [A](/eɪ/) \u{f0000} now."]);
    assert_eq!(v["text"], "Say A now.");
    // Pauses cost output, not work: a request may ask for 300 s of them in all.
    let many = "[pause:10s]a ".repeat(31);
    let e = common::error_line(&common::cli(&[
        "prompt", "--voice", "dave", "--markup", &many,
    ]));
    assert!(e.contains("add up to 310 s"), "{e}");
}

#[test]
fn a_long_marked_up_text_is_cut_between_words_never_inside_a_pronunciation() {
    let text = "I like [tomato](/təmˈɑːtoʊ/) soup. ".repeat(300);
    let v = prompt_json(&["--markup", "--no-normalize", &text]);
    let pieces = v["pieces"].as_array().expect("several pieces");
    assert!(pieces.len() > 1, "{}", pieces.len());
    let mut said = Vec::new();
    for p in pieces {
        let (t, prepared) = (p["text"].as_str().unwrap(), p["prepared"].as_str().unwrap());
        // The words as written, the IPA as given, no placeholder left in either.
        assert_eq!(
            t.matches("tomato").count(),
            prepared.matches("təmˈɑːtoʊ").count()
        );
        assert!(
            !t.chars()
                .chain(prepared.chars())
                .any(|c| ('\u{f0000}'..='\u{ffffd}').contains(&c))
        );
        said.push(t.to_owned());
    }
    assert_eq!(
        said.join(" "),
        text.replace("[tomato](/təmˈɑːtoʊ/)", "tomato").trim()
    );
}

#[test]
fn bad_markup_is_one_error_line_naming_the_position() {
    for (text, want) in [
        ("Hi [pause:abc] x", "markup error at character 4"),
        ("Hi [pause:11s]", "markup error at character 4"),
        ("né <break time=\"x\"/>", "markup error at character 4"),
        ("a [word](/wɜːd", "markup error at character 3"),
    ] {
        let o = common::cli(&["prompt", "--voice", "dave", "--markup", text]);
        let e = common::error_line(&o);
        assert!(e.contains(want), "{text:?}: {e}");
    }
    // Only pauses: nothing to speak.
    let e = common::error_line(&common::cli(&[
        "prompt",
        "--voice",
        "dave",
        "--markup",
        "[pause:1s]",
    ]));
    assert!(e.contains("nothing speakable"), "{e}");
    // A BPE-format prompt cannot take IPA.
    let e = common::error_line(&common::cli(&[
        "prompt",
        "--voice",
        "dave",
        "--markup",
        "--input-format",
        "bpe",
        "a [b](/biː/)",
    ]));
    assert!(e.contains("need a model that reads phonemes"), "{e}");
}

#[test]
fn a_lexicon_file_pronounces_its_words_and_bad_files_are_refused() {
    let dir = common::tempdir("lexicon");
    let lex = dir.join("words.tsv");
    std::fs::write(&lex, "# product names\nNeuTTS\tnjuːtˌiːtˌiːˈɛs\n").unwrap();
    let l = lex.to_str().unwrap();
    let v = prompt_json(&["--lexicon", l, "--no-normalize", "I use NeuTTS, daily."]);
    let prepared = v["prepared"].as_str().unwrap();
    assert!(prepared.contains(" njuːtˌiːtˌiːˈɛs "), "{prepared}");
    assert_eq!(v["text"], "I use NeuTTS, daily.");
    // Whole words only.
    let v = prompt_json(&["--lexicon", l, "--no-normalize", "NeuTTSair"]);
    assert!(!v["prepared"].as_str().unwrap().contains("njuː"), "{v}");

    std::fs::write(&lex, "NeuTTS\n").unwrap();
    let e = common::error_line(&common::cli(&[
        "prompt",
        "--voice",
        "dave",
        "--lexicon",
        l,
        "hi",
    ]));
    assert!(e.contains("words.tsv") && e.contains("line 1"), "{e}");
    let e = common::error_line(&common::cli(&[
        "prompt",
        "--voice",
        "dave",
        "--lexicon",
        "/nonexistent/words.tsv",
        "hi",
    ]));
    assert!(e.contains("/nonexistent/words.tsv"), "{e}");
}

#[test]
fn saved_codes_decode_to_the_same_bytes_with_their_pauses() {
    let dir = common::tempdir("markup-codes");
    let (wav, codes, again) = (
        dir.join("say.wav"),
        dir.join("codes.json"),
        dir.join("decoded.wav"),
    );
    let o = common::cli(&[
        "say",
        "-q",
        "--model",
        common::model("tiny").to_str().unwrap(),
        "--voice",
        "test",
        "--temperature",
        "0",
        "--markup",
        "--no-normalize",
        "--codes",
        codes.to_str().unwrap(),
        "--output",
        wav.to_str().unwrap(),
        "[pause:0.5s]One piece here.[pause:1s]And another.[pause:0.25s]",
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&codes).unwrap()).unwrap();
    assert_eq!(doc["pieces"][0]["pause_before_s"], 0.5);
    assert_eq!(doc["pieces"][1]["pause_before_s"], 1.0);
    assert_eq!(doc["pieces"][1]["pause_after_s"], 0.25);
    let o = common::cli(&[
        "decode",
        "--model",
        common::model("tiny").to_str().unwrap(),
        "--output",
        again.to_str().unwrap(),
        codes.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let (a, b) = (std::fs::read(&wav).unwrap(), std::fs::read(&again).unwrap());
    assert_eq!(a, b, "decode makes the bytes say wrote");
    let n = hound::WavReader::new(std::io::Cursor::new(a))
        .unwrap()
        .len() as usize;
    let codes: usize = doc["pieces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["codes"].as_array().unwrap().len())
        .sum();
    assert_eq!(n, codes * 480 + 12_000 + 24_000 + 6_000);
}
