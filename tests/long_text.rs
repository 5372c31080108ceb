//! Long input: a 5,000-word text is cut into pieces that each fit the model's budget, synthesised
//! in order into one continuous file.

mod common;

use std::ops::ControlFlow;

use onebit_tts::audio::{AudioFormat, OutputSpec};
use onebit_tts::engine::{CancelToken, GenerationParams, SamplingParams, StopReason};
use onebit_tts::synth::{
    Door, Limits, PIECE_PAUSE_S, SpeechRequest, SynthConfig, SynthError, SynthEvent, Synthesizer,
};

fn synth() -> Synthesizer {
    Synthesizer::load(&SynthConfig {
        package_dir: common::model("tiny"),
        voice_dirs: vec![common::repo().join("voices")],
        ..SynthConfig::default()
    })
    .unwrap()
}

fn request(text: String) -> SpeechRequest {
    SpeechRequest {
        text,
        voice: "test".into(),
        generation: GenerationParams {
            sampling: SamplingParams::greedy(),
            ..GenerationParams::default()
        },
        output: OutputSpec {
            format: AudioFormat::Wav,
            ..OutputSpec::default()
        },
        // These tests check how text is cut and joined: the pieces must be the text as written.
        reading: onebit_tts::synth::Reading {
            normalize: false,
            ..Default::default()
        },
        ..SpeechRequest::default()
    }
}

