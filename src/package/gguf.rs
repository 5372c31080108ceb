//! A GGUF backbone file, read far enough to validate it before llama.cpp sees it: the header, the
//! metadata (architecture, sizes, context length, the vocabulary and its special ids) and the
//! tensor table, with every tensor's extent checked against the file's length. llama.cpp's own
//! loader only logs why a file failed; reading the facts here lets `models check` and the engine
//! say which file, which key and what was expected, and compare the GGUF's vocabulary with the
//! tokenizer.json the front end builds prompts from (the prompt ids are ours, never llama.cpp's
//! tokenizer's, so both must give every speech id the same token).

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use super::genai::{DecoderSection, GenaiConfig, ModelSection, SearchSection, TokenIds};
use super::vocab::{SPEECH_CODES, SPEECH_GENERATION_END, SpeechVocab};

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Longer strings or arrays than any real GGUF holds mean a corrupt length, not a big model.
const MAX_STRING: u64 = 1 << 24;
const MAX_ARRAY: u64 = 1 << 26;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{}: cannot read: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{}: not a GGUF file (it starts with {magic:02x?}, a GGUF file with \"GGUF\")", .path.display())]
    NotGguf { path: PathBuf, magic: [u8; 4] },
    #[error("{}: GGUF version {version} (llama.cpp reads versions 2 and 3)", .path.display())]
    Version { path: PathBuf, version: u32 },
    #[error("{}: the file ends inside its {what}: truncated or not fully downloaded", .path.display())]
    Truncated { path: PathBuf, what: &'static str },
    #[error(
        "{}: truncated: tensor {tensor} ends at byte {end} but the file has {len} bytes (an interrupted download?)",
        .path.display()
    )]
    TruncatedData {
        path: PathBuf,
        tensor: String,
        end: u64,
        len: u64,
    },
    #[error("{}: {msg}", .path.display())]
    Invalid { path: PathBuf, msg: String },
}

/// A metadata value (arrays of strings and of numbers are what GGUF files hold).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }
}

/// One tensor's entry in the table.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// From the start of the data section.
    pub offset: u64,
}

/// Bytes per block and elements per block of the ggml types a GGUF backbone uses (ggml.c's
/// type_traits); `None` for a type this table does not know (its extent is then not checked).
fn block_layout(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (4, 1),     // F32
        1 => (2, 1),     // F16
        2 => (18, 32),   // Q4_0
        3 => (20, 32),   // Q4_1
        6 => (22, 32),   // Q5_0
        7 => (24, 32),   // Q5_1
        8 => (34, 32),   // Q8_0
        10 => (84, 256), // Q2_K
        11 => (110, 256),
        12 => (144, 256),
        13 => (176, 256),
        14 => (210, 256), // Q6_K
        30 => (2, 1),     // BF16
        _ => return None,
    })
}

/// What a GGUF backbone states about itself.
#[derive(Debug, Clone)]
pub struct GgufModel {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub file_len: u64,
    /// Where the tensor data starts (tensor offsets count from here).
    pub data_start: u64,
}

struct Reader<'a, R: Read> {
    inner: R,
    path: &'a Path,
}

