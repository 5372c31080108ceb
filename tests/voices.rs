//! Voice import: the vendor's reference voices (samples/, shipped, and the neutts wheel's
//! samples when scripts/setup.sh has unpacked them), torch files generated here without torch,
//! .npy / JSON sources, folder imports, every refusal, and saving / removing voice files.

mod common;

use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};
use std::path::{Path, PathBuf};

use onebit_tts::voice::{
    ImportOptions, Voice, VoiceError, VoiceStore, check_budget, import_path, import_paths,
};

// ---------------------------------------------------------------------------------------------
// A torch.save stand-in: the same zip layout and protocol-2 pickle bytes as the vendor's dave.pt
// (checked byte for byte against it below).

/// Builds pickle bytes the way Python's protocol-2 pickler does for these values: smallest int
/// opcode, TUPLE1-3 for short tuples, a BINPUT after every memoizable object.
#[derive(Default)]
struct Pk {
    out: Vec<u8>,
    memo: u8,
}

impl Pk {
    fn op(&mut self, b: &[u8]) -> &mut Self {
        self.out.extend_from_slice(b);
        self
    }
    fn put(&mut self) -> &mut Self {
        let m = self.memo;
        self.memo += 1;
        self.op(&[b'q', m])
    }
    fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.op(format!("c{module}\n{name}\n").as_bytes()).put()
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.op(b"X")
            .op(&(s.len() as u32).to_le_bytes())
            .op(s.as_bytes())
            .put()
    }
    fn int(&mut self, v: u64) -> &mut Self {
        match v {
            0..=0xff => self.op(&[b'K', v as u8]),
            0x100..=0xffff => self.op(b"M").op(&(v as u16).to_le_bytes()),
            _ => self.op(b"J").op(&(v as i32).to_le_bytes()),
        }
    }
    fn int_tuple(&mut self, items: &[u64]) -> &mut Self {
        if items.is_empty() {
            return self.op(b")");
        }
        if items.len() > 3 {
            self.op(b"(");
        }
        for v in items {
            self.int(*v);
        }
        match items.len() {
            1 => self.op(b"\x85"),
            2 => self.op(b"\x86"),
            3 => self.op(b"\x87"),
            _ => self.op(b"t"),
        }
        .put()
    }
}

/// `torch._utils._rebuild_tensor_v2(('storage', torch.<class>, '0', 'cpu', numel), offset, size,
/// stride, False, OrderedDict())` as torch.save pickles it.
fn tensor_pickle(class: &str, numel: u64, offset: u64, size: &[u64], stride: &[u64]) -> Vec<u8> {
    let mut p = Pk::default();
    p.op(b"\x80\x02")
        .global("torch._utils", "_rebuild_tensor_v2");
    p.op(b"((")
        .str("storage")
        .global("torch", class)
        .str("0")
        .str("cpu");
    p.int(numel).op(b"t").put().op(b"Q");
    p.int(offset).int_tuple(size).int_tuple(stride);
    p.op(b"\x89")
        .global("collections", "OrderedDict")
        .op(b")R")
        .put();
    p.op(b"t").put().op(b"R").put().op(b".");
    p.out
}

/// A torch zip archive: members in torch's order, stored, data aligned to 64 bytes with torch's
/// "FB" padding field.
fn torch_zip(prefix: &str, members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .with_alignment_and_header_id(64, 0x4246);
    for (name, data) in members {
        w.start_file(format!("{prefix}/{name}"), opts).unwrap();
        w.write_all(data).unwrap();
    }
    w.finish().unwrap().into_inner()
}

fn le_bytes(codes: &[i64], width: usize) -> Vec<u8> {
    codes
        .iter()
        .flat_map(|c| c.to_le_bytes()[..width].to_vec())
        .collect()
}

