//! `say`, `decode` and `prompt`: one synthesis to a file, saved codes back to audio, and the
//! prompt a text becomes.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use onebit_tts::audio::OutputSpec;
use onebit_tts::metrics;
use onebit_tts::paths::PartialFile;
use onebit_tts::synth::{
    CaptionFormat, Door, Ended, FrontEnd, Limits, Refusal, SpeechCodes, SynthError, SynthEvent,
    Synthesizer,
};

use crate::args::{
    GenArgs, ModelArgs, OutArgs, emotion, output_spec, progress_bar, read_text, request,
    synth_config,
};

#[derive(Args)]
pub struct SayArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub generation: GenArgs,
    #[command(flatten)]
    pub out: OutArgs,
    #[arg(long, short = 'v')]
    pub voice: String,
    /// Output file.
    #[arg(short, long, default_value = "out.wav")]
    pub output: PathBuf,
    /// Also write the speech codes (the prompt ids and codes of each piece, finish reasons,
    /// seeds) to this JSON file; `onebit-tts decode FILE` turns it back into the same audio.
    #[arg(long, value_name = "FILE")]
    pub codes: Option<PathBuf>,
    /// Also write where each piece of the text lies in the audio: captions as .srt or .vtt (one
    /// cue per piece), or .json (pieces with estimated word times); the extension picks which.
    #[arg(long, value_name = "FILE")]
    pub captions: Option<PathBuf>,
    /// Print the run's numbers and its codes (the --codes fields) as JSON on stdout instead
    /// of the summary line.
    #[arg(long)]
    pub json: bool,
    /// Longest text in characters (the server's --max-input-chars, with the same default).
    #[arg(long, default_value_t = onebit_tts::synth::DEFAULT_MAX_INPUT_CHARS)]
    pub max_input_chars: usize,
    /// The text; read from stdin when absent.
    pub text: Option<String>,
}

#[derive(Args)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub out: OutArgs,
    /// Output file.
    #[arg(short, long, default_value = "out.wav")]
    pub output: PathBuf,
    /// The codes document (JSON).
    pub codes: PathBuf,
}

#[derive(Args)]
pub struct PromptArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub generation: GenArgs,
    #[arg(long, short = 'v')]
    pub voice: String,
    #[arg(long)]
    pub json: bool,
    pub text: String,
}

#[derive(clap::Args)]
pub struct NormalizeArgs {
    /// Language: en-us (or en), de, fr-fr (or fr), es. `--lang` as in `say` and `prompt`;
    /// `--language` is accepted too.
    #[arg(
        long = "lang",
        short = 'l',
        visible_alias = "language",
        default_value = "en-us"
    )]
    pub language: String,
    /// Print {"text", "normalized", "grammar", "records", "notes"} as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print the grammars' own output (damga's, which also tidies spaces and quotes it did not
    /// read) instead of the spoken form, where everything unread stays as written.
    #[arg(long)]
    pub grammar: bool,
    /// Read standard input line by line and print one result per line (the grammars load once).
    #[arg(long, conflicts_with = "text")]
    pub lines: bool,
    /// The text (else standard input).
    pub text: Option<String>,
}

pub fn normalize(a: NormalizeArgs) -> Result<()> {
    let lang = onebit_tts::text::Language::from_bcp47(&a.language)?;
    let tn = onebit_tts::text::Normalizer::discover();
    tn.warm(lang)?;
    let print = |text: &str| -> Result<()> {
        let n = tn.normalize(text, lang)?;
        if a.json {
            println!(
                "{}",
                serde_json::json!({"text": text, "normalized": n.text, "grammar": n.grammar,
                    "records": n.records, "notes": n.notes})
            );
        } else if a.grammar {
            println!("{}", n.grammar);
        } else {
            println!("{}", n.text);
        }
        Ok(())
    };
    if a.lines {
        for line in std::io::stdin().lines() {
            print(&line.context("reading standard input")?)?;
        }
        return Ok(());
    }
    print(&read_text(a.text)?)
}

pub fn say(a: SayArgs, quiet: bool) -> Result<()> {
    say_to(
        &a.model,
        &a.generation,
        &a.out,
        &a.voice,
        &SayTo {
            audio: &a.output,
            codes: a.codes.as_deref(),
            captions: a.captions.as_deref(),
            json: a.json,
            max_input_chars: a.max_input_chars,
        },
        a.text,
        quiet,
    )
}

pub fn decode(a: DecodeArgs) -> Result<()> {
    decode_to(&a.model, &a.out, &a.codes, &a.output)
}

pub fn prompt(a: PromptArgs) -> Result<()> {
    prompt_cmd(&a.model, &a.generation, &a.voice, a.text, a.json)
}

