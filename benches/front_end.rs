//! Per-sentence cost of the text front end: normalise + phonemise (tokenisation is elsewhere).
//!
//! `cargo run --release --example bench_text [rounds]`; espeak-ng is found as
//! `Phonemizer::discover` does (set ONEBIT_ESPEAK_LIB or ONEBIT_HOME if it is elsewhere).

use std::time::Instant;

use onebit_tts::text::{Language, Phonemizer, normalize};

const SENTENCES: &[(Language, &str)] = &[
    (
        Language::EnUs,
        "The library opens at nine on weekdays and at ten on Saturdays.",
    ),
    (
        Language::EnUs,
        "Could you send me the report before the meeting tomorrow afternoon?",
    ),
    (
        Language::EnUs,
        "Our train was delayed by 25 minutes, so we missed the first act.",
    ),
    (
        Language::EnUs,
        "She bought 3 apples, 2 pears and a loaf of bread for $4.50.",
    ),
    (
        Language::EnUs,
        "\u{201c}That\u{2019}s not what I meant,\u{201d} he said, shaking his head slowly.",
    ),
    (
        Language::EnUs,
        "Please remember to water the plants while I'm away next week.",
    ),
    (
        Language::EnUs,
        "The new update improves battery life by roughly 15% on most devices.",
    ),
    (
        Language::EnUs,
        "After the storm passed, the children ran outside to look for rainbows.",
    ),
    (
        Language::De,
        "Morgen früh fahren wir mit dem Zug nach Hamburg zu meiner Schwester.",
    ),
    (
        Language::De,
        "Können Sie mir bitte sagen, wo der nächste Bahnhof ist?",
    ),
    (
        Language::FrFr,
        "Nous avons passé un excellent week-end à la montagne avec des amis.",
    ),
    (
        Language::FrFr,
        "Est-ce que tu peux fermer la fenêtre, s'il te plaît ?",
    ),
    (
        Language::Es,
        "Mañana por la tarde vamos a visitar a mis abuelos en el pueblo.",
    ),
    (
        Language::Es,
        "¿Sabes a qué hora empieza la película esta noche?",
    ),
];

fn main() {
    // `cargo bench` passes `--bench`; a number sets the rounds; plain `cargo test` runs it briefly.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(
        if args.iter().any(|a| a == "--bench") {
            50
        } else {
            1
        },
    );
    let p = match Phonemizer::discover() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench_text: {e}");
            std::process::exit(2);
        }
    };
    println!("espeak-ng {} ({})", p.version(), p.library().display());

    let run = |lang: Language, text: &str| -> usize {
        let clean = match normalize(text) {
            Ok(t) => t,
            Err(e) => panic!("{text:?}: {e}"),
        };
        match p.phonemize(&clean, lang) {
            Ok(ph) => ph.len(),
            Err(e) => panic!("{text:?}: {e}"),
        }
    };
    // Warm-up: loads every voice once (the first switch to a language reads its files).
    for &(lang, text) in SENTENCES {
        run(lang, text);
    }

    let mut sink = 0usize;
    let mut time = |lang: Language, text: &str| {
        let t = Instant::now();
        sink += run(lang, text);
        t.elapsed().as_secs_f64() * 1e6
    };
    // Grouped by language: the common case of a server speaking one language.
    let mut grouped = Vec::with_capacity(rounds * SENTENCES.len());
    for lang in Language::ALL {
        for _ in 0..rounds {
            for &(l, text) in SENTENCES.iter().filter(|(l, _)| *l == lang) {
                grouped.push(time(l, text));
            }
        }
    }
    // Interleaved: every call switches the espeak voice first.
    let mut interleaved = Vec::with_capacity(rounds * SENTENCES.len());
    for _ in 0..rounds {
        for &(lang, text) in SENTENCES {
            interleaved.push(time(lang, text));
        }
    }
    let words: usize = SENTENCES
        .iter()
        .map(|(_, t)| t.split_whitespace().count())
        .sum();
    println!(
        "{} sentences x {rounds} rounds, {:.1} words ({:.0} chars) per sentence on average",
        SENTENCES.len(),
        words as f64 / SENTENCES.len() as f64,
        SENTENCES
            .iter()
            .map(|(_, t)| t.chars().count())
            .sum::<usize>() as f64
            / SENTENCES.len() as f64
    );
    report("grouped", &mut grouped);
    report("interleaved", &mut interleaved);
    std::hint::black_box(sink);
    normaliser(rounds);
    whole_front_end(rounds);
}