/// A .pt as torch >= 2.1 writes `torch.save(tensor)`.
fn torch_pt(
    prefix: &str,
    class: &str,
    storage: &[i64],
    offset: u64,
    size: &[u64],
    stride: &[u64],
) -> Vec<u8> {
    let width = match class {
        "ShortStorage" => 2,
        "IntStorage" | "FloatStorage" => 4,
        _ => 8,
    };
    let pkl = tensor_pickle(class, storage.len() as u64, offset, size, stride);
    let data = le_bytes(storage, width);
    torch_zip(
        prefix,
        &[
            ("data.pkl", &pkl),
            (".format_version", b"1"),
            (".storage_alignment", b"64"),
            ("byteorder", b"little"),
            ("data/0", &data),
            ("version", b"3\n"),
            (
                ".data/serialization_id",
                b"0000000000000000000000000000000000000000",
            ),
        ],
    )
}

fn int_pt(prefix: &str, codes: &[i64]) -> Vec<u8> {
    torch_pt(prefix, "IntStorage", codes, 0, &[codes.len() as u64], &[1])
}

/// Torch's pre-1.6 format: magic, protocol and sys-info pickles, the tensor pickle (a 6-tuple
/// persistent id), the storage-key list, then an int64 count and the raw storage.
fn legacy_pt(codes: &[i64], view: bool) -> Vec<u8> {
    let mut out = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.".to_vec();
    out.extend(b"\x80\x02M\xe9\x03.");
    let mut sys = Pk::default();
    sys.op(b"\x80\x02}")
        .put()
        .op(b"(")
        .str("protocol_version")
        .int(1001);
    sys.str("little_endian")
        .op(b"\x88")
        .str("type_sizes")
        .op(b"}")
        .put()
        .op(b"(");
    sys.str("short")
        .int(2)
        .str("int")
        .int(4)
        .str("long")
        .int(4)
        .op(b"uu.");
    out.extend(&sys.out);
    let n = codes.len() as u64;
    let mut p = Pk::default();
    p.op(b"\x80\x02")
        .global("torch._utils", "_rebuild_tensor_v2");
    p.op(b"((")
        .str("storage")
        .global("torch", "LongStorage")
        .str("94213")
        .str("cpu")
        .int(n);
    if view {
        // (view_key, offset, size): a slice of a shared storage, which old torch wrote this way.
        p.op(b"(").str("94214").int(0).int(n).op(b"t").put();
    } else {
        p.op(b"N");
    }
    p.op(b"t").put().op(b"Q");
    p.int(0).int_tuple(&[n]).int_tuple(&[1]);
    p.op(b"\x89")
        .global("collections", "OrderedDict")
        .op(b")R")
        .put();
    p.op(b"t").put().op(b"R").put().op(b".");
    out.extend(&p.out);
    let mut keys = Pk::default();
    keys.op(b"\x80\x02]").put().str("94213").op(b"a.");
    out.extend(&keys.out);
    out.extend(n.to_le_bytes());
    out.extend(le_bytes(codes, 8));
    out
}

fn npy_i16(codes: &[i64]) -> Vec<u8> {
    let mut header = format!(
        "{{'descr': '<i2', 'fortran_order': False, 'shape': (1, {}), }}",
        codes.len()
    );
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(le_bytes(codes, 2));
    out
}

fn codes(n: usize) -> Vec<i64> {
    // Spread over the whole codebook, both ends included.
    (0..n as i64)
        .map(|i| (i * 7919) % 65_536)
        .chain([65_535, 0])
        .collect()
}

fn as_u32(c: &[i64]) -> Vec<u32> {
    c.iter().map(|c| *c as u32).collect()
}

fn with_text(t: &str) -> ImportOptions {
    ImportOptions {
        transcript: Some(t.into()),
        ..ImportOptions::default()
    }
}

fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

