//! `bench --peers` on whole synthesis: after our runs, the vendor's own streaming pipeline (the
//! PyPI package neutts's `infer_stream` on llama.cpp with a GGUF and the package's NeuCodec ONNX
//! decoder, benches/peers/neutts_stream.py) on the same texts and voices, with as many codes per
//! case as ours made, in its own process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::peers::{BenchError, Peer, leading_agreement, peer_gguf, peer_python};
use super::{CaseSummary, Report, TEXTS, columns};
use crate::synth::Synthesizer;

const SETUP: &str = "scripts/setup-neutts-peer.sh";

/// Median, fastest and slowest of the peer's measured runs, as its script reports them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The vendor pipeline's numbers for one case and voice.
#[derive(Debug, Clone, Serialize)]
pub struct VendorCase {
    pub case: String,
    pub voice: String,
    /// Its own prompt's length: it phonemizes with its own espeak-ng, so it may differ from ours.
    pub prompt_tokens: usize,
    /// Of those, the voice's part that each run found in its context (0: an empty context).
    pub cached_tokens: usize,
    /// The codes its last run made (it was asked for ours' median).
    pub codes: usize,
    pub first_audio_ms: Spread,
    pub rtf: Spread,
    pub stall_ms: Spread,
    /// From the call to its backbone's first streamed token (phonemes, prompt, prefill, a step).
    pub first_code_ms: Spread,
    /// Its decode_code calls, timed around them.
    pub codec_ms: Spread,
    /// The codes of its last run.
    #[serde(skip)]
    pub last_codes: Vec<u32>,
    /// Greedy runs: how many of its last run's codes equal our last run's from the start (the
    /// same model in both, or not); `None` when sampled or either side's codes are unknown.
    pub codes_as_ours: Option<usize>,
    /// What the script says it ran with (versions, llama.cpp's settings, windows, stubs).
    pub settings: serde_json::Value,
}

/// `bench --peers`: the vendor's streaming pipeline on every case and voice of our runs.
#[derive(Debug, Clone, Serialize)]
pub struct VendorReport {
    /// `neutts 1.4.1`, as the script reports it.
    pub version: String,
    /// `llama-cpp-python 0.3.36`, the backbone's runtime.
    pub backbone: String,
    pub gguf: PathBuf,
    pub codec: PathBuf,
    pub threads: usize,
    pub temperature: f32,
    pub warmup: usize,
    pub runs: usize,
    /// [`VendorOptions::voice_cache`].
    pub voice_cache: bool,
    pub cases: Vec<VendorCase>,
}

/// How the vendor's pipeline runs: what `bench` was given.
#[derive(Debug, Clone, Copy)]
pub struct VendorOptions {
    pub runs: usize,
    pub temperature: f32,
    /// Its backbone's decode threads; `None`: as many as our backbone's tuned default.
    pub threads: Option<usize>,
    /// Each of its runs starts with the voice's part of the prompt in its context, as ours do
    /// with the voice-prefix cache on; else from the empty context the vendor's own reset
    /// leaves before every call (the script's `--prompt-cache voice|none`).
    pub voice_cache: bool,
}

/// One run of the script: a voice's cases.
struct Request<'a> {
    gguf: &'a Path,
    codec: &'a Path,
    voice_file: &'a Path,
    language: &'a str,
    threads: usize,
    warmup: usize,
    runs: usize,
    temperature: f32,
    voice_cache: bool,
    /// (case, codes) in the order they run.
    cases: Vec<(&'a str, usize)>,
}

impl Request<'_> {
    /// The script's command line (benches/peers/neutts_stream.py's options).
    fn args(&self) -> Vec<OsString> {
        let names: Vec<&str> = self.cases.iter().map(|(c, _)| *c).collect();
        let codes: Vec<String> = self.cases.iter().map(|(c, n)| format!("{c}={n}")).collect();
        let mut a: Vec<OsString> = Vec::new();
        let mut opt = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        opt("--gguf", self.gguf.into());
        opt("--codec", self.codec.into());
        opt("--voice", self.voice_file.into());
        opt("--language", self.language.into());
        opt("--threads", self.threads.to_string().into());
        opt("--warmup", self.warmup.to_string().into());
        opt("--runs", self.runs.to_string().into());
        opt("--temperature", self.temperature.to_string().into());
        let cache = if self.voice_cache { "voice" } else { "none" };
        opt("--prompt-cache", cache.into());
        opt("--cases", names.join(",").into());
        opt("--max-codes", codes.join(",").into());
        a
    }
}