/// Where `say` puts what it made.
struct SayTo<'a> {
    audio: &'a Path,
    codes: Option<&'a Path>,
    /// Captions or the timing document, in the format of its extension.
    captions: Option<&'a Path>,
    /// The run's numbers and codes as JSON on stdout.
    json: bool,
    max_input_chars: usize,
}

fn say_to(
    model: &ModelArgs,
    g: &GenArgs,
    out: &OutArgs,
    voice: &str,
    to: &SayTo<'_>,
    text: Option<String>,
    quiet: bool,
) -> Result<()> {
    let text = read_text(text)?;
    let output = to.audio;
    let spec = output_spec(out, output)?;
    // A captions name in no known format is refused before any work, like the audio's.
    let captions = to
        .captions
        .map(|p| CaptionFormat::from_path(p).map(|f| (p, f)))
        .transpose()?;
    let mut req = request(voice, text, g, spec)?;
    let mut cfg = synth_config(model);
    // One request is one stream of codec windows: more sessions would only cost memory.
    cfg.codec_sessions.get_or_insert(1);
    let synth = std::sync::Arc::new(Synthesizer::load(&cfg)?);
    req.emotion = emotion(synth.package(), g)?;
    // The same door as the server's: the limits are checked, and a transient engine failure is
    // retried, exactly as a request over HTTP would be.
    let door = Door::new(
        synth.clone(),
        Limits {
            max_input_chars: to.max_input_chars,
            ..Limits::default()
        },
    );
    let ticket = door.admit(req.clone(), None).map_err(|e| match e {
        Refusal::Invalid(e @ SynthError::InputTooLong { .. }) => {
            anyhow::anyhow!("{e}; --max-input-chars N takes a longer one")
        }
        e => anyhow::Error::from(e),
    })?;
    let bar = progress_bar(
        quiet,
        0,
        "{spinner} {prefix} {pos}/~{len} codes {msg} [{elapsed_precise}]",
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let mut file =
        PartialFile::create(output).with_context(|| format!("creating {}", output.display()))?;
    let result = ticket.run(&mut |ev| {
        match ev {
            SynthEvent::Started {
                estimated_codes, ..
            } => bar.set_length(estimated_codes as u64),
            SynthEvent::Piece { index, count, .. } if count > 1 => {
                bar.set_prefix(format!("piece {}/{count}", index + 1));
            }
            SynthEvent::Piece { .. } => {}
            SynthEvent::Code { index, .. } => {
                let n = index as u64 + 1;
                if n > bar.length().unwrap_or(0) {
                    bar.set_length(n);
                }
                bar.set_position(n);
                if n.is_multiple_of(10) {
                    let rate = n as f64 / started.elapsed().as_secs_f64().max(1e-9);
                    bar.set_message(format!(
                        "{rate:.1} codes/s ({:.2}x the 50/s line)",
                        metrics::times_real_time(rate)
                    ));
                }
            }
            SynthEvent::Audio(bytes) => {
                if !file.append(bytes) {
                    return ControlFlow::Break(());
                }
            }
            // The whole timeline is in the report at the end: a file is written once.
            SynthEvent::Timing(_) => {}
            SynthEvent::Patch { offset, bytes } => {
                if !file.patch(offset, bytes) {
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(())
    });
    bar.finish_and_clear();
    let report = result.or_else(Ended::into_report)?;
    file.check()
        .with_context(|| format!("writing {}", output.display()))?;
    let codes = SpeechCodes::of(&synth, &req, &report)?;
    // The codes and captions files first: when one cannot be written, the audio is not left
    // behind either, so a run either made everything it was asked for or nothing.
    if let Some(path) = to.codes {
        write_whole(path, codes.to_json().as_bytes())?;
    }
    if let Some((path, format)) = captions {
        write_whole(path, format.render(&report.timeline).as_bytes())?;
    }
    file.commit()
        .with_context(|| format!("writing {}", output.display()))?;
    if to.json {
        #[derive(serde::Serialize)]
        struct SayJson<'a> {
            output: &'a Path,
            audio_format: String,
            output_sample_rate: u32,
            speed: f32,
            bytes: usize,
            device: String,
            #[serde(flatten)]
            numbers: metrics::RunNumbers,
            #[serde(flatten)]
            codes: &'a SpeechCodes,
        }
        let doc = SayJson {
            output,
            audio_format: req.output.format.to_string(),
            output_sample_rate: req.output.sample_rate,
            speed: req.output.speed,
            bytes: report.bytes,
            device: synth.ran_on(&report),
            numbers: report.numbers(),
            codes: &codes,
        };
        println!("{}", serde_json::to_string(&doc)?);
        return Ok(());
    }
    let n = report.numbers();
    eprintln!(
        "wrote {} — {:.2} s of audio, {} codes, finish {}, {:.1} codes/s ({:.2}x real time) on {}{}, RTF {:.3}, seed {}, prompt {} tokens",
        output.display(),
        n.audio_s,
        n.codes,
        n.finish,
        n.codes_per_s,
        n.x_real_time,
        synth.ran_on(&report),
        match n.npu_commands {
            Some(c) => format!(" ({c} NPU commands)"),
            None => String::new(),
        },
        n.rtf,
        report.seed,
        report.prompt_tokens,
    );
    Ok(())
}

/// Writes `bytes` to `path` whole or not at all.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f =
        PartialFile::create(path).with_context(|| format!("creating {}", path.display()))?;
    std::io::Write::write_all(&mut f, bytes)
        .and_then(|()| f.commit())
        .with_context(|| format!("writing {}", path.display()))
}

fn decode_to(model: &ModelArgs, out: &OutArgs, codes_path: &Path, output: &Path) -> Result<()> {
    let text = std::fs::read_to_string(codes_path)
        .with_context(|| format!("reading {}", codes_path.display()))?;
    let codes =
        SpeechCodes::from_json(&text).with_context(|| format!("{}", codes_path.display()))?;
    let spec = output_spec(out, output)?;
    let cfg = synth_config(model);
    // Only the codec is needed: the package's codec/ unless --codec names another.
    let codec_dir = onebit_tts::package::codec_dir_of(&cfg.package_dir, cfg.codec_dir.as_deref());
    let codec_pkg = onebit_tts::package::CodecPackage::load(&codec_dir)?;
    // One document decodes as one stream.
    let codec = onebit_tts::synth::load_codec(&cfg, &codec_pkg, 1)?;
    let mut file =
        PartialFile::create(output).with_context(|| format!("creating {}", output.display()))?;
    let tally = codes.decode(&codec, codec_pkg.sample_rate, &spec, &mut |ev| {
        let written = match ev {
            SynthEvent::Audio(bytes) => file.append(bytes),
            SynthEvent::Patch { offset, bytes } => file.patch(offset, bytes),
            _ => true,
        };
        if written {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(())
        }
    })?;
    file.commit()
        .with_context(|| format!("writing {}", output.display()))?;
    eprintln!(
        "wrote {} — {:.2} s of audio from {} codes in {} pieces",
        output.display(),
        tally.samples as f64 / f64::from(codec_pkg.sample_rate) / f64::from(spec.speed),
        codes.all_codes().count(),
        codes.pieces.len(),
    );
    Ok(())
}

fn prompt_cmd(model: &ModelArgs, g: &GenArgs, voice: &str, text: String, json: bool) -> Result<()> {
    // The prompt needs no runtime: only the package, the voice and the front end.
    let front = FrontEnd::load(&synth_config(model))?;
    let mut req = request(voice, text, g, OutputSpec::default())?;
    req.emotion = emotion(front.package(), g)?;
    let budget = front.package().genai.token_budget();
    let plan = front.plan(&req, budget, req.generation.min_new_tokens)?;
    let pieces = &plan.pieces;
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    if json {
        let list: Vec<_> = pieces
            .iter()
            .map(|p| {
                let mut v = serde_json::json!({"text": p.text, "prepared": p.prepared, "ids": p.ids,
                "tokens": p.ids.len(), "estimated_codes": p.estimated_codes});
                if let Some(s) = secs(p.pause_before) {
                    v["pause_before_s"] = s.into();
                }
                v
            })
            .collect();
        // One piece prints as one object (the common case, and what parity scripts read).
        let mut v = match list.as_slice() {
            [one] => one.clone(),
            _ => serde_json::json!({ "pieces": list, "budget": budget }),
        };
        v["original"] = req.text.clone().into();
        v["normalized"] = plan.spoken.clone().into();
        v["normalize"] = req.reading.normalize.into();
        v["notes"] = plan.notes.clone().into();
        if let Some(s) = secs(plan.trailing_pause) {
            v["pause_after_s"] = s.into();
        }
        println!("{v}");
    } else {
        println!("original: {}\nspoken:   {}", req.text, plan.spoken);
        for note in &plan.notes {
            println!("note:     {note}");
        }
        for (i, p) in pieces.iter().enumerate() {
            if let Some(s) = secs(p.pause_before) {
                println!("pause:    {s} s");
            }
            println!(
                "piece {}/{}\ntext:     {}\nprepared: {}\ntokens:   {} (+~{} codes of a {budget}-token budget)\nids:      {:?}",
                i + 1,
                pieces.len(),
                p.text,
                p.prepared,
                p.ids.len(),
                p.estimated_codes,
                p.ids
            );
        }
        if let Some(s) = secs(plan.trailing_pause) {
            println!("pause:    {s} s");
        }
    }
    Ok(())
}