fn one(path: &Path, opts: &ImportOptions) -> Voice {
    let mut v = import_path(path, opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(v.len(), 1);
    v.remove(0)
}

/// The error text, which must name `file`.
fn refusal(path: &Path, opts: &ImportOptions, file: &Path) -> String {
    let err = match import_path(path, opts) {
        Ok(v) => panic!("{} imported: {v:?}", path.display()),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&file.display().to_string()),
        "the message does not name {}: {err}",
        file.display()
    );
    err
}

// ---------------------------------------------------------------------------------------------
// The vendor's own files.

/// The storage member read the way the README says (`struct.unpack('<%di' ...)`), independent of
/// the importer's pickle reading.
fn unpack_int32_member(pt: &Path, member: &str) -> Vec<u32> {
    let mut z = zip::ZipArchive::new(std::fs::File::open(pt).unwrap()).unwrap();
    let mut bytes = Vec::new();
    z.by_name(member).unwrap().read_to_end(&mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u32)
        .collect()
}

/// The vendor's five voices: (name, language, codes, storage member prefix of NAME.pt).
const VENDOR_VOICES: [(&str, &str, usize, &str); 5] = [
    ("dave", "en-us", 372, "dave"),
    ("greta", "de", 199, "fleurs_fem_1"),
    ("jo", "en-us", 653, "jo"),
    ("juliette", "fr-fr", 405, "voice_actor_fem"),
    ("mateo", "es", 318, "voiceactor_male"),
];

#[test]
fn vendor_voices_import_exactly() {
    // The shipped copy of the vendor's samples/ (compared with ../shared below, when present).
    let dir = common::repo().join("samples");
    let opts = ImportOptions {
        languages: BTreeMap::from([
            ("greta".into(), "de".into()),
            ("juliette".into(), "fr-fr".into()),
            ("mateo".into(), "es".into()),
        ]),
        source: Some("neuphonic/neutts samples/".into()),
        license: Some("NeuTTS Open License v1.0".into()),
        ..ImportOptions::default()
    };
    let voices = import_path(&dir, &opts).unwrap();
    assert_eq!(voices.len(), VENDOR_VOICES.len());
    let front = tiny_front();
    for (v, (name, lang, n, prefix)) in voices.iter().zip(VENDOR_VOICES) {
        assert_eq!((v.name.as_str(), v.language.as_str()), (name, lang));
        assert_eq!(v.codes.len(), n, "{name}");
        let pt = dir.join(format!("{name}.pt"));
        assert_eq!(
            v.codes,
            unpack_int32_member(&pt, &format!("{prefix}/data/0")),
            "{name}"
        );
        let txt = std::fs::read_to_string(dir.join(format!("{name}.txt"))).unwrap();
        assert_eq!(v.transcript, txt.trim(), "{name}");
        assert_eq!(v.license, "NeuTTS Open License v1.0");
        // Each fits NeuTTS-air's 2048-token context with room to speak, by its exact prompt.
        let needed = front.reference_tokens(v).unwrap();
        assert_eq!(check_budget(v, needed, 2048).unwrap(), None, "{name}");
    }

    // The generator below mirrors the real file: same pickle bytes for the same tensor.
    let mut z = zip::ZipArchive::new(std::fs::File::open(dir.join("dave.pt")).unwrap()).unwrap();
    let mut pkl = Vec::new();
    z.by_name("dave/data.pkl")
        .unwrap()
        .read_to_end(&mut pkl)
        .unwrap();
    assert_eq!(pkl, tensor_pickle("IntStorage", 372, 0, &[372], &[1]));
}