#[test]
fn five_thousand_words_make_one_continuous_wav_in_order() {
    let mut text = String::new();
    let mut words = 0;
    let mut i = 0;
    while words < 5000 {
        let s = format!(
            "Sentence {i} tells the story of a quiet valley, where the river runs slowly past old stone houses. "
        );
        words += s.split_whitespace().count();
        text.push_str(&s);
        i += 1;
    }
    let s = synth();
    let budget = s.package().genai.token_budget();
    let mut pieces: Vec<String> = Vec::new();
    let mut bytes = Vec::new();
    let report = s
        .synthesize(&request(text.clone()), &CancelToken::new(), &mut |ev| {
            match ev {
                SynthEvent::Piece {
                    index,
                    text,
                    prompt_tokens,
                    max_new_tokens,
                    ..
                } => {
                    assert_eq!(index, pieces.len());
                    assert!(
                        prompt_tokens < budget,
                        "piece {index}: prompt {prompt_tokens} of {budget}"
                    );
                    assert!(prompt_tokens + max_new_tokens <= budget, "piece {index}");
                    // The piece must leave room for at least the codes it needs.
                    assert!(
                        max_new_tokens >= 120,
                        "piece {index} leaves {max_new_tokens}"
                    );
                    pieces.push(text.to_owned());
                }
                SynthEvent::Audio(b) => bytes.extend_from_slice(b),
                SynthEvent::Patch { offset, bytes: p } => {
                    onebit_tts::audio::apply_patch(&mut bytes, offset, p).unwrap()
                }
                _ => {}
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    assert!(
        pieces.len() > 3,
        "a 5,000-word text needs several pieces, got {}",
        pieces.len()
    );
    assert_eq!(report.pieces.len(), pieces.len());
    // Order preserved and nothing dropped: the pieces are the text, in order.
    let joined = pieces.join(" ");
    assert_eq!(
        joined.split_whitespace().collect::<Vec<_>>(),
        text.split_whitespace().collect::<Vec<_>>()
    );
    // One WAV: 480 samples per code plus one pause between pieces.
    let wav = hound::WavReader::new(std::io::Cursor::new(&bytes)).unwrap();
    let pause = (PIECE_PAUSE_S * 24_000.0) as usize;
    assert_eq!(
        wav.len() as usize,
        report.codes.len() * 480 + pause * (pieces.len() - 1)
    );
    assert_eq!(
        report.codes.len(),
        120 * pieces.len(),
        "every piece runs the chain to its end"
    );
    // No click where pieces meet: the samples around each pause are faded to silence.
    let samples: Vec<i16> = wav.into_samples::<i16>().map(Result::unwrap).collect();
    let mut at = 0;
    for _ in 0..pieces.len() - 1 {
        at += 120 * 480;
        assert_eq!(samples[at - 1], 0, "fade-out ends at zero");
        assert!(samples[at..at + pause].iter().all(|&x| x == 0));
        at += pause;
        assert_eq!(samples[at], 0, "fade-in starts at zero");
    }
}

#[test]
fn a_word_longer_than_the_budget_is_an_error_naming_the_limit() {
    let s = synth();
    let word = "a".repeat(6000);
    let err = s
        .synthesize(
            &request(format!("Hello {word} there.")),
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
    assert!(matches!(err, SynthError::WordTooLong { .. }), "{err}");
    assert!(err.to_string().contains("budget is 4096 tokens"), "{err}");
}

#[test]
fn input_over_the_character_limit_is_refused_at_the_door() {
    let door = Door::new(
        std::sync::Arc::new(synth()),
        Limits {
            max_input_chars: 100,
            ..Limits::default()
        },
    );
    let err = door
        .synthesize(&request("word ".repeat(30)), &mut |_| {
            ControlFlow::Continue(())
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the input has 150 characters; the limit is 100 (max_input_chars)"
    );
    assert_eq!(
        door.load().running + door.load().queued,
        0,
        "nothing admitted"
    );
    // At the limit, the text is spoken.
    let report = door
        .synthesize(&request("word ".repeat(20)), &mut |_| {
            ControlFlow::Continue(())
        })
        .expect("100 characters are within the limit");
    assert!(!report.codes.is_empty());
}

#[test]
fn unsupported_language_and_nothing_speakable_are_clear_errors() {
    let s = synth();
    let mut req = request("Hello.".into());
    req.voice = "test".into();
    let err = "xx-yy".parse::<onebit_tts::text::Language>().unwrap_err();
    assert!(
        err.to_string()
            .contains("supported: en-us (or en), de, fr-fr (or fr), es"),
        "{err}"
    );
    req.text = "?! ... —".into();
    let err = s
        .synthesize(
            &req,
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
    assert!(err.to_string().contains("nothing speakable"), "{err}");
}

/// Runs a request and returns its report with each piece's (text, max_new_tokens).
fn run_pieces(
    s: &Synthesizer,
    req: &SpeechRequest,
) -> (onebit_tts::synth::SynthesisReport, Vec<(String, usize)>) {
    let mut pieces = Vec::new();
    let report = s
        .synthesize(req, &CancelToken::new(), &mut |ev| {
            if let SynthEvent::Piece {
                text,
                max_new_tokens,
                ..
            } = ev
            {
                pieces.push((text.to_owned(), max_new_tokens));
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    (report, pieces)
}

/// The chain package sampled never draws its end token (it runs to the context, 79 s, without a
/// limit): "hi" is four phoneme characters, so its code budget is 4 x 10 + 100 = 140 codes, 2.8 s.
#[test]
fn a_piece_that_never_ends_stops_at_its_texts_code_budget() {
    assert_eq!(onebit_tts::synth::code_budget("hˈaɪ"), 140);
    let s = synth();
    let mut req = request("hi".into());
    req.generation.sampling = SamplingParams {
        seed: Some(3),
        ..SamplingParams::default()
    };
    let (report, pieces) = run_pieces(&s, &req);
    assert_eq!(pieces, [("hi".to_owned(), 140)]);
    assert_eq!(report.codes.len(), 140);
    assert_eq!(report.stop, StopReason::Length);
    assert_eq!(report.stop.finish_reason(), "length");
    // Greedy, the chain ends on its own (120 codes) well inside the budget.
    let (report, _) = run_pieces(&s, &request("hi".into()));
    assert_eq!(report.codes.len(), 120);
    assert!(
        matches!(report.stop, StopReason::Stop(_)),
        "{:?}",
        report.stop
    );
}

/// max_new_tokens bounds the request, not each piece: greedy pieces make 120 codes each, so 300
/// allows two whole pieces and 60 codes of the third; the rest is not spoken.
#[test]
fn max_new_tokens_is_shared_by_the_pieces_of_a_request() {
    let s = synth();
    let mut req = request(common::sentences(0, 30));
    let (whole, all) = run_pieces(&s, &req);
    assert!(all.len() > 3, "{} pieces", all.len());
    assert_eq!(whole.codes.len(), 120 * all.len());
    assert!(matches!(whole.stop, StopReason::Stop(_)));

    req.generation.max_new_tokens = Some(300);
    let (report, pieces) = run_pieces(&s, &req);
    let limits: Vec<usize> = pieces.iter().map(|p| p.1).collect();
    assert_eq!(limits, [300, 180, 60]);
    assert_eq!(report.codes.len(), 300);
    assert_eq!(report.codes[..], whole.codes[..300]);
    assert_eq!(report.stop, StopReason::Length);
    // The audio holds exactly those codes and the two pauses between the three pieces.
    assert_eq!(
        report.samples,
        300 * 480 + 2 * (PIECE_PAUSE_S * 24_000.0) as usize
    );
}

/// A piece of a long text with nothing to speak (only emoji) is left out; the rest is spoken.
#[test]
fn an_emoji_only_sentence_of_a_long_text_is_skipped() {
    let s = synth();
    let text = format!(
        "{}😀😀. {}",
        common::sentences(0, 15),
        common::sentences(15, 15)
    );
    let (report, pieces) = run_pieces(&s, &request(text.clone()));
    assert!(pieces.len() > 3, "{} pieces", pieces.len());
    let spoken: Vec<String> = pieces.into_iter().map(|p| p.0).collect();
    let without: String = text.replace("😀😀. ", "");
    assert_eq!(
        spoken.join(" ").split_whitespace().collect::<Vec<_>>(),
        without.split_whitespace().collect::<Vec<_>>()
    );
    assert_eq!(report.codes.len(), 120 * spoken.len());
}

#[test]
fn pieces_are_planned_against_a_static_kv_cache_smaller_than_the_config() {
    // models/tiny-static: search.max_length says 4096, the graph's KV cache holds 512 positions.
    let s = Synthesizer::load(&SynthConfig {
        package_dir: common::model("tiny-static"),
        voice_dirs: vec![common::repo().join("voices")],
        ..SynthConfig::default()
    })
    .unwrap();
    assert_eq!(s.package().genai.token_budget(), 4096);
    let text = common::sentences(0, 12);
    let mut limits = Vec::new();
    let report = s
        .synthesize(&request(text), &CancelToken::new(), &mut |ev| {
            if let SynthEvent::Piece {
                prompt_tokens,
                max_new_tokens,
                ..
            } = ev
            {
                limits.push((prompt_tokens, max_new_tokens));
            }
            ControlFlow::Continue(())
        })
        .expect("every piece fits the 512-position cache");
    assert!(limits.len() > 1, "{limits:?}");
    for (prompt, max_new) in &limits {
        assert!(prompt + max_new <= 512, "{limits:?}");
    }
    assert_eq!(report.pieces.len(), limits.len());
}