/// Written-to-spoken normalisation alone, per sentence and language (grammars loaded first, as
/// a server does at start), on the sentences above plus ones full of numbers.
fn normaliser(rounds: usize) {
    const DENSE: &[(Language, &str)] = &[
        (
            Language::EnUs,
            "It costs $5.50 on 12/05/2026 at 10:30 am, 2.5kg for 1,000 g.",
        ),
        (
            Language::De,
            "Es kostet 5,50 € am 12.05.2026 um 10:30 Uhr, 2,5 kg für 25 %.",
        ),
        (
            Language::FrFr,
            "Il coûte 5,50 € le 12/05/2026 à 10h30, 2,5 kg pour 25 %.",
        ),
        (
            Language::Es,
            "Cuesta 5,50 € el 12/05/2026 a las 10:30, 2,5 kg por el 25 %.",
        ),
    ];
    let tn = onebit_tts::text::Normalizer::discover();
    for lang in Language::ALL {
        let t = Instant::now();
        if let Err(e) = tn.warm(lang) {
            println!("normaliser: {e}");
            return;
        }
        println!(
            "normaliser: {lang} grammars loaded in {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    for (name, set) in [("plain", SENTENCES), ("numbers", DENSE)] {
        let mut us = Vec::with_capacity(rounds * set.len());
        for _ in 0..rounds {
            for &(lang, text) in set {
                let t = Instant::now();
                let n = tn.normalize(text, lang).expect("normalise");
                us.push(t.elapsed().as_secs_f64() * 1e6);
                std::hint::black_box(n);
            }
        }
        report(&format!("normalise, {name} sentences"), &mut us);
    }
}

/// The whole front end of a request as the Synthesizer runs it: normalise + phonemise (text and
/// the voice's transcript) + tokenise + splice, on the English sentences, with the tiny test
/// package's tokenizer (or the real-layout NeuTTS tokenizer from ../shared when present).
fn whole_front_end(rounds: usize) {
    use onebit_tts::synth::{FrontEnd, SpeechRequest};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let Ok(pkg) = onebit_tts::package::ModelPackage::load(&root.join("models/tiny"), None) else {
        println!("whole front end: skipped (models/tiny missing: scripts/gen-test-models.sh)");
        return;
    };
    let mut pkg = pkg;
    let shared_tok = root.join("../shared/fixtures/neutts-tokenizer/tokenizer.json");
    let tok_name = if let Ok(t) = tokenizers::Tokenizer::from_file(&shared_tok) {
        pkg.tokenizer = t;
        pkg.vocab =
            onebit_tts::package::SpeechVocab::from_tokenizer(&pkg.tokenizer).expect("vocab");
        "NeuTTS tokenizer (217,207 tokens)"
    } else {
        "tiny test tokenizer"
    };
    let Ok(voices) = onebit_tts::voice::VoiceStore::open(&[root.join("voices")]) else {
        return;
    };
    let front = FrontEnd::new(pkg, voices);
    let mut us = Vec::new();
    for _ in 0..rounds.max(1) {
        for &(lang, text) in SENTENCES.iter().filter(|(l, _)| *l == Language::EnUs) {
            let req = SpeechRequest {
                text: text.to_owned(),
                voice: "test".into(),
                language: Some(lang),
                ..SpeechRequest::default()
            };
            let t = Instant::now();
            let pieces = front.plan(&req, 4096, 50).expect("plan").pieces;
            us.push(t.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(pieces);
        }
    }
    println!("whole front end per request ({tok_name}; text + voice transcript):");
    report("en-us", &mut us);
}

fn report(name: &str, us: &mut [f64]) {
    us.sort_by(f64::total_cmp);
    let pct = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    println!(
        "{name:>10}: median {:.0} us, mean {mean:.0} us, p90 {:.0} us, max {:.0} us per sentence",
        pct(0.5),
        pct(0.9),
        pct(1.0)
    );
}