/// What a fresh clone ships: samples/ holds the vendor's files unchanged (byte for byte against
/// ../shared/voices-reference when that is here), and voices/NAME.json holds exactly the codes of
/// samples/NAME.pt (read by the importer and by a plain int32 unpack), its transcript, language,
/// source and licence. Runs without ../shared: the byte comparison is then the only part left out.
#[test]
fn shipped_voices_are_the_vendor_codes_exactly() {
    let samples = common::repo().join("samples");
    let licence = std::fs::read_to_string(samples.join("LICENSE")).unwrap();
    assert!(licence.contains("NeuTTS Open License v1.0"));
    let readme = std::fs::read_to_string(samples.join("README.md")).unwrap();
    assert!(
        readme.contains("neuphonic/neutts") && readme.contains("NeuTTS Open License v1.0"),
        "{readme}"
    );
    if let Some(shared) = common::shared() {
        let reference = shared.join("voices-reference");
        let mut files = vec!["LICENSE".to_owned()];
        for (name, ..) in VENDOR_VOICES {
            files.extend(["wav", "txt", "pt"].map(|ext| format!("{name}.{ext}")));
        }
        for f in files {
            assert!(
                std::fs::read(samples.join(&f)).unwrap()
                    == std::fs::read(reference.join(&f)).unwrap(),
                "samples/{f} differs from the vendor's"
            );
        }
    }
    let store = VoiceStore::open(&[common::repo().join("voices")]).unwrap();
    let imported = import_path(&samples, &ImportOptions::default()).unwrap();
    assert_eq!(imported.len(), VENDOR_VOICES.len());
    for (fresh, (name, lang, n, prefix)) in imported.iter().zip(VENDOR_VOICES) {
        let shipped = store.get(name).unwrap();
        assert_eq!(shipped.codes.len(), n, "{name}");
        assert_eq!(
            shipped.codes, fresh.codes,
            "{name}: codes of samples/{name}.pt"
        );
        assert_eq!(
            shipped.codes,
            unpack_int32_member(
                &samples.join(format!("{name}.pt")),
                &format!("{prefix}/data/0")
            ),
            "{name}"
        );
        assert_eq!(shipped.transcript, fresh.transcript, "{name}");
        assert_eq!(shipped.language, lang, "{name}");
        assert_eq!(
            shipped.license, "NeuTTS Open License v1.0 (samples/LICENSE)",
            "{name}"
        );
        assert!(
            shipped
                .source
                .starts_with("neuphonic/neutts repository, samples/"),
            "{name}: {}",
            shipped.source
        );
    }
    // The wheel's four voices are other speakers: none repeats a vendor voice's codes.
    let wheel = ["emily", "paul", "sophie", "steven"];
    for w in wheel {
        let v = store.get(w).unwrap();
        assert_eq!(v.license, "NeuTTS Open License v1.0", "{w}");
        assert!(imported.iter().all(|f| f.codes != v.codes), "{w}");
    }
    // And they are the wheel's codes, when scripts/setup.sh has unpacked the wheel.
    if let Some(dir) = onebit_tts::paths::in_homes("neutts/samples")
        .into_iter()
        .find(|d| d.join("emily.pt").exists())
    {
        for v in import_path(&dir, &ImportOptions::default()).unwrap() {
            assert_eq!(store.get(&v.name).unwrap().codes, v.codes, "{}", v.name);
        }
    }
}

#[test]
fn wheel_samples_import() {
    let Some(dir) = onebit_tts::paths::in_homes("neutts/samples")
        .into_iter()
        .find(|d| d.join("emily.pt").exists())
    else {
        common::skip(
            "wheel samples",
            ".onebit/neutts/samples absent: run scripts/setup.sh",
        );
        return;
    };
    let voices = import_path(&dir, &ImportOptions::default()).unwrap();
    let names: Vec<&str> = voices.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["emily", "paul", "sophie", "steven"]);
    for v in &voices {
        let pt = dir.join(format!("{}.pt", v.name));
        assert_eq!(
            v.codes,
            unpack_int32_member(&pt, &format!("{}/data/0", v.name))
        );
        assert_eq!(v.language, "en-us");
        assert_eq!(v.source, format!("imported from {}.pt", v.name));
    }
}

// ---------------------------------------------------------------------------------------------
// Generated files.