/// One line of the script's stdout.
#[derive(Deserialize)]
struct Line {
    case: String,
    text: String,
    prompt_tokens: usize,
    /// Absent from scripts older than `--prompt-cache`.
    #[serde(default)]
    voice_tokens: usize,
    codes: usize,
    first_audio_ms: Spread,
    rtf: Spread,
    stall_ms: Spread,
    first_code_ms: Spread,
    codec_ms: Spread,
    /// Absent from scripts older than the comparison.
    #[serde(default)]
    last_codes: Vec<u32>,
    settings: serde_json::Value,
}

/// The vendor's streaming pipeline, found before our runs so a missing setup is refused before
/// minutes of measuring.
pub struct VendorPeer {
    peer: Peer,
}

impl VendorPeer {
    /// Its GGUF (`gguf`, else the llama.cpp peer's default beside `peer_dir`) and its venv.
    /// `Ok(Err(note))` when no GGUF was asked for and none is there: the bench runs without it.
    pub fn find(gguf: Option<&Path>, peer_dir: &Path) -> Result<Result<Self, String>, BenchError> {
        let model = match peer_gguf(gguf, peer_dir, "the vendor's streaming pipeline (peer)")? {
            Ok(p) => p,
            Err(note) => return Ok(Err(note)),
        };
        let python = peer_python(
            "neutts-peer/venv/bin/python",
            "neutts",
            || ".onebit/neutts-peer/venv (neutts on the llama.cpp peer's llama-cpp-python)".into(),
            SETUP,
        )?;
        Ok(Ok(Self {
            peer: Peer {
                key: "neutts",
                label: "neutts",
                short: "neutts",
                python,
                script: "benches/peers/neutts_stream.py".into(),
                model,
                setup: SETUP,
            },
        }))
    }

    /// Runs the pipeline once per voice of `ours`, on its cases, each case capped at the median
    /// of the codes ours made, with one warm-up before the measured runs; the same codec file as
    /// `synth` decodes with.
    pub fn run(
        &self,
        synth: &Synthesizer,
        ours: &Report,
        opts: VendorOptions,
        progress: &mut dyn FnMut(&str, usize, usize),
    ) -> Result<VendorReport, BenchError> {
        // What the tuned plan gives our backbone (with `--thread-policy ort`, ONNX Runtime counts
        // for itself; --threads sets both).
        let threads = opts.threads.unwrap_or_else(|| {
            use crate::runtime::{ThreadPlan, ThreadPolicy};
            ThreadPlan::for_process(ThreadPolicy::Tuned, None, None)
                .intra_threads
                .unwrap_or(1)
        });
        let codec = synth.package().codec.decoder.clone();
        let store = synth.voices();
        let mut voices: Vec<&str> = Vec::new();
        for c in &ours.cases {
            if !voices.contains(&c.voice.as_str()) {
                voices.push(&c.voice);
            }
        }
        let mut cases: Vec<VendorCase> = Vec::with_capacity(ours.cases.len());
        for (i, voice) in voices.iter().enumerate() {
            progress(
                &format!("the vendor's streaming pipeline (peer), voice {voice}"),
                i,
                voices.len(),
            );
            let v = store.get(voice)?;
            // The file the voice was read from holds its codes and transcript, as the script
            // reads them.
            let file = store
                .path_of(&v.name)
                .ok_or_else(|| BenchError::VoiceFile(v.name.clone()))?;
            let mine: Vec<&CaseSummary> = ours.cases.iter().filter(|c| c.voice == *voice).collect();
            let req = Request {
                gguf: &self.peer.model,
                codec: &codec,
                voice_file: file,
                language: &v.language,
                threads,
                warmup: 1,
                runs: opts.runs,
                temperature: opts.temperature,
                voice_cache: opts.voice_cache,
                cases: mine
                    .iter()
                    .map(|c| (c.case.as_str(), (c.codes.median.round() as usize).max(1)))
                    .collect(),
            };
            let mut theirs = self.run_voice(&req, &mine)?;
            if opts.temperature == 0.0 {
                for c in &mut theirs {
                    c.codes_as_ours = ours
                        .runs
                        .iter()
                        .rev()
                        .find(|r| r.case == c.case && r.voice == c.voice)
                        .filter(|r| !r.codes.is_empty() && !c.last_codes.is_empty())
                        .map(|r| leading_agreement(&r.codes, &c.last_codes));
                }
            }
            cases.extend(theirs);
        }
        progress("done", voices.len(), voices.len());
        let settings = cases.first().map(|c| &c.settings);
        let named = |key: &str, name: &str| {
            settings
                .and_then(|s| s[key].as_str())
                .map_or_else(|| format!("{name} ?"), |v| format!("{name} {v}"))
        };
        Ok(VendorReport {
            version: named("neutts", "neutts"),
            backbone: named("llama_cpp_python", "llama-cpp-python"),
            gguf: self.peer.model.clone(),
            codec,
            threads,
            temperature: opts.temperature,
            warmup: 1,
            runs: opts.runs,
            voice_cache: opts.voice_cache,
            cases,
        })
    }