impl<R: Read> Reader<'_, R> {
    fn bytes<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| self.io(e, what))?;
        Ok(b)
    }
    fn io(&self, e: std::io::Error, what: &'static str) -> GgufError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            GgufError::Truncated {
                path: self.path.to_path_buf(),
                what,
            }
        } else {
            GgufError::Io {
                path: self.path.to_path_buf(),
                err: e,
            }
        }
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes(what)?))
    }
    fn invalid(&self, msg: String) -> GgufError {
        GgufError::Invalid {
            path: self.path.to_path_buf(),
            msg,
        }
    }
    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        if n > MAX_STRING {
            return Err(self.invalid(format!("a string in the {what} claims {n} bytes")));
        }
        let mut b = vec![0u8; n as usize];
        self.inner
            .read_exact(&mut b)
            .map_err(|e| self.io(e, what))?;
        String::from_utf8(b)
            .map_err(|_| self.invalid(format!("a string in the {what} is not UTF-8")))
    }
    fn value(&mut self, ty: u32, depth: u8) -> Result<Value, GgufError> {
        const W: &str = "metadata";
        Ok(match ty {
            0 => Value::Int(i64::from(self.bytes::<1>(W)?[0])),
            1 => Value::Int(i64::from(self.bytes::<1>(W)?[0] as i8)),
            2 => Value::Int(i64::from(u16::from_le_bytes(self.bytes(W)?))),
            3 => Value::Int(i64::from(i16::from_le_bytes(self.bytes(W)?))),
            4 => Value::Int(i64::from(self.u32(W)?)),
            5 => Value::Int(i64::from(i32::from_le_bytes(self.bytes(W)?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.bytes(W)?))),
            7 => Value::Bool(self.bytes::<1>(W)?[0] != 0),
            8 => Value::Str(self.string(W)?),
            9 if depth == 0 => {
                let item = self.u32(W)?;
                let n = self.u64(W)?;
                if n > MAX_ARRAY {
                    return Err(self.invalid(format!("a metadata array claims {n} items")));
                }
                let mut v = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    v.push(self.value(item, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::Int(i64::from_le_bytes(self.bytes(W)?)), // u64 (ids and sizes fit)
            11 => Value::Int(i64::from_le_bytes(self.bytes(W)?)),
            12 => Value::Float(f64::from_le_bytes(self.bytes(W)?)),
            9 => return Err(self.invalid("a metadata array nested in an array".into())),
            _ => return Err(self.invalid(format!("unknown metadata value type {ty}"))),
        })
    }
}

impl GgufModel {
    /// Reads the header, metadata and tensor table of `path` (not the tensor data) and checks
    /// that every tensor of a known type lies inside the file.
    pub fn read(path: &Path) -> Result<Self, GgufError> {
        let io = |err| GgufError::Io {
            path: path.to_path_buf(),
            err,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut file = BufReader::new(file);
        let mut r = Reader {
            inner: &mut file,
            path,
        };
        let magic = r.bytes::<4>("header")?;
        if magic != MAGIC {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                magic,
            });
        }
        let version = r.u32("header")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = r.u64("header")?;
        let n_kv = r.u64("header")?;
        if n_tensors > MAX_ARRAY || n_kv > MAX_ARRAY {
            return Err(r.invalid(format!(
                "the header claims {n_tensors} tensors and {n_kv} metadata keys"
            )));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string("metadata")?;
            let ty = r.u32("metadata")?;
            let value = r.value(ty, 0)?;
            metadata.insert(key, value);
        }
        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 16) as usize);
        for _ in 0..n_tensors {
            let name = r.string("tensor table")?;
            let n_dims = r.u32("tensor table")?;
            if n_dims > 4 {
                return Err(r.invalid(format!("tensor {name} has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(r.u64("tensor table")?);
            }
            let ggml_type = r.u32("tensor table")?;
            let offset = r.u64("tensor table")?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_ALIGNMENT)
            .max(1);
        // BufReader's position counts what was read, not what it buffered ahead.
        let read = file.stream_position().map_err(io)?;
        let data_start = read.div_ceil(alignment) * alignment;
        let model = Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            file_len,
            data_start,
        };
        for t in &model.tensors {
            let Some((block_bytes, block_elems)) = block_layout(t.ggml_type) else {
                continue;
            };
            let elems = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            let end = elems
                .and_then(|e| e.div_ceil(block_elems).checked_mul(block_bytes))
                .and_then(|size| data_start.checked_add(t.offset)?.checked_add(size));
            match end {
                Some(end) if end <= file_len => {}
                Some(end) => {
                    return Err(GgufError::TruncatedData {
                        path: path.to_path_buf(),
                        tensor: t.name.clone(),
                        end,
                        len: file_len,
                    });
                }
                None => {
                    return Err(model.invalid(format!("tensor {} has an impossible size", t.name)));
                }
            }
        }
        Ok(model)
    }

    fn invalid(&self, msg: String) -> GgufError {
        GgufError::Invalid {
            path: self.path.clone(),
            msg,
        }
    }

    pub fn architecture(&self) -> Result<&str, GgufError> {
        match self.metadata.get("general.architecture") {
            Some(Value::Str(s)) => Ok(s),
            _ => Err(self.invalid("no general.architecture".into())),
        }
    }

    /// An integer `{architecture}.{key}` (context_length, block_count, ...).
    pub fn arch_u64(&self, key: &str) -> Result<u64, GgufError> {
        let full = format!("{}.{key}", self.architecture()?);
        self.metadata
            .get(&full)
            .and_then(Value::as_u64)
            .ok_or_else(|| self.invalid(format!("no integer {full}")))
    }

    /// A number `{architecture}.{key}` (rms epsilon, rope base), float or integer as written.
    pub fn arch_f64(&self, key: &str) -> Option<f64> {
        let full = format!("{}.{key}", self.architecture().ok()?);
        match self.metadata.get(&full)? {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// A string `{architecture}.{key}`.
    pub fn arch_str(&self, key: &str) -> Option<&str> {
        let full = format!("{}.{key}", self.architecture().ok()?);
        match self.metadata.get(&full)? {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes of tensor `t`'s data (`len` of them, as its type and shape give), read from the
    /// file.
    pub fn tensor_bytes(&self, t: &TensorInfo, len: usize) -> Result<Vec<u8>, GgufError> {
        use std::os::unix::fs::FileExt;
        let io = |err| GgufError::Io {
            path: self.path.clone(),
            err,
        };
        let file = std::fs::File::open(&self.path).map_err(io)?;
        let mut buf = vec![0u8; len];
        file.read_exact_at(&mut buf, self.data_start + t.offset)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    GgufError::TruncatedData {
                        path: self.path.clone(),
                        tensor: t.name.clone(),
                        end: self.data_start + t.offset + len as u64,
                        len: self.file_len,
                    }
                } else {
                    io(e)
                }
            })?;
        Ok(buf)
    }

    /// `tokenizer.ggml.tokens`: the text of every id.
    pub fn tokens(&self) -> Result<Vec<&str>, GgufError> {
        let Some(Value::Array(items)) = self.metadata.get("tokenizer.ggml.tokens") else {
            return Err(self.invalid(
                "no tokenizer.ggml.tokens: the GGUF has no vocabulary to check the speech ids against"
                    .into(),
            ));
        };
        items
            .iter()
            .map(|v| match v {
                Value::Str(s) => Ok(s.as_str()),
                _ => Err(self.invalid("tokenizer.ggml.tokens holds a non-string".into())),
            })
            .collect()
    }

    /// The eos id the GGUF names, if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.metadata
            .get("tokenizer.ggml.eos_token_id")
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    }

    /// How many logits a step gives: the output tensor's rows (the vocabulary the model was
    /// trained with, which may be padded past the tokenizer's last id).
    pub fn n_vocab(&self) -> Result<u64, GgufError> {
        let out = self
            .tensors
            .iter()
            .find(|t| t.name == "output.weight")
            .or_else(|| self.tensors.iter().find(|t| t.name == "token_embd.weight"))
            .ok_or_else(|| self.invalid("no output.weight or token_embd.weight tensor".into()))?;
        out.dims
            .get(1)
            .copied()
            .ok_or_else(|| self.invalid(format!("{} is not 2-D", out.name)))
    }

    /// Checks the GGUF's vocabulary against the tokenizer's speech block: every `<|speech_N|>`
    /// and the end token at the same id, and logits for all of them.
    pub fn check_speech_vocab(&self, vocab: &SpeechVocab) -> Result<(), GgufError> {
        let tokens = self.tokens()?;
        let n_vocab = self.n_vocab()?;
        let end_exclusive = vocab.speech_end_exclusive();
        if (end_exclusive as u64) > n_vocab || (vocab.end as u64) >= n_vocab {
            return Err(self.invalid(format!(
                "the model gives {n_vocab} logits but the tokenizer's speech ids run to {} (end {}): wrong vocabulary",
                end_exclusive - 1,
                vocab.end
            )));
        }
        if tokens.len() as u64 != n_vocab {
            return Err(self.invalid(format!(
                "tokenizer.ggml.tokens has {} entries but the output layer {n_vocab} rows",
                tokens.len()
            )));
        }
        let text_of = |id: u32| tokens.get(id as usize).copied();
        // The prompt's control tokens too: our front end feeds tokenizer.json's ids for them.
        for (id, want) in [
            (
                vocab.generation_start,
                super::vocab::SPEECH_GENERATION_START,
            ),
            (vocab.text_prompt_start, super::vocab::TEXT_PROMPT_START),
            (vocab.text_prompt_end, super::vocab::TEXT_PROMPT_END),
        ] {
            if text_of(id) != Some(want) {
                return Err(self.invalid(format!(
                    "id {id} is {want} in tokenizer.json but {} in the GGUF's vocabulary: the GGUF and the tokenizer do not belong together",
                    text_of(id).map_or_else(|| "missing".to_owned(), |t| format!("{t:?}"))
                )));
            }
        }
        let end = text_of(vocab.end);
        if end != Some(SPEECH_GENERATION_END) {
            return Err(self.invalid(format!(
                "id {} is {} in the GGUF's vocabulary but {SPEECH_GENERATION_END} in tokenizer.json: the GGUF and the tokenizer do not belong together",
                vocab.end,
                end.map_or_else(|| "missing".to_owned(), |t| format!("{t:?}")),
            )));
        }
        for code in 0..SPEECH_CODES {
            let id = vocab.first + code;
            let want = format!("<|speech_{code}|>");
            let found = text_of(id);
            if found != Some(want.as_str()) {
                return Err(self.invalid(format!(
                    "id {id} should be {want} (as in tokenizer.json) but the GGUF's vocabulary has {}: missing speech tokens",
                    found.map_or_else(|| "no such id".to_owned(), |t| format!("{t:?}")),
                )));
            }
        }
        Ok(())
    }
}

/// Tokens one sequence may hold on a GGUF backbone unless the file allows fewer: the vendor's
/// neutts runs its GGUF builds with a context of 2048, and llama.cpp allocates the KV cache for the
/// whole context of every sequence up front.
pub const GGUF_SEQUENCE_BUDGET: usize = 2048;

impl GgufModel {
    /// The model facts the other stages read (sizes, vocabulary width, budget, eos), as the GGUF
    /// states them, in the shape an ONNX package's genai_config.json gives them.
    pub fn model_facts(&self) -> Result<GenaiConfig, GgufError> {
        let arch = self.architecture()?.to_owned();
        let get = |key: &str| -> Result<usize, GgufError> {
            usize::try_from(self.arch_u64(key)?)
                .map_err(|_| self.invalid(format!("{arch}.{key} does not fit")))
        };
        let hidden = get("embedding_length")?;
        let heads = get("attention.head_count")?;
        let kv_heads = get("attention.head_count_kv").unwrap_or(heads);
        let head_size = get("attention.key_length").unwrap_or(hidden / heads.max(1));
        let layers = get("block_count")?;
        let context_length = get("context_length")?;
        let vocab_size = usize::try_from(self.n_vocab()?)
            .map_err(|_| self.invalid("the vocabulary size does not fit".into()))?;
        if heads == 0 || layers == 0 || context_length == 0 {
            return Err(self.invalid(format!(
                "{arch}: {layers} layers, {heads} heads, context {context_length}: not a usable model"
            )));
        }
        let config = GenaiConfig {
            model: ModelSection {
                model_type: arch,
                context_length,
                vocab_size,
                bos_token_id: None,
                eos_token_id: self.eos_id().map_or(TokenIds::None, TokenIds::One),
                pad_token_id: None,
                decoder: DecoderSection {
                    filename: self
                        .path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    session_options: Default::default(),
                    head_size,
                    hidden_size: hidden,
                    num_attention_heads: heads,
                    num_hidden_layers: layers,
                    num_key_value_heads: kv_heads,
                    inputs: Default::default(),
                    outputs: Default::default(),
                },
            },
            search: SearchSection {
                max_length: Some(GGUF_SEQUENCE_BUDGET),
                ..Default::default()
            },
        };
        config.validate().map_err(|m| self.invalid(m))?;
        Ok(config)
    }
}

/// The GGUF backbone of a package directory: its one `*.gguf` file (several: an error naming
/// them, since which one was meant cannot be guessed).
pub fn find_in(dir: &Path) -> Result<Option<PathBuf>, String> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list: {e}"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(format!(
            "{} GGUF files ({}); a package holds one backbone: move the others out",
            found.len(),
            found
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes a GGUF the way gguf-py does: header, metadata, tensor table, aligned data.
    pub(crate) struct Writer {
        kv: Vec<(String, Vec<u8>)>,
        tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    }

    fn s(out: &mut Vec<u8>, text: &str) {
        out.extend((text.len() as u64).to_le_bytes());
        out.extend(text.as_bytes());
    }

    impl Writer {
        pub(crate) fn new() -> Self {
            Self {
                kv: Vec::new(),
                tensors: Vec::new(),
            }
        }
        pub(crate) fn string(&mut self, key: &str, v: &str) -> &mut Self {
            let mut b = 8u32.to_le_bytes().to_vec();
            s(&mut b, v);
            self.kv.push((key.into(), b));
            self
        }
        pub(crate) fn u32(&mut self, key: &str, v: u32) -> &mut Self {
            let mut b = 4u32.to_le_bytes().to_vec();
            b.extend(v.to_le_bytes());
            self.kv.push((key.into(), b));
            self
        }
        pub(crate) fn strings(&mut self, key: &str, items: &[String]) -> &mut Self {
            let mut b = 9u32.to_le_bytes().to_vec();
            b.extend(8u32.to_le_bytes());
            b.extend((items.len() as u64).to_le_bytes());
            for i in items {
                s(&mut b, i);
            }
            self.kv.push((key.into(), b));
            self
        }
        pub(crate) fn f32_tensor(&mut self, name: &str, dims: &[u64]) -> &mut Self {
            let n: u64 = dims.iter().product();
            self.tensors
                .push((name.into(), dims.to_vec(), 0, vec![0u8; (n * 4) as usize]));
            self
        }
        pub(crate) fn bytes(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(3u32.to_le_bytes());
            out.extend((self.tensors.len() as u64).to_le_bytes());
            out.extend((self.kv.len() as u64).to_le_bytes());
            for (k, v) in &self.kv {
                s(&mut out, k);
                out.extend(v);
            }
            let mut offset = 0u64;
            for (name, dims, ty, data) in &self.tensors {
                s(&mut out, name);
                out.extend((dims.len() as u32).to_le_bytes());
                for d in dims {
                    out.extend(d.to_le_bytes());
                }
                out.extend(ty.to_le_bytes());
                out.extend(offset.to_le_bytes());
                offset += (data.len() as u64).div_ceil(32) * 32;
            }
            out.resize(out.len().div_ceil(32) * 32, 0);
            for (_, _, _, data) in &self.tensors {
                let start = out.len();
                out.extend(data);
                out.resize(start + data.len().div_ceil(32) * 32, 0);
            }
            out
        }
    }

    fn vocab() -> SpeechVocab {
        SpeechVocab {
            first: 10,
            end: 9,
            generation_start: 8,
            text_prompt_start: 6,
            text_prompt_end: 7,
        }
    }

    /// A vocabulary with the speech block of [`vocab`] (ids 10..10+65536, end 9).
    fn tokens() -> Vec<String> {
        let mut t: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
        t.push(super::super::vocab::TEXT_PROMPT_START.into());
        t.push(super::super::vocab::TEXT_PROMPT_END.into());
        t.push(super::super::vocab::SPEECH_GENERATION_START.into());
        t.push(SPEECH_GENERATION_END.into());
        t.extend((0..SPEECH_CODES).map(|c| format!("<|speech_{c}|>")));
        t
    }

    fn model(tokens: &[String]) -> Writer {
        let mut w = Writer::new();
        w.string("general.architecture", "qwen2")
            .u32("qwen2.context_length", 4096)
            .u32("qwen2.block_count", 2)
            .u32("qwen2.embedding_length", 4)
            .u32("qwen2.attention.head_count", 2)
            .u32("qwen2.attention.head_count_kv", 1)
            .strings("tokenizer.ggml.tokens", tokens)
            .u32("tokenizer.ggml.eos_token_id", 9)
            .f32_tensor("token_embd.weight", &[4, tokens.len() as u64])
            .f32_tensor("output_norm.weight", &[4]);
        w
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn reads_what_gguf_py_writes_and_checks_the_speech_block() {
        let dir = crate::testutil::tempdir("gguf-ok");
        let p = write(&dir, "m.gguf", &model(&tokens()).bytes());
        let m = GgufModel::read(&p).unwrap();
        assert_eq!(m.architecture().unwrap(), "qwen2");
        assert_eq!(m.arch_u64("context_length").unwrap(), 4096);
        assert_eq!(m.eos_id(), Some(9));
        assert_eq!(m.n_vocab().unwrap(), 10 + 65_536);
        m.check_speech_vocab(&vocab()).unwrap();
        assert_eq!(find_in(&dir).unwrap(), Some(p));
        let facts = m.model_facts().unwrap();
        let d = &facts.model.decoder;
        assert_eq!(
            (
                d.num_hidden_layers,
                d.hidden_size,
                d.num_attention_heads,
                d.num_key_value_heads,
                d.head_size
            ),
            (2, 4, 2, 1, 2)
        );
        assert_eq!(facts.model.vocab_size, 10 + 65_536);
        assert_eq!(facts.model.eos_token_id.to_vec(), vec![9]);
        assert_eq!(facts.token_budget(), GGUF_SEQUENCE_BUDGET);
    }

    #[test]
    fn a_package_with_two_ggufs_names_them() {
        let dir = crate::testutil::tempdir("gguf-two");
        write(&dir, "a.gguf", b"GGUF");
        write(&dir, "b.GGUF", b"GGUF");
        let err = find_in(&dir).unwrap_err();
        assert_eq!(
            err,
            "2 GGUF files (a.gguf, b.GGUF); a package holds one backbone: move the others out"
        );
    }

    #[test]
    fn a_truncated_file_names_the_tensor_that_is_cut() {
        let dir = crate::testutil::tempdir("gguf-cut");
        let bytes = model(&tokens()).bytes();
        let p = write(&dir, "m.gguf", &bytes[..bytes.len() - 40]);
        let err = GgufModel::read(&p).unwrap_err().to_string();
        assert!(
            err.contains("truncated: tensor token_embd.weight ends at byte"),
            "{err}"
        );
        let p = write(&dir, "m.gguf", &bytes[..100]);
        let err = GgufModel::read(&p).unwrap_err().to_string();
        assert!(err.contains("the file ends inside its metadata"), "{err}");
        let p = write(&dir, "m.gguf", b"PK\x03\x04 not a gguf");
        let err = GgufModel::read(&p).unwrap_err().to_string();
        assert!(err.contains("not a GGUF file"), "{err}");
    }

    #[test]
    fn a_vocabulary_without_the_speech_tokens_is_refused() {
        let dir = crate::testutil::tempdir("gguf-vocab");
        let mut t = tokens();
        t[10 + 1234] = "<|speech_oops|>".into();
        let m = GgufModel::read(&write(&dir, "a.gguf", &model(&t).bytes())).unwrap();
        let err = m.check_speech_vocab(&vocab()).unwrap_err().to_string();
        assert!(
            err.contains("id 1244 should be <|speech_1234|>")
                && err.contains("\"<|speech_oops|>\""),
            "{err}"
        );
        // A plain Qwen2 vocabulary: too few ids for the speech block.
        let plain: Vec<String> = (0..1000).map(|i| format!("t{i}")).collect();
        let m = GgufModel::read(&write(&dir, "b.gguf", &model(&plain).bytes())).unwrap();
        let err = m.check_speech_vocab(&vocab()).unwrap_err().to_string();
        assert!(
            err.contains("gives 1000 logits") && err.contains("wrong vocabulary"),
            "{err}"
        );
        // The end token at another id.
        let mut t = tokens();
        t[9] = "<|im_end|>".into();
        let m = GgufModel::read(&write(&dir, "c.gguf", &model(&t).bytes())).unwrap();
        let err = m.check_speech_vocab(&vocab()).unwrap_err().to_string();
        assert!(err.contains("id 9 is \"<|im_end|>\""), "{err}");
    }
}