#[test]
fn generated_torch_files_import() {
    let dir = common::tempdir("voices-gen");
    let c = codes(300);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("int", int_pt("int", &c)),
        (
            "long",
            torch_pt("archive", "LongStorage", &c, 0, &[c.len() as u64], &[1]),
        ),
        (
            "short",
            // int16 holds codes up to 32767 only; torch would store these as such.
            torch_pt("x", "ShortStorage", &[0, 1, 32_767, 5], 0, &[4], &[1]),
        ),
        (
            "row",
            torch_pt(
                "row",
                "IntStorage",
                &c,
                0,
                &[1, c.len() as u64],
                &[c.len() as u64, 1],
            ),
        ),
        (
            "batch",
            torch_pt(
                "b",
                "LongStorage",
                &c,
                0,
                &[1, 1, c.len() as u64],
                &[0, 0, 1],
            ),
        ),
        ("legacy", legacy_pt(&c, false)),
    ];
    for (name, bytes) in &cases {
        let p = write(&dir, &format!("{name}.pt"), bytes);
        let v = one(&p, &with_text("Hello there."));
        let want = if *name == "short" {
            vec![0, 1, 32_767, 5]
        } else {
            as_u32(&c)
        };
        assert_eq!(v.codes, want, "{name}");
        assert_eq!((v.name.as_str(), v.language.as_str()), (*name, "en-us"));
        assert_eq!(v.transcript, "Hello there.");
    }

    // A view into a larger storage: offset honoured.
    let p = write(
        &dir,
        "view.pt",
        &torch_pt("v", "IntStorage", &c, 10, &[5], &[1]),
    );
    assert_eq!(one(&p, &with_text("x")).codes, as_u32(&c[10..15]));
}

#[test]
fn npy_and_json_sources_import() {
    let dir = common::tempdir("voices-npy");
    let c = codes(50)
        .into_iter()
        .map(|c| c % 32_768)
        .collect::<Vec<_>>();
    let p = write(&dir, "n.npy", &npy_i16(&c));
    write(&dir, "n.txt", b"From numpy.\n");
    let v = one(&p, &ImportOptions::default());
    assert_eq!(
        (v.codes.clone(), v.transcript.as_str()),
        (as_u32(&c), "From numpy.")
    );

    let p = write(&dir, "list.json", b"[1, 2, 65535]");
    let v = one(&p, &with_text("A list."));
    assert_eq!(v.codes, [1, 2, 65_535]);

    let p = write(
        &dir,
        "obj.json",
        br#"{"codes": [3, 4], "transcript": "An object.", "language": "fr"}"#,
    );
    let v = one(&p, &ImportOptions::default());
    assert_eq!(
        (v.language.as_str(), v.transcript.as_str()),
        ("fr-fr", "An object.")
    );

    // The project's own format round-trips, renamed on the way.
    let saved = VoiceStore::save(&dir.join("store"), &v, false).unwrap();
    let again = one(
        &saved,
        &ImportOptions {
            name: Some("obj2".into()),
            ..ImportOptions::default()
        },
    );
    assert_eq!(
        again,
        Voice {
            name: "obj2".into(),
            ..v
        }
    );
}