    /// One run of the script: `mine`, one voice's cases of ours, as the vendor's pipeline ran them.
    fn run_voice(
        &self,
        req: &Request,
        mine: &[&CaseSummary],
    ) -> Result<Vec<VendorCase>, BenchError> {
        let stdout = self.peer.run(&req.args(), None)?;
        let lines = self.parse(&stdout, mine)?;
        Ok(lines
            .into_iter()
            .zip(mine)
            .map(|(line, m)| VendorCase {
                case: line.case,
                voice: m.voice.clone(),
                prompt_tokens: line.prompt_tokens,
                cached_tokens: line.voice_tokens,
                codes: line.codes,
                first_audio_ms: line.first_audio_ms,
                rtf: line.rtf,
                stall_ms: line.stall_ms,
                first_code_ms: line.first_code_ms,
                codec_ms: line.codec_ms,
                last_codes: line.last_codes,
                codes_as_ours: None,
                settings: line.settings,
            })
            .collect())
    }

    /// The script's lines for `ours`' cases, in their order: one per case, each for the case and
    /// text ours ran (a checkout whose bench texts differ from this binary's is refused).
    fn parse(&self, stdout: &[u8], ours: &[&CaseSummary]) -> Result<Vec<Line>, BenchError> {
        let output = |msg: String| BenchError::PeerOutput {
            peer: self.peer.label,
            msg,
        };
        let text = std::str::from_utf8(stdout).map_err(|e| output(format!("not UTF-8: {e}")))?;
        let lines = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str::<Line>(l).map_err(|e| output(format!("{e}: {l}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if lines.len() != ours.len() {
            return Err(BenchError::PeerShort {
                peer: self.peer.label,
                got: lines.len(),
                want: ours.len(),
                what: "cases",
            });
        }
        for (line, c) in lines.iter().zip(ours) {
            let want = TEXTS.iter().find(|(n, _)| *n == c.case).map(|(_, t)| *t);
            if line.case != c.case || Some(line.text.as_str()) != want {
                return Err(output(format!(
                    "ran case {:?} ({:?}) where ours ran {:?} ({:?}); the script reads the texts from its checkout's src/bench/mod.rs, so build this binary from that checkout",
                    line.case,
                    line.text,
                    c.case,
                    want.unwrap_or("?")
                )));
            }
        }
        Ok(lines)
    }
}

impl VendorReport {
    /// The block `bench` prints after its own table.
    pub fn table(&self, ours: &Report) -> String {
        let mut s = format!(
            "the vendor's streaming pipeline (peer): {} on {}, {} decode threads\n  GGUF {}, codec {} (its ONNX class)\n  the same texts and voices, as many codes as ours, {}, {}; median [min–max] of {} runs after {} warm-up; x ours: its median / ours; codes = ours: its last run's codes equal to ours from the start (greedy runs)\n",
            self.version,
            self.backbone,
            self.threads,
            self.gguf.display(),
            self.codec.display(),
            if self.temperature == 0.0 {
                "greedy".to_owned()
            } else {
                format!("temperature {}", self.temperature)
            },
            if self.voice_cache {
                "each run starting with the voice's part of its prompt in context (as ours, from the voice-prefix cache)"
            } else {
                "each run from an empty context"
            },
            self.runs,
            self.warmup,
        );
        let spread =
            |x: Spread, p: usize| format!("{:.p$} [{:.p$}–{:.p$}]", x.median, x.min, x.max);
        // Its own count, with ours beside it where they differ (information, not an error).
        let beside = |theirs: usize, ours: Option<f64>| match ours {
            Some(o) if (o - theirs as f64).abs() > 0.5 => format!("{theirs} (ours {o:.0})"),
            _ => theirs.to_string(),
        };
        let ratio = |theirs: f64, ours: Option<f64>| {
            ours.filter(|o| *o > 0.0)
                .map_or_else(|| "-".to_owned(), |o| format!("{:.2}", theirs / o))
        };
        let mut rows = vec![
            [
                "case",
                "voice",
                "prompt",
                "cached",
                "codes",
                "codes = ours",
                "first audio ms",
                "RTF",
                "stall ms",
                "first code ms",
                "codec ms",
                "first audio x ours",
                "RTF x ours",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for c in &self.cases {
            let o = ours
                .cases
                .iter()
                .find(|o| o.case == c.case && o.voice == c.voice);
            rows.push(vec![
                c.case.clone(),
                c.voice.clone(),
                beside(c.prompt_tokens, o.map(|o| o.prompt_tokens.median)),
                beside(c.cached_tokens, o.map(|o| o.cached_tokens.median)),
                beside(c.codes, o.map(|o| o.codes.median)),
                c.codes_as_ours
                    .map_or_else(|| "-".to_owned(), |n| format!("{n}/{}", c.last_codes.len())),
                spread(c.first_audio_ms, 0),
                spread(c.rtf, 3),
                spread(c.stall_ms, 0),
                spread(c.first_code_ms, 0),
                spread(c.codec_ms, 0),
                ratio(c.first_audio_ms.median, o.map(|o| o.first_audio_ms.median)),
                ratio(c.rtf.median, o.map(|o| o.rtf.median)),
            ]);
        }
        s.push_str(&columns(&rows, 2));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::{StageStats, Stat};
    use super::*;

    fn stat(median: f64) -> Stat {
        Stat {
            median,
            half_range: 0.0,
        }
    }

    fn ours_case(
        case: &str,
        prompt: f64,
        codes: f64,
        first_audio_ms: f64,
        rtf: f64,
    ) -> CaseSummary {
        CaseSummary {
            case: case.into(),
            voice: "test".into(),
            runs: 3,
            prompt_tokens: stat(prompt),
            cached_tokens: stat(28.0),
            codes: stat(codes),
            codes_per_s: stat(0.0),
            x_real_time: stat(0.0),
            rtf: stat(rtf),
            prefill_tok_per_s: stat(0.0),
            first_audio_ms: stat(first_audio_ms),
            stall_ms: stat(0.0),
            stage_ms: StageStats {
                front_end: stat(0.0),
                prefill: stat(0.0),
                decode: stat(0.0),
                codec: stat(0.0),
                encode: stat(0.0),
                turn_wait: stat(0.0),
            },
        }
    }

    fn text(case: &str) -> &'static str {
        TEXTS.iter().find(|(n, _)| *n == case).unwrap().1
    }

    /// A line as benches/peers/neutts_stream.py prints it (fewer settings).
    fn line(case: &str, prompt_tokens: usize, codes: usize, first_audio: [f64; 3]) -> String {
        let spread =
            |m: f64, lo: f64, hi: f64| serde_json::json!({"median": m, "min": lo, "max": hi});
        serde_json::json!({"case": case, "text": text(case), "prompt_tokens": prompt_tokens,
            "voice_tokens": 28, "max_codes": codes, "codes": codes, "chunks": 5,
            "first_audio_ms": spread(first_audio[0], first_audio[1], first_audio[2]),
            "wall_s": spread(5.0, 4.9, 5.2), "audio_s": spread(2.42, 2.42, 2.42),
            "rtf": spread(2.04, 2.04, 2.2), "stall_ms": spread(1377.0, 1371.0, 1750.0),
            "first_code_ms": spread(1100.0, 1090.0, 1200.0), "codec_ms": spread(760.5, 700.0, 800.0),
            "last_codes": (0..codes as u32).collect::<Vec<_>>(),
            "runs": [], "settings": {"neutts": "1.4.1", "llama_cpp_python": "0.3.36"}})
        .to_string()
    }

    #[test]
    fn vendor_peer_runs_the_script_reads_its_lines_and_reports_failures() {
        let dir = std::env::temp_dir().join(format!("onebit-vendor-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let args_file = dir.join("args");
        let script = |name: &str, body: &str| {
            let p = dir.join(name);
            std::fs::write(&p, body).unwrap();
            p
        };
        let ok = script(
            "ok.sh",
            &format!(
                "printf '%s\\n' \"$@\" > {}\ncat <<'EOF'\n{}\n\n{}\nEOF\n",
                args_file.display(),
                line("short", 150, 120, [1569.4, 1561.0, 1585.0]),
                line("medium", 201, 97, [2219.0, 2010.0, 2314.0]),
            ),
        );
        let peer = |script: &Path| VendorPeer {
            peer: Peer {
                key: "neutts",
                label: "neutts",
                short: "neutts",
                python: PathBuf::from("/bin/sh"),
                script: script.to_path_buf(),
                model: PathBuf::from("m.gguf"),
                setup: SETUP,
            },
        };
        let ours = [
            ours_case("short", 147.0, 120.0, 1328.0, 1.616),
            ours_case("medium", 201.0, 97.0, 1487.0, 1.565),
        ];
        let mine: Vec<&CaseSummary> = ours.iter().collect();
        let req = Request {
            gguf: Path::new("m.gguf"),
            codec: Path::new("codec/model.onnx"),
            voice_file: Path::new("voices/test.json"),
            language: "en-us",
            threads: 2,
            warmup: 1,
            runs: 3,
            temperature: 0.0,
            voice_cache: true,
            cases: vec![("short", 120), ("medium", 97)],
        };
        let cases = peer(&ok).run_voice(&req, &mine).unwrap();
        // The script's command line, as benches/peers/neutts_stream.py takes it.
        assert_eq!(
            std::fs::read_to_string(&args_file).unwrap(),
            "--gguf\nm.gguf\n--codec\ncodec/model.onnx\n--voice\nvoices/test.json\n--language\nen-us\n\
             --threads\n2\n--warmup\n1\n--runs\n3\n--temperature\n0\n--prompt-cache\nvoice\n--cases\nshort,medium\n\
             --max-codes\nshort=120,medium=97\n"
        );
        assert_eq!(cases.len(), 2);
        let c = &cases[0];
        assert_eq!((c.case.as_str(), c.voice.as_str()), ("short", "test"));
        assert_eq!((c.prompt_tokens, c.codes), (150, 120));
        let spread = |median, min, max| Spread { median, min, max };
        assert_eq!(c.first_audio_ms, spread(1569.4, 1561.0, 1585.0));
        assert_eq!(c.rtf, spread(2.04, 2.04, 2.2));
        assert_eq!(c.stall_ms, spread(1377.0, 1371.0, 1750.0));
        assert_eq!(c.first_code_ms, spread(1100.0, 1090.0, 1200.0));
        assert_eq!(c.codec_ms, spread(760.5, 700.0, 800.0));
        assert_eq!(c.settings["neutts"], "1.4.1");
        assert_eq!(cases[1].first_audio_ms.median, 2219.0);
        assert_eq!(c.last_codes, (0..120).collect::<Vec<u32>>());
        // What run() fills in from our last run's codes when greedy.
        let mut cases = cases;
        cases[0].codes_as_ours = Some(leading_agreement(&[0, 1, 2, 9], &cases[0].last_codes));
        assert_eq!(cases[0].codes_as_ours, Some(3));

        // The block after our table: the peer's prompt beside ours where they differ, ratios of
        // medians, its median / ours.
        let report = VendorReport {
            version: "neutts 1.4.1".into(),
            backbone: "llama-cpp-python 0.3.36".into(),
            gguf: "m.gguf".into(),
            codec: "codec/model.onnx".into(),
            threads: 2,
            temperature: 0.0,
            warmup: 1,
            runs: 3,
            voice_cache: true,
            cases,
        };
        let ours_report = Report {
            engine: "ort".into(),
            device: "cpu".into(),
            residency: None,
            package: "pkg".into(),
            package_note: None,
            machine: "2 cores".into(),
            codec: "codec".into(),
            runs: Vec::new(),
            cases: ours.to_vec(),
            peak_rss_mb: 1.0,
            model_files_mb: 1.0,
            vendor: None,
            vendor_note: None,
        };
        let table = report.table(&ours_report);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "the vendor's streaming pipeline (peer): neutts 1.4.1 on llama-cpp-python 0.3.36, 2 decode threads"
        );
        assert_eq!(
            lines[1],
            "  GGUF m.gguf, codec codec/model.onnx (its ONNX class)"
        );
        assert!(
            lines[2].contains("greedy, each run starting with the voice's part of its prompt in context (as ours, from the voice-prefix cache); median [min–max] of 3 runs after 1 warm-up"),
            "{table}"
        );
        assert_eq!(
            lines[3],
            "case    voice          prompt  cached  codes  codes = ours    first audio ms                  RTF          stall ms     first code ms       codec ms  first audio x ours  RTF x ours"
        );
        assert_eq!(
            lines[4],
            "short   test   150 (ours 147)      28    120         3/120  1569 [1561–1585]  2.040 [2.040–2.200]  1377 [1371–1750]  1100 [1090–1200]  760 [700–800]                1.18        1.26"
        );
        assert_eq!(
            lines[5],
            "medium  test              201      28     97             -  2219 [2010–2314]  2.040 [2.040–2.200]  1377 [1371–1750]  1100 [1090–1200]  760 [700–800]                1.49        1.30"
        );
        assert_eq!(lines.len(), 6, "{table}");

        // A case short: refused.
        let three = [
            ours_case("short", 147.0, 120.0, 1.0, 1.0),
            ours_case("medium", 201.0, 97.0, 1.0, 1.0),
            ours_case("long", 289.0, 120.0, 1.0, 1.0),
        ];
        let e = peer(&ok)
            .run_voice(&req, &three.iter().collect::<Vec<_>>())
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e, "the neutts peer answered 2 of 3 cases");
        // Lines for other cases than ours (in another order): refused, saying why.
        let swapped = [ours[1].clone(), ours[0].clone()];
        let e = peer(&ok)
            .run_voice(&req, &swapped.iter().collect::<Vec<_>>())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("the neutts peer's output: ran case \"short\"")
                && e.contains("where ours ran \"medium\""),
            "{e}"
        );
        // Not its output format: the line it printed.
        let junk = script("junk.sh", "echo '{\"case\": \"short\"}'\n");
        let e = peer(&junk)
            .run_voice(&req, &mine)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with("the neutts peer's output: missing field")
                && e.contains("{\"case\": \"short\"}"),
            "{e}"
        );
        // A failing script: its exit status, the GGUF and the setup script.
        let bad = script("bad.sh", "echo boom >&2; exit 3\n");
        let e = peer(&bad).run_voice(&req, &mine).err().unwrap().to_string();
        assert_eq!(
            e,
            "the neutts peer failed (exit status: 3) on m.gguf; its messages are above (setup: scripts/setup-neutts-peer.sh)"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn vendor_peer_without_a_gguf_is_a_note_and_without_its_venv_an_error() {
        let dir = std::env::temp_dir().join(format!("onebit-vendor-find-{}", std::process::id()));
        let pkg = dir.join("pkg");
        std::fs::create_dir_all(&pkg).unwrap();
        match VendorPeer::find(None, &pkg).unwrap() {
            Err(note) => assert_eq!(
                note,
                format!(
                    "the vendor's streaming pipeline (peer) not run: no {} (and no --llama-gguf); to add it: scripts/setup-llama-peer.sh && .onebit/venv/bin/python tools/onnx_to_gguf.py {}",
                    dir.join("pkg-q4_0.gguf").display(),
                    pkg.display()
                )
            ),
            Ok(_) => panic!("no GGUF exists"),
        }
        let e = peer_python(
            "no-such-peer/venv/bin/python",
            "neutts",
            || "its venv".into(),
            SETUP,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "the neutts peer needs its venv (scripts/setup-neutts-peer.sh)"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