#[test]
fn folder_import_of_generated_pairs() {
    let dir = common::tempdir("voices-folder");
    let a = codes(120);
    let b = codes(80);
    write(&dir, "alpha.pt", &int_pt("alpha", &a));
    // The vendor strips: surrounding whitespace and CRLF line ends go, inner text stays.
    write(&dir, "alpha.txt", b"  First line,\r\nsecond line.\r\n\r\n");
    write(
        &dir,
        "beta.pt",
        &torch_pt(
            "archive",
            "LongStorage",
            &b,
            0,
            &[1, b.len() as u64],
            &[b.len() as u64, 1],
        ),
    );
    write(&dir, "beta.txt", "Guten Tag.".as_bytes());
    write(&dir, "alpha.wav", b"RIFF....WAVE");
    write(&dir, "README.md", b"not a voice");
    write(&dir, ".beta.json.123-0.tmp", b"junk");
    let mut opts = ImportOptions {
        source: Some("test".into()),
        license: Some("test licence".into()),
        ..ImportOptions::default()
    };
    // As the CLI passes `--language en-us --language beta=de`.
    opts.add_language("en-us");
    opts.add_language("beta=de");
    let voices = import_path(&dir, &opts).unwrap();
    assert_eq!(voices.len(), 2);
    assert_eq!(
        (
            voices[0].name.as_str(),
            voices[0].transcript.as_str(),
            voices[0].language.as_str()
        ),
        ("alpha", "First line,\nsecond line.", "en-us")
    );
    assert_eq!(voices[0].codes, as_u32(&a));
    assert_eq!(
        (voices[1].name.as_str(), voices[1].language.as_str()),
        ("beta", "de")
    );
    assert_eq!(voices[1].codes, as_u32(&b));

    // Saved and read back by the store unchanged.
    let store_dir = dir.join("voices");
    for v in &voices {
        VoiceStore::save(&store_dir, v, false).unwrap();
    }
    let store = VoiceStore::open(std::slice::from_ref(&store_dir)).unwrap();
    assert_eq!(store.names(), ["alpha", "beta"]);
    for v in &voices {
        assert_eq!(store.get(&v.name).unwrap(), v);
    }

    // A language for a voice that is not there is a typo, not a no-op.
    let mut typo = opts.clone();
    typo.add_language("betta=de");
    let err = refusal(&dir, &typo, &dir);
    assert!(
        err.contains("\"betta\"") && err.contains("no imported voice"),
        "{err}"
    );

    // A name or transcript cannot apply to a whole folder; two paths may not clash.
    let err = refusal(&dir, &with_text("x"), &dir);
    assert!(err.contains("one voice"), "{err}");
    let err = import_paths(&[dir.clone(), dir.join("alpha.pt")], &opts).unwrap_err();
    assert!(
        err.to_string().contains("two voices are named \"alpha\""),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// Refusals: each names the file and says what is wrong.

#[test]
fn corrupt_torch_files_are_refused() {
    let dir = common::tempdir("voices-corrupt");
    let c = codes(40);
    let good = int_pt("g", &c);
    let t = with_text("Words.");
    let check = |name: &str, bytes: &[u8], want: &str| {
        let p = write(&dir, name, bytes);
        let err = refusal(&p, &t, &p);
        assert!(err.contains(want), "{name}: {err}");
    };

    check(
        "truncated.pt",
        &good[..good.len() / 2],
        "not a readable torch zip archive",
    );
    check("empty.pt", b"", "not a torch file");
    check("text.pt", b"hello", "not a torch file");

    let pkl = tensor_pickle("IntStorage", c.len() as u64, 0, &[c.len() as u64], &[1]);
    let data = le_bytes(&c, 4);
    check(
        "garbage-pickle.pt",
        &torch_zip("p", &[("data.pkl", b"\x80\x02\xff"), ("data/0", &data)]),
        "unsupported pickle opcode 0xff",
    );
    check(
        "cut-pickle.pt",
        &torch_zip("p", &[("data.pkl", &pkl[..60]), ("data/0", &data)]),
        "p/data.pkl: the pickle ends early",
    );
    // A pickle that is fine but holds no tensor.
    check(
        "dict.pt",
        &torch_zip(
            "p",
            &[
                ("data.pkl", b"\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01u."),
                ("data/0", &data),
            ],
        ),
        "holds a dict of 1 item, not a tensor of codes",
    );
    check(
        "no-data.pt",
        &torch_zip("p", &[("data.pkl", &pkl), ("byteorder", b"little")]),
        "no storage member p/data/0",
    );
    check(
        "no-pkl.pt",
        &torch_zip("p", &[("data/0", &data)]),
        "no <prefix>/data.pkl",
    );
    check(
        "short-data.pt",
        &torch_zip(
            "p",
            &[("data.pkl", &pkl), ("data/0", &data[..data.len() - 4])],
        ),
        "p/data/0 holds 164 bytes; the pickle says 42 int32 values (168 bytes)",
    );
    let floats: Vec<i64> = c.iter().map(|v| f32::to_bits(*v as f32) as i64).collect();
    check(
        "float.pt",
        &torch_pt(
            "f",
            "FloatStorage",
            &floats,
            0,
            &[floats.len() as u64],
            &[1],
        ),
        "torch.FloatStorage; codes must be integers",
    );
    check(
        "strided.pt",
        &torch_pt("s", "IntStorage", &c, 0, &[20], &[2]),
        "not contiguous",
    );
    check(
        "matrix.pt",
        &torch_pt("m", "IntStorage", &c[..40], 0, &[2, 20], &[20, 1]),
        "shape [2, 20]",
    );
    check(
        "overrun.pt",
        &torch_pt("o", "IntStorage", &c, 30, &[20], &[1]),
        "runs past its storage",
    );
    check(
        "big-code.pt",
        &torch_pt("b", "LongStorage", &[1, 2, 70_000], 0, &[3], &[1]),
        "code 70000 at index 2 is outside 0..65535",
    );
    check(
        "negative.pt",
        &torch_pt("n", "IntStorage", &[5, -3], 0, &[2], &[1]),
        "code -3 at index 1 is outside 0..65535",
    );
    let mut tar = vec![0u8; 600];
    tar[257..262].copy_from_slice(b"ustar");
    check(
        "tar.pt",
        &tar,
        "legacy torch format not supported; re-save with torch>=1.6",
    );
    check(
        "legacy-view.pt",
        &legacy_pt(&c, true),
        "a view into a shared legacy storage",
    );
    check(
        "plain-pickle.pt",
        b"\x80\x02K\x01.",
        "no torch magic number",
    );
}

#[test]
fn bad_transcripts_names_and_types_are_refused() {
    let dir = common::tempdir("voices-bad");
    let pt = write(&dir, "v.pt", &int_pt("v", &codes(10)));

    // No transcript at all: the message says where to put one.
    let err = refusal(&pt, &ImportOptions::default(), &pt);
    assert!(
        err.contains("no transcript") && err.contains("v.txt"),
        "{err}"
    );

    let txt = write(&dir, "v.txt", b" \r\n\t ");
    let err = refusal(&pt, &ImportOptions::default(), &txt);
    assert!(err.contains("the transcript is empty"), "{err}");
    let err = refusal(&pt, &with_text("   "), &pt);
    assert!(err.contains("empty"), "{err}");
    write(&dir, "v.txt", b"\xff\xfe bad");
    let err = refusal(&pt, &ImportOptions::default(), &txt);
    assert!(err.contains("not UTF-8"), "{err}");

    for bad in ["../x", "a/b", ".hidden", ""] {
        let opts = ImportOptions {
            name: Some(bad.into()),
            transcript: Some("Words.".into()),
            ..ImportOptions::default()
        };
        let err = refusal(&pt, &opts, &pt);
        assert!(
            err.contains(&format!("invalid voice name {bad:?}")),
            "{err}"
        );
    }
    let spaced = write(&dir, "my voice.pt", &int_pt("m", &codes(10)));
    let err = refusal(&spaced, &with_text("Words."), &spaced);
    assert!(err.contains("--name"), "{err}");

    let err = refusal(
        &pt,
        &ImportOptions {
            language: Some("en-gb".into()),
            ..with_text("x")
        },
        &pt,
    );
    assert!(err.contains("unsupported language \"en-gb\""), "{err}");
    let err = refusal(&txt, &ImportOptions::default(), &txt);
    assert!(err.contains("this is a transcript"), "{err}");
    let wav = write(&dir, "v.wav", b"RIFF");
    let err = refusal(&wav, &ImportOptions::default(), &wav);
    assert!(err.contains("unknown voice file type"), "{err}");
    let json = write(&dir, "j.json", b"[1, 70000]");
    let err = refusal(&json, &with_text("x"), &json);
    assert!(err.contains("code 70000 at index 1"), "{err}");

    let missing = dir.join("nope.pt");
    refusal(&missing, &ImportOptions::default(), &missing);
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = refusal(&empty, &ImportOptions::default(), &empty);
    assert!(err.contains("no voices here"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Saving and removing.

#[test]
fn save_refuses_overwrite_and_remove_deletes() {
    let dir = common::tempdir("voices-save").join("voices");
    let v = Voice {
        name: "keep".into(),
        language: "en-us".into(),
        transcript: "One.".into(),
        codes: vec![1, 2, 3],
        source: "s".into(),
        license: "l".into(),
        custom: None,
    };
    let path = VoiceStore::save(&dir, &v, false).unwrap();
    assert_eq!(path, dir.join("keep.json"));

    let changed = Voice {
        transcript: "Two.".into(),
        ..v.clone()
    };
    let err = VoiceStore::save(&dir, &changed, false).unwrap_err();
    assert!(
        matches!(err, VoiceError::Exists(ref p) if *p == path),
        "{err}"
    );
    assert!(err.to_string().contains("keep.json") && err.to_string().contains("--force"));
    assert_eq!(onebit_tts::voice::read_voice(&path).unwrap(), v);

    VoiceStore::save(&dir, &changed, true).unwrap();
    assert_eq!(onebit_tts::voice::read_voice(&path).unwrap(), changed);
    // No temp files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers, ["keep.json"]);

    let bad = Voice {
        name: "../x".into(),
        ..v.clone()
    };
    assert!(matches!(
        VoiceStore::save(&dir, &bad, true),
        Err(VoiceError::BadName(_))
    ));
    let out_of_range = Voice {
        codes: vec![65_536],
        ..v.clone()
    };
    let err = VoiceStore::save(&dir, &out_of_range, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("keep.json") && err.contains("code 65536"),
        "{err}"
    );

    let err = VoiceStore::remove(&dir, "other").unwrap_err().to_string();
    assert!(
        err.contains("unknown voice \"other\"") && err.contains("keep"),
        "{err}"
    );
    assert!(matches!(
        VoiceStore::remove(&dir, "../keep"),
        Err(VoiceError::BadName(_))
    ));
    assert_eq!(VoiceStore::remove(&dir, "keep").unwrap(), path);
    assert!(!path.exists());
}

#[test]
fn budget_refuses_references_that_fill_the_context() {
    let v = Voice {
        name: "long".into(),
        language: "en-us".into(),
        transcript: "word ".repeat(60),
        codes: vec![7; 900],
        source: String::new(),
        license: String::new(),
        custom: None,
    };
    // One token per code, plus the transcript's tokens and the prompt frame.
    let front = tiny_front();
    let needed = front.reference_tokens(&v).unwrap();
    assert!(needed > 900 + 60, "{needed}");
    let shorter = Voice {
        codes: vec![7; 899],
        ..v.clone()
    };
    assert_eq!(front.reference_tokens(&shorter).unwrap(), needed - 1);
    let warn = check_budget(&v, needed, 2048).unwrap().unwrap();
    assert!(warn.contains("18.0 s"), "{warn}");
    assert!(check_budget(&v, needed, needed + 50).is_ok());
    let err = check_budget(&v, needed, needed + 49)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"long\"") && err.contains(&format!("takes {needed} prompt tokens")),
        "{err}"
    );
}

/// The test package's front end, for measuring references by their exact prompt.
fn tiny_front() -> onebit_tts::synth::FrontEnd {
    let pkg = onebit_tts::package::ModelPackage::load(&common::model("tiny"), None).unwrap();
    onebit_tts::synth::FrontEnd::new(pkg, VoiceStore::open(&[]).unwrap())
}
