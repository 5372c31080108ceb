//! `onebit-tts models convert`: a GGUF package (the vendor's Q4/Q8 builds, or what llama.cpp's
//! converter and quantizer make) becomes an ONNX package our `--engine ort` runs, with no torch:
//! the decoder graph in the layout onnxruntime-genai's builder writes for a CPU int4 export
//! (GroupQueryAttention with its rotary caches, SimplifiedLayerNormalization, MatMulNBits), with
//! the speech-only, last-position head `models optimize` gives.
//!
//! Weights keep their bits where the GGUF type allows it ([`super::ggml`]): Q4_0 and Q8_0 become
//! MatMulNBits blocks of 32 (4 and 8 bits), F32/F16/BF16 float MatMuls; the embedding table stays
//! quantised (GatherBlockQuantized) when it is Q4_0 or Q8_0. Other types (the K-quants of
//! llama.cpp's mixes, Q4_1, Q5_0, Q5_1) are dequantised as ggml does and quantised again, 4-bit
//! asymmetric for 4-bit sources and 8-bit otherwise; the report names each such tensor with the
//! largest change of a weight.
//!
//! llama.cpp's converter reorders the rows of a llama model's q and k projections for its
//! interleaved rotary form; they are put back in the checkpoint's order here, so every
//! architecture runs with the builder's rotary (`rotary_interleaved` 0). The rotary caches are
//! computed as llama.cpp's rope does: base `rope.freq_base`, per-dimension `rope_freqs` factors,
//! linear position scaling.
//!
//! The package is written beside `OUT` and renamed into place when complete and loaded back, so a
//! failed or interrupted run leaves nothing under the final name.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_proto::DataType;
use onnx_protobuf::tensor_shape_proto::{Dimension, dimension};
use onnx_protobuf::type_proto;
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use protobuf::{EnumOrUnknown, MessageField};

use super::ggml::{self, BLOCK, Blocks, GgmlType};
use super::gguf::{GgufError, GgufModel, TensorInfo};
use super::logits::{LOGITS_MANIFEST, LogitsManifest, SpeechHead};
use super::optimize::{LAST_POSITION_INDEX, LAST_POSITION_NODE, TensorWriter};
use super::{BackboneFormat, ModelPackage, PackageError, SPEECH_CODES};

/// What `models convert` writes beside the package: the source and what was requantised.
pub const CONVERTED: &str = "convert.json";
use super::CONVERTED_DIR;
const DECODER: &str = "model.onnx";
const DATA: &str = "model.onnx.data";
/// The builder's accuracy level for CPU int4 exports: int8 activations per block.
const ACCURACY_LEVEL: i64 = 4;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{}: {msg}; nothing was written", .path.display())]
    Unsupported { path: PathBuf, msg: String },
    #[error("{}: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error(transparent)]
    Install(#[from] super::install::InstallError),
    #[error("{0}")]
    Usage(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ConvertError + '_ {
    move |err| ConvertError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// The head's weights: as the GGUF has them (exact), or requantised to 4 bits (fewer bytes read
/// per step when the GGUF's head is Q8_0, as llama.cpp's quantizer writes it by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadBits {
    #[default]
    AsStored,
    Int4,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct ConvertOptions {
    pub head: HeadBits,
}

/// A tensor whose GGUF type had no exact ONNX form.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Requantised {
    pub tensor: String,
    pub from: &'static str,
    pub bits: u8,
    /// The largest |new - old| over the tensor's weights.
    pub max_error: f32,
    /// The largest |old| weight, for scale.
    pub max_weight: f32,
}

/// What [`convert`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvertReport {
    pub source: PathBuf,
    pub dir: PathBuf,
    pub architecture: String,
    pub layers: usize,
    /// ggml type -> tensors kept bit for bit.
    pub exact: BTreeMap<&'static str, usize>,
    pub requantised: Vec<Requantised>,
    pub embedding: String,
    pub head: String,
    pub bytes: u64,
}

impl ConvertReport {
    pub fn summary(&self) -> String {
        let exact: Vec<String> = self.exact.iter().map(|(t, n)| format!("{n} {t}")).collect();
        let mut s = format!(
            "converted    {} ({}, {} layers) -> {}\nexact        {}\nembedding    {}\nhead         {}\n",
            self.source.display(),
            self.architecture,
            self.layers,
            self.dir.display(),
            if exact.is_empty() {
                "none".to_owned()
            } else {
                exact.join(", ")
            },
            self.embedding,
            self.head
        );
        if self.requantised.is_empty() {
            s += "requantised  none: every weight as the GGUF stores it\n";
        } else {
            let worst = self
                .requantised
                .iter()
                .max_by(|a, b| a.max_error.total_cmp(&b.max_error))
                .expect("not empty");
            s += &format!(
                "requantised  {} tensor{}; largest weight error {:.3e} ({}, {} -> {}-bit, weights up to {:.3e})\n",
                self.requantised.len(),
                if self.requantised.len() == 1 { "" } else { "s" },
                worst.max_error,
                worst.tensor,
                worst.from,
                worst.bits,
                worst.max_weight
            );
            for r in &self.requantised {
                s += &format!(
                    "             {} {} -> {}-bit, max error {:.3e}\n",
                    r.tensor, r.from, r.bits, r.max_error
                );
            }
        }
        s += &format!("size         {:.1} MiB", self.bytes as f64 / 1048576.0);
        s
    }
}

/// The backbone architectures this converter builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    /// NeuTTS-air: q/k/v biases, untied head.
    Qwen2,
    /// NeuTTS-nano: no biases, tied embeddings, q/k rows in llama.cpp's rotary order.
    Llama,
    /// NeuTTS-2E: per-head q/k RMS norms, no biases.
    Qwen3,
}

impl Arch {
    fn of(name: &str) -> Option<Self> {
        Some(match name {
            "qwen2" => Self::Qwen2,
            "llama" => Self::Llama,
            "qwen3" => Self::Qwen3,
            _ => return None,
        })
    }
}

/// The model's sizes as the GGUF states them.
#[derive(Debug, Clone)]
struct Shape {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_size: usize,
    layers: usize,
    context: usize,
    eps: f32,
}

/// A projection's weights in their ONNX form.
enum Linear {
    Blocks(Blocks),
    /// Row-major `[rows, k]` float32.
    Float {
        rows: usize,
        k: usize,
        w: Vec<f32>,
    },
}

impl Linear {
    fn rows(&self) -> usize {
        match self {
            Linear::Blocks(b) => b.rows,
            Linear::Float { rows, .. } => *rows,
        }
    }

    /// `parts` stacked row-wise, when they share one form (packed q/k/v).
    fn stack(parts: Vec<Linear>) -> Result<Linear, Vec<Linear>> {
        let same = parts.windows(2).all(|w| match (&w[0], &w[1]) {
            (Linear::Blocks(a), Linear::Blocks(b)) => {
                a.bits == b.bits && a.k == b.k && a.zero_points.is_some() == b.zero_points.is_some()
            }
            (Linear::Float { k: a, .. }, Linear::Float { k: b, .. }) => a == b,
            _ => false,
        });
        if !same {
            return Err(parts);
        }
        let mut it = parts.into_iter();
        let mut first = it.next().expect("three parts");
        for p in it {
            match (&mut first, p) {
                (Linear::Blocks(a), Linear::Blocks(b)) => a.append(b),
                (Linear::Float { rows, w, .. }, Linear::Float { rows: r, w: v, .. }) => {
                    *rows += r;
                    w.extend(v);
                }
                _ => unreachable!("checked above"),
            }
        }
        Ok(first)
    }
}

/// Reads tensors of one GGUF and turns them into their ONNX forms, keeping count of what stayed
/// exact and what was requantised.
struct Source<'a> {
    gguf: &'a GgufModel,
    exact: BTreeMap<&'static str, usize>,
    requantised: Vec<Requantised>,
}

impl Source<'_> {
    fn unsupported(&self, msg: String) -> ConvertError {
        ConvertError::Unsupported {
            path: self.gguf.path.clone(),
            msg,
        }
    }

    fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.gguf.tensors.iter().find(|t| t.name == name)
    }

    /// The tensor's type, its (k, rows) shape checked against what the architecture needs, and
    /// its raw bytes.
    fn raw(&self, name: &str, k: usize, rows: usize) -> Result<(GgmlType, Vec<u8>), ConvertError> {
        let t = self
            .info(name)
            .ok_or_else(|| self.unsupported(format!("no tensor {name}")))?;
        let ty = GgmlType::from_id(t.ggml_type).ok_or_else(|| {
            self.unsupported(format!(
                "tensor {name} is {}, a type models convert does not read (it reads F32, F16, \
                 BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                GgmlType::name_of(t.ggml_type)
            ))
        })?;
        if k == 0 || rows == 0 {
            return Err(self.unsupported(format!(
                "tensor {name} would have no weights ({k} x {rows})"
            )));
        }
        let want: Vec<u64> = if rows == 1 {
            vec![k as u64]
        } else {
            vec![k as u64, rows as u64]
        };
        if t.dims != want {
            return Err(self.unsupported(format!(
                "tensor {name} has shape {:?}, the model's sizes need {want:?}",
                t.dims
            )));
        }
        if !k.is_multiple_of(ty.block().1) {
            return Err(self.unsupported(format!(
                "tensor {name} ({}) has rows of {k}, not whole blocks",
                ty.name()
            )));
        }
        let bytes = self.gguf.tensor_bytes(t, ty.row_bytes(k) * rows)?;
        Ok((ty, bytes))
    }

    /// A 1-D float tensor (norm weights, biases).
    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>, ConvertError> {
        let (ty, raw) = self.raw(name, len, 1)?;
        if !ty.is_float() {
            return Err(self.unsupported(format!(
                "tensor {name} is {}, a vector models convert reads as F32, F16 or BF16",
                ty.name()
            )));
        }
        let mut out = vec![0f32; len];
        ggml::dequantize_row(ty, &raw, &mut out);
        *self.exact.entry(ty.name()).or_default() += 1;
        Ok(out)
    }

    /// A `[rows, k]` weight (GGUF dims `[k, rows]`), the rows `pick` lists (all when `None`),
    /// in its ONNX form; `bits` forces requantisation to that width.
    fn linear(
        &mut self,
        name: &str,
        k: usize,
        rows: usize,
        pick: Option<&[usize]>,
        bits: Option<u8>,
    ) -> Result<Linear, ConvertError> {
        let (ty, raw) = self.raw(name, k, rows)?;
        let row_bytes = ty.row_bytes(k);
        let raw = match pick {
            Some(p) => {
                let mut out = Vec::with_capacity(p.len() * row_bytes);
                for &r in p {
                    out.extend_from_slice(&raw[r * row_bytes..(r + 1) * row_bytes]);
                }
                out
            }
            None => raw,
        };
        let n = raw.len() / row_bytes;
        let stored_bits = match ty {
            GgmlType::Q4_0 => Some(4),
            GgmlType::Q8_0 => Some(8),
            _ => None,
        };
        if (bits.is_none() || bits == stored_bits)
            && let Some(b) = ggml::repack(ty, &raw, k)
        {
            *self.exact.entry(ty.name()).or_default() += 1;
            return Ok(Linear::Blocks(b));
        }
        // One row at a time through float32, so a large table never exists dequantised whole.
        let mut row = vec![0f32; k];
        if ty.is_float() && bits.is_none() {
            let mut w = Vec::with_capacity(n * k);
            for r in raw.chunks_exact(row_bytes) {
                ggml::dequantize_row(ty, r, &mut row);
                w.extend_from_slice(&row);
            }
            *self.exact.entry(ty.name()).or_default() += 1;
            return Ok(Linear::Float { rows: n, k, w });
        }
        if !k.is_multiple_of(BLOCK) {
            return Err(self.unsupported(format!(
                "tensor {name} ({}) has rows of {k}: requantising needs whole blocks of {BLOCK}",
                ty.name()
            )));
        }
        // 8 bits unless asked: a second 4-bit grid over a 4-bit K-quant doubles its rounding
        // (measured: logits moved by most of their scale on the test checkpoint), while 8-bit
        // blocks move each weight by at most half of amax/127 of its block (the report gives
        // the measured largest change).
        let bits = bits.unwrap_or(8);
        let mut out: Option<Blocks> = None;
        let (mut max_error, mut max_weight) = (0f32, 0f32);
        for r in raw.chunks_exact(row_bytes) {
            ggml::dequantize_row(ty, r, &mut row);
            let q = ggml::quantize(&row, k, bits);
            for (i, &x) in row.iter().enumerate() {
                max_error = max_error.max((q.value(0, i) - x).abs());
                max_weight = max_weight.max(x.abs());
            }
            match out.as_mut() {
                None => out = Some(q),
                Some(o) => o.append(q),
            }
        }
        self.requantised.push(Requantised {
            tensor: name.to_owned(),
            from: ty.name(),
            bits,
            max_error,
            max_weight,
        });
        out.map(Linear::Blocks)
            .ok_or_else(|| self.unsupported(format!("tensor {name} has no rows")))
    }
}

/// llama.cpp's converter reorders each head's q/k rows (`LlamaModel.permute`): checkpoint row
/// `half * hd/2 + i` is GGUF row `2i + half`. The GGUF rows in the checkpoint's order.
fn unpermute_rows(heads: usize, head_size: usize) -> Vec<usize> {
    let half = head_size / 2;
    (0..heads)
        .flat_map(|h| {
            (0..2).flat_map(move |side| (0..half).map(move |i| h * head_size + 2 * i + side))
        })
        .collect()
}

/// The decoder graph under construction; tensors over a few KiB go to the external data file.
struct Graph {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    writer: TensorWriter,
    path: PathBuf,
}

fn attr_i(name: &str, v: i64) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = EnumOrUnknown::new(AttributeType::INT);
    a.i = v;
    a
}

fn attr_f(name: &str, v: f32) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.into();
    a.type_ = EnumOrUnknown::new(AttributeType::FLOAT);
    a.f = v;
    a
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Graph {
    fn node(
        &mut self,
        op: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> String {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.name = name.into();
        if matches!(
            op,
            "MatMulNBits"
                | "GatherBlockQuantized"
                | "GroupQueryAttention"
                | "SkipSimplifiedLayerNormalization"
        ) {
            n.domain = "com.microsoft".into();
        }
        n.input = inputs.iter().map(|s| s.to_string()).collect();
        n.output = outputs.iter().map(|s| s.to_string()).collect();
        n.attribute = attrs;
        self.nodes.push(n);
        outputs[0].to_owned()
    }

    fn init(
        &mut self,
        name: &str,
        ty: DataType,
        dims: &[usize],
        data: Vec<u8>,
    ) -> Result<String, ConvertError> {
        let mut t = TensorProto::new();
        t.name = name.into();
        t.data_type = ty as i32;
        t.dims = dims.iter().map(|&d| d as i64).collect();
        let external = data.len() > 4096;
        self.writer
            .store(&mut t, data, external)
            .map_err(|msg| ConvertError::Io {
                path: self.path.clone(),
                err: std::io::Error::other(msg),
            })?;
        self.inits.push(t);
        Ok(name.to_owned())
    }

    fn init_f32(&mut self, name: &str, dims: &[usize], v: &[f32]) -> Result<String, ConvertError> {
        self.init(name, DataType::FLOAT, dims, f32_bytes(v))
    }

    fn init_i64(&mut self, name: &str, v: &[i64]) -> Result<String, ConvertError> {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.init(name, DataType::INT64, &[v.len()], bytes)
    }

    /// `out = input x W^T`: MatMulNBits for blocks, MatMul for floats.
    fn linear(
        &mut self,
        node: &str,
        weight: &str,
        input: &str,
        w: Linear,
        out: &str,
    ) -> Result<String, ConvertError> {
        match w {
            Linear::Blocks(b) => {
                let nb = b.blocks_per_row();
                let (n, k, bits) = (b.rows, b.k, b.bits);
                let q = self.init(
                    &format!("{weight}.MatMul.weight_Q{bits}"),
                    DataType::UINT8,
                    &[n, nb, b.block_bytes()],
                    b.data,
                )?;
                let s = self.init_f32(
                    &format!("{weight}.MatMul.weight_scales"),
                    &[n, nb],
                    &b.scales,
                )?;
                let mut inputs = vec![input.to_owned(), q, s];
                if let Some(z) = b.zero_points {
                    let per_row = z.len() / n;
                    inputs.push(self.init(
                        &format!("{weight}.MatMul.weight_zp"),
                        DataType::UINT8,
                        &[n, per_row],
                        z,
                    )?);
                }
                let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
                Ok(self.node(
                    "MatMulNBits",
                    &format!("{node}/MatMul_Q{bits}"),
                    &inputs,
                    &[out],
                    vec![
                        attr_i("K", k as i64),
                        attr_i("N", n as i64),
                        attr_i("accuracy_level", ACCURACY_LEVEL),
                        attr_i("bits", bits as i64),
                        attr_i("block_size", BLOCK as i64),
                    ],
                ))
            }
            Linear::Float { rows, k, w } => {
                // MatMul's B is [k, rows]: the GGUF's rows transposed.
                let mut t = vec![0f32; rows * k];
                for r in 0..rows {
                    for c in 0..k {
                        t[c * rows + r] = w[r * k + c];
                    }
                }
                let b = self.init_f32(&format!("{weight}.MatMul.weight"), &[k, rows], &t)?;
                Ok(self.node(
                    "MatMul",
                    &format!("{node}/MatMul"),
                    &[input, &b],
                    &[out],
                    vec![],
                ))
            }
        }
    }
}

fn value_info(name: &str, ty: DataType, dims: &[Result<i64, &str>]) -> ValueInfoProto {
    let mut shape = TensorShapeProto::new();
    shape.dim = dims
        .iter()
        .map(|d| {
            let mut dim = Dimension::new();
            dim.value = Some(match d {
                Ok(v) => dimension::Value::DimValue(*v),
                Err(p) => dimension::Value::DimParam(p.to_string()),
            });
            dim
        })
        .collect();
    let mut tensor = type_proto::Tensor::new();
    tensor.elem_type = ty as i32;
    tensor.shape = MessageField::some(shape);
    let mut tp = TypeProto::new();
    tp.value = Some(type_proto::Value::TensorType(tensor));
    let mut v = ValueInfoProto::new();
    v.name = name.into();
    v.type_ = MessageField::some(tp);
    v
}

/// `[context, head_size / 2]` cos and sin of llama.cpp's rope angles: position `p` (times the
/// linear scale) times `base^(-2i / head_size)` divided by `rope_freqs[i]` when the GGUF has
/// those factors; computed in float64, stored as float32.
fn rotary_caches(
    context: usize,
    head_size: usize,
    base: f64,
    position_scale: f64,
    factors: Option<&[f32]>,
) -> (Vec<f32>, Vec<f32>) {
    let half = head_size / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| {
            let f = base.powf(-2.0 * i as f64 / head_size as f64);
            f / factors.map_or(1.0, |ff| ff[i] as f64)
        })
        .collect();
    let (mut cos, mut sin) = (
        Vec::with_capacity(context * half),
        Vec::with_capacity(context * half),
    );
    for p in 0..context {
        for &f in &inv {
            let a = p as f64 * position_scale * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

fn shape_of(gguf: &GgufModel, src: &Source<'_>) -> Result<Shape, ConvertError> {
    let facts = gguf.model_facts()?;
    let d = &facts.model.decoder;
    let eps = gguf
        .arch_f64("attention.layer_norm_rms_epsilon")
        .ok_or_else(|| {
            src.unsupported("no attention.layer_norm_rms_epsilon: not an RMS-norm model".into())
        })?;
    let s = Shape {
        hidden: d.hidden_size,
        heads: d.num_attention_heads,
        kv_heads: d.num_key_value_heads,
        head_size: d.head_size,
        layers: d.num_hidden_layers,
        context: facts.model.context_length,
        eps: eps as f32,
    };
    // A GGUF is outside input: sizes that would make an empty, odd or unbounded graph are
    // refused before anything is allocated for them.
    let bad = |msg: String| Err(src.unsupported(msg));
    if s.hidden == 0 || s.head_size == 0 || !s.head_size.is_multiple_of(2) {
        return bad(format!(
            "hidden size {} and head size {}: the rotary needs a positive, even head size",
            s.hidden, s.head_size
        ));
    }
    if s.heads.checked_mul(s.head_size).is_none() || s.layers > 4096 {
        return bad(format!(
            "{} heads of {}, {} layers: not a model",
            s.heads, s.head_size, s.layers
        ));
    }
    // The rotary caches are context x head size floats, twice: at most 1 GiB of them.
    if s.context
        .checked_mul(s.head_size)
        .is_none_or(|n| n > 1 << 27)
    {
        return bad(format!(
            "context length {} with head size {}: the rotary caches would exceed 1 GiB",
            s.context, s.head_size
        ));
    }
    for (key, what) in [
        (
            "rope.dimension_count",
            "rotary dimensions (partial rotary is not built)",
        ),
        ("attention.value_length", "value head size"),
    ] {
        if let Ok(v) = gguf.arch_u64(key)
            && v != s.head_size as u64
        {
            return bad(format!(
                "{key} {v}: {what} other than the head size {}",
                s.head_size
            ));
        }
    }
    Ok(s)
}

/// Checks that every tensor of the GGUF is one this architecture's graph uses: a tensor left
/// out would be a part of the model silently dropped.
fn check_tensor_names(
    gguf: &GgufModel,
    arch: Arch,
    layers: usize,
    src: &Source<'_>,
) -> Result<(), ConvertError> {
    let mut per_layer = vec![
        "attn_norm.weight",
        "attn_q.weight",
        "attn_k.weight",
        "attn_v.weight",
        "attn_output.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    ];
    match arch {
        Arch::Qwen2 => per_layer.extend(["attn_q.bias", "attn_k.bias", "attn_v.bias"]),
        Arch::Qwen3 => per_layer.extend(["attn_q_norm.weight", "attn_k_norm.weight"]),
        Arch::Llama => {}
    }
    for t in &gguf.tensors {
        let known = match t.name.strip_prefix("blk.") {
            Some(rest) => rest.split_once('.').is_some_and(|(i, what)| {
                i.parse::<usize>().is_ok_and(|i| i < layers) && per_layer.contains(&what)
            }),
            None => matches!(
                t.name.as_str(),
                "token_embd.weight" | "output_norm.weight" | "output.weight" | "rope_freqs.weight"
            ),
        };
        if !known {
            return Err(src.unsupported(format!(
                "tensor {} ({}) is not part of the {arch:?} graph models convert builds",
                t.name,
                GgmlType::name_of(t.ggml_type)
            )));
        }
    }
    Ok(())
}

/// Converts the GGUF package `src` into an ONNX package at `dst` (a new directory, or an empty
/// one). `progress(done, total)` is called as tensors are converted.
pub fn convert(
    src: &Path,
    dst: &Path,
    options: ConvertOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertReport, ConvertError> {
    let pkg = ModelPackage::load(src, None)?;
    if pkg.format != BackboneFormat::Gguf {
        return Err(ConvertError::Usage(format!(
            "{} is already an ONNX package (genai_config.json): models convert takes a GGUF package",
            src.display()
        )));
    }
    if dst.exists() && fs::read_dir(dst).map_err(io(dst))?.next().is_some() {
        return Err(ConvertError::Usage(format!(
            "{} already exists; give a new (or empty) directory",
            dst.display()
        )));
    }
    check_not_inside(&pkg.dir, dst)?;
    // Assembled beside DST (a killed run's leftovers are removed by the next one).
    let work = super::install::work_dir(dst, "convert")?;
    let result = write_package(&pkg, &work, options, progress).and_then(|mut report| {
        // Loaded back as `models check` would, before it takes the final name.
        ModelPackage::load(&work, None)?;
        if dst.exists() {
            fs::remove_dir(dst).map_err(io(dst))?;
        }
        fs::rename(&work, dst).map_err(io(dst))?;
        report.dir = dst.to_path_buf();
        Ok(report)
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&work);
    }
    result
}

/// `p` with its longest existing ancestor canonicalised (the rest may not exist yet).
fn resolve(p: &Path) -> Option<PathBuf> {
    let mut rest = Vec::new();
    let mut cur = p;
    loop {
        let here = if cur.as_os_str().is_empty() {
            Path::new(".")
        } else {
            cur
        };
        if let Ok(c) = fs::canonicalize(here) {
            return Some(rest.iter().rev().fold(c, |acc: PathBuf, r| acc.join(r)));
        }
        rest.push(cur.file_name()?);
        cur = cur.parent()?;
    }
}

/// A destination inside the source package would be copied into itself; only the source's
/// own `onnx/` (a direct child, which the copy skips) may lie there.
fn check_not_inside(src: &Path, dst: &Path) -> Result<(), ConvertError> {
    let parent = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let (Ok(src), Some(parent)) = (fs::canonicalize(src), resolve(parent)) else {
        return Ok(());
    };
    if parent != src && parent.starts_with(&src) {
        return Err(ConvertError::Usage(format!(
            "{} is inside the source package {}: give a directory outside it (or {}/{CONVERTED_DIR})",
            dst.display(),
            src.display(),
            src.display()
        )));
    }
    Ok(())
}

fn write_package(
    pkg: &ModelPackage,
    out: &Path,
    options: ConvertOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ConvertReport, ConvertError> {
    let gguf = GgufModel::read(&pkg.decoder_path)?;
    let mut src = Source {
        gguf: &gguf,
        exact: BTreeMap::new(),
        requantised: Vec::new(),
    };
    let arch_name = gguf.architecture()?.to_owned();
    let arch = Arch::of(&arch_name).ok_or_else(|| {
        src.unsupported(format!(
            "architecture {arch_name}: models convert builds qwen2 (NeuTTS-air), llama \
             (NeuTTS-nano) and qwen3 (NeuTTS-2E)"
        ))
    })?;
    let s = shape_of(&gguf, &src)?;
    check_tensor_names(&gguf, arch, s.layers, &src)?;
    let scaling = gguf.arch_str("rope.scaling.type").unwrap_or("none");
    let position_scale = match scaling {
        "none" => 1.0,
        "linear" => {
            1.0 / gguf
                .arch_f64("rope.scaling.factor")
                .filter(|f| *f > 0.0)
                .unwrap_or(1.0)
        }
        other => {
            return Err(src.unsupported(format!(
                "rope scaling {other:?}: models convert builds none and linear"
            )));
        }
    };
    let vocab_rows = gguf.n_vocab()? as usize;
    let (h, hd) = (s.hidden, s.head_size);
    let (q_size, kv_size) = (s.heads * hd, s.kv_heads * hd);
    let total = s.layers + 3;
    progress(0, total);

    let path = out.join(DECODER);
    let mut g = Graph {
        nodes: Vec::new(),
        inits: Vec::new(),
        writer: TensorWriter::new(out, DATA),
        path: path.clone(),
    };

    // attention_mask -> seqlens_k (sum - 1) and total_sequence_length, int32, as the builder.
    let p = "/model/attn_mask_reformat/attn_mask_subgraph";
    let one = g.init_i64("/model/constants/INT64/[1]", &[1])?;
    g.node(
        "ReduceSum",
        &format!("{p}/ReduceSum"),
        &["attention_mask", &one],
        &[&format!("{p}/ReduceSum/output_0")],
        vec![attr_i("keepdims", 0)],
    );
    g.node(
        "Sub",
        &format!("{p}/Sub"),
        &[&format!("{p}/ReduceSum/output_0"), &one],
        &[&format!("{p}/Sub/output_0")],
        vec![],
    );
    let seqlens_k = g.node(
        "Cast",
        &format!("{p}/Sub/Cast"),
        &[&format!("{p}/Sub/output_0")],
        &[&format!("{p}/Sub/Cast/output_0")],
        vec![attr_i("to", DataType::INT32 as i64)],
    );
    g.node(
        "Shape",
        &format!("{p}/Shape"),
        &["attention_mask"],
        &[&format!("{p}/Shape/output_0")],
        vec![],
    );
    let one_s = g.init(
        "/model/constants/INT64/1",
        DataType::INT64,
        &[],
        1i64.to_le_bytes().to_vec(),
    )?;
    g.node(
        "Gather",
        &format!("{p}/Gather"),
        &[&format!("{p}/Shape/output_0"), &one_s],
        &[&format!("{p}/Gather/output_0")],
        vec![attr_i("axis", 0)],
    );
    let total_len = g.node(
        "Cast",
        &format!("{p}/Gather/Cast"),
        &[&format!("{p}/Gather/output_0")],
        &[&format!("{p}/Gather/Cast/output_0")],
        vec![attr_i("to", DataType::INT32 as i64)],
    );

    // The embedding: quantised rows stay quantised (GatherBlockQuantized), others are floats.
    let embed = src.linear("token_embd.weight", h, vocab_rows, None, None)?;
    let x = "/model/embed_tokens/output_0";
    let embedding = match embed {
        Linear::Blocks(b) => {
            let desc = format!("GatherBlockQuantized, {}-bit blocks of {BLOCK}", b.bits);
            let nb = b.blocks_per_row();
            let rows = b.rows;
            let data = g.init(
                "model.embed_tokens.weight_Q",
                DataType::UINT8,
                &[rows, h * b.bits as usize / 8],
                b.data,
            )?;
            let scales = g.init_f32("model.embed_tokens.weight_scales", &[rows, nb], &b.scales)?;
            let mut inputs = vec![data, "input_ids".to_owned(), scales];
            if let Some(z) = b.zero_points {
                let per_row = z.len() / rows;
                inputs.push(g.init(
                    "model.embed_tokens.weight_zp",
                    DataType::UINT8,
                    &[rows, per_row],
                    z,
                )?);
            }
            let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            g.node(
                "GatherBlockQuantized",
                "/model/embed_tokens/GatherBlockQuantized",
                &inputs,
                &[x],
                vec![
                    attr_i("bits", b.bits as i64),
                    attr_i("block_size", BLOCK as i64),
                    attr_i("gather_axis", 0),
                    attr_i("quantize_axis", 1),
                ],
            );
            desc
        }
        Linear::Float { rows, k, w } => {
            let t = g.init_f32("model.embed_tokens.weight", &[rows, k], &w)?;
            g.node(
                "Gather",
                "/model/embed_tokens/Gather",
                &[&t, "input_ids"],
                &[x],
                vec![],
            );
            "Gather, float32".to_owned()
        }
    };
    progress(1, total);

    let factors = match src.info("rope_freqs.weight") {
        Some(_) => Some(src.vector("rope_freqs.weight", hd / 2)?),
        None => None,
    };
    let base = gguf.arch_f64("rope.freq_base").unwrap_or(10_000.0);
    let (cos, sin) = rotary_caches(s.context, hd, base, position_scale, factors.as_deref());
    g.init_f32("cos_cache", &[s.context, hd / 2], &cos)?;
    g.init_f32("sin_cache", &[s.context, hd / 2], &sin)?;
    drop((cos, sin));

    // The per-head q/k norms (qwen3) work on [batch, seq, heads, head_size].
    let reshapes = if arch == Arch::Qwen3 {
        Some((
            g.init_i64(
                "/model/constants/INT64/[0, 0, -1, head_size]",
                &[0, 0, -1, hd as i64],
            )?,
            g.init_i64("/model/constants/INT64/[0, 0, -1]", &[0, 0, -1])?,
        ))
    } else {
        None
    };
    let eps = attr_f("epsilon", s.eps);
    let mut residual = x.to_owned();
    let mut prev_down: Option<String> = None;
    for l in 0..s.layers {
        let b = format!("/model/layers.{l}");
        let wn = format!("model.layers.{l}");
        let blk = format!("blk.{l}");
        let ln1 = src.vector(&format!("{blk}.attn_norm.weight"), h)?;
        let ln1 = g.init_f32(&format!("{wn}.input_layernorm.weight"), &[h], &ln1)?;
        let ln_out = format!("{b}/input_layernorm/output_0");
        match &prev_down {
            None => {
                g.node(
                    "SimplifiedLayerNormalization",
                    &format!("{b}/input_layernorm/LayerNorm"),
                    &[x, &ln1],
                    &[&ln_out],
                    vec![eps.clone(), attr_i("axis", -1), attr_i("stash_type", 1)],
                );
            }
            Some(down) => {
                let res = format!("{b}/input_layernorm/output_3");
                g.node(
                    "SkipSimplifiedLayerNormalization",
                    &format!("{b}/input_layernorm/SkipLayerNorm"),
                    &[&residual, down, &ln1],
                    &[&ln_out, "", "", &res],
                    vec![eps.clone()],
                );
                residual = res;
            }
        }

        // q, k, v: one packed MatMulNBits when their forms agree (the builder's layout).
        let pick_q = (arch == Arch::Llama).then(|| unpermute_rows(s.heads, hd));
        let pick_k = (arch == Arch::Llama).then(|| unpermute_rows(s.kv_heads, hd));
        let wq = src.linear(
            &format!("{blk}.attn_q.weight"),
            h,
            q_size,
            pick_q.as_deref(),
            None,
        )?;
        let wk = src.linear(
            &format!("{blk}.attn_k.weight"),
            h,
            kv_size,
            pick_k.as_deref(),
            None,
        )?;
        let wv = src.linear(&format!("{blk}.attn_v.weight"), h, kv_size, None, None)?;
        let biases = if arch == Arch::Qwen2 {
            let mut bias = src.vector(&format!("{blk}.attn_q.bias"), q_size)?;
            bias.extend(src.vector(&format!("{blk}.attn_k.bias"), kv_size)?);
            bias.extend(src.vector(&format!("{blk}.attn_v.bias"), kv_size)?);
            Some(bias)
        } else {
            None
        };
        let (mut q, mut k, v);
        match Linear::stack(vec![wq, wk, wv]) {
            Ok(qkv) => {
                debug_assert_eq!(qkv.rows(), q_size + 2 * kv_size);
                let mut out = g.linear(
                    &format!("{b}/attn/qkv_proj"),
                    &format!("{wn}.attn.qkv_proj"),
                    &ln_out,
                    qkv,
                    &format!("{b}/attn/qkv_proj/MatMul/output_0"),
                )?;
                if let Some(bias) = &biases {
                    let bn =
                        g.init_f32(&format!("{wn}.attn.qkv_proj.Add.bias"), &[bias.len()], bias)?;
                    out = g.node(
                        "Add",
                        &format!("{b}/attn/qkv_proj/Add"),
                        &[&out, &bn],
                        &[&format!("{b}/attn/qkv_proj/Add/output_0")],
                        vec![],
                    );
                }
                if arch == Arch::Qwen3 {
                    let split = g.init_i64(
                        &format!("/model/constants/INT64/qkv_split.{l}"),
                        &[q_size as i64, kv_size as i64, kv_size as i64],
                    )?;
                    let outs = [
                        format!("{b}/attn/qkv_proj/Split/output_0"),
                        format!("{b}/attn/qkv_proj/Split/output_1"),
                        format!("{b}/attn/qkv_proj/Split/output_2"),
                    ];
                    g.node(
                        "Split",
                        &format!("{b}/attn/qkv_proj/Split"),
                        &[&out, &split],
                        &[&outs[0], &outs[1], &outs[2]],
                        vec![attr_i("axis", -1)],
                    );
                    let [a, bb, c] = outs;
                    (q, k, v) = (a, bb, c);
                } else {
                    (q, k, v) = (out, String::new(), String::new());
                }
            }
            Err(parts) => {
                let mut it = parts.into_iter();
                let mut outs = Vec::new();
                let mut at = 0;
                for (what, size) in [("q_proj", q_size), ("k_proj", kv_size), ("v_proj", kv_size)] {
                    let w = it.next().expect("three parts");
                    let mut out = g.linear(
                        &format!("{b}/attn/{what}"),
                        &format!("{wn}.attn.{what}"),
                        &ln_out,
                        w,
                        &format!("{b}/attn/{what}/MatMul/output_0"),
                    )?;
                    if let Some(bias) = &biases {
                        let bn = g.init_f32(
                            &format!("{wn}.attn.{what}.Add.bias"),
                            &[size],
                            &bias[at..at + size],
                        )?;
                        out = g.node(
                            "Add",
                            &format!("{b}/attn/{what}/Add"),
                            &[&out, &bn],
                            &[&format!("{b}/attn/{what}/Add/output_0")],
                            vec![],
                        );
                    }
                    at += size;
                    outs.push(out);
                }
                let mut it = outs.into_iter();
                (q, k, v) = (
                    it.next().expect("q"),
                    it.next().expect("k"),
                    it.next().expect("v"),
                );
            }
        }
        if let Some((reshape_heads, reshape_flat)) = &reshapes {
            for (which, t) in [("q_norm", &mut q), ("k_norm", &mut k)] {
                let short = &which[..1];
                let w = src.vector(&format!("{blk}.attn_{short}_norm.weight"), hd)?;
                let w = g.init_f32(&format!("{wn}.attn.{which}.layernorm.weight"), &[hd], &w)?;
                let pre = format!("{b}/attn/{which}");
                let r = g.node(
                    "Reshape",
                    &format!("{pre}/Reshape_1"),
                    &[t, reshape_heads],
                    &[&format!("{pre}/Reshape_1/output_0")],
                    vec![],
                );
                let n = g.node(
                    "SimplifiedLayerNormalization",
                    &format!("{pre}/SimplifiedLayerNormalization"),
                    &[&r, &w],
                    &[&format!("{pre}/SimplifiedLayerNormalization/output_0")],
                    vec![eps.clone(), attr_i("axis", -1), attr_i("stash_type", 1)],
                );
                *t = g.node(
                    "Reshape",
                    &format!("{pre}/Reshape_2"),
                    &[&n, reshape_flat],
                    &[&format!("{pre}/Reshape_2/output_0")],
                    vec![],
                );
            }
        }
        let attn = g.node(
            "GroupQueryAttention",
            &format!("{b}/attn/GroupQueryAttention"),
            &[
                &q,
                &k,
                &v,
                &format!("past_key_values.{l}.key"),
                &format!("past_key_values.{l}.value"),
                &seqlens_k,
                &total_len,
                "cos_cache",
                "sin_cache",
            ],
            &[
                &format!("{b}/attn/GroupQueryAttention/output_0"),
                &format!("present.{l}.key"),
                &format!("present.{l}.value"),
            ],
            vec![
                attr_i("num_heads", s.heads as i64),
                attr_i("kv_num_heads", s.kv_heads as i64),
                attr_f("scale", 1.0 / (hd as f32).sqrt()),
                attr_i("local_window_size", -1),
                attr_f("softcap", 0.0),
                attr_i("do_rotary", 1),
                attr_i("rotary_interleaved", 0),
            ],
        );
        let wo = src.linear(&format!("{blk}.attn_output.weight"), q_size, h, None, None)?;
        let o = g.linear(
            &format!("{b}/attn/o_proj"),
            &format!("{wn}.attn.o_proj"),
            &attn,
            wo,
            &format!("{b}/attn/o_proj/MatMul/output_0"),
        )?;
        let ln2 = src.vector(&format!("{blk}.ffn_norm.weight"), h)?;
        let ln2 = g.init_f32(&format!("{wn}.post_attention_layernorm.weight"), &[h], &ln2)?;
        let h2 = format!("{b}/post_attention_layernorm/output_0");
        let res = format!("{b}/post_attention_layernorm/output_3");
        g.node(
            "SkipSimplifiedLayerNormalization",
            &format!("{b}/post_attention_layernorm/SkipLayerNorm"),
            &[&residual, &o, &ln2],
            &[&h2, "", "", &res],
            vec![eps.clone()],
        );
        residual = res;
        let ffn = gguf
            .tensors
            .iter()
            .find(|t| t.name == format!("{blk}.ffn_gate.weight"))
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| src.unsupported(format!("no 2-D tensor {blk}.ffn_gate.weight")))?
            as usize;
        let wg = src.linear(&format!("{blk}.ffn_gate.weight"), h, ffn, None, None)?;
        let gate = g.linear(
            &format!("{b}/mlp/gate_proj"),
            &format!("{wn}.mlp.gate_proj"),
            &h2,
            wg,
            &format!("{b}/mlp/gate_proj/MatMul/output_0"),
        )?;
        let wu = src.linear(&format!("{blk}.ffn_up.weight"), h, ffn, None, None)?;
        let up = g.linear(
            &format!("{b}/mlp/up_proj"),
            &format!("{wn}.mlp.up_proj"),
            &h2,
            wu,
            &format!("{b}/mlp/up_proj/MatMul/output_0"),
        )?;
        let sig = g.node(
            "Sigmoid",
            &format!("{b}/mlp/act_fn/Sigmoid"),
            &[&gate],
            &[&format!("{b}/mlp/act_fn/Sigmoid/output_0")],
            vec![],
        );
        let act = g.node(
            "Mul",
            &format!("{b}/mlp/act_fn/Mul"),
            &[&gate, &sig],
            &[&format!("{b}/mlp/act_fn/Mul/output_0")],
            vec![],
        );
        let mul = g.node(
            "Mul",
            &format!("{b}/mlp/Mul"),
            &[&act, &up],
            &[&format!("{b}/mlp/Mul/output_0")],
            vec![],
        );
        let wd = src.linear(&format!("{blk}.ffn_down.weight"), ffn, h, None, None)?;
        prev_down = Some(g.linear(
            &format!("{b}/mlp/down_proj"),
            &format!("{wn}.mlp.down_proj"),
            &mul,
            wd,
            &format!("{b}/mlp/down_proj/MatMul/output_0"),
        )?);
        progress(2 + l, total);
    }

    // Final norm, the last position, the speech-only head.
    let b = format!("/model/layers.{}", s.layers);
    let fnorm = src.vector("output_norm.weight", h)?;
    let fnorm = g.init_f32(
        &format!("model.layers.{}.final_norm_layernorm.weight", s.layers),
        &[h],
        &fnorm,
    )?;
    let down = prev_down.expect("at least one layer");
    let final_out = g.node(
        "SkipSimplifiedLayerNormalization",
        &format!("{b}/final_norm_layernorm/SkipLayerNorm"),
        &[&residual, &down, &fnorm],
        &[&format!("{b}/final_norm_layernorm/output_0")],
        vec![eps],
    );
    let index = g.init_i64(LAST_POSITION_INDEX, &[-1])?;
    let last = g.node(
        "Gather",
        LAST_POSITION_NODE,
        &[&final_out, &index],
        &["/lm_head/onebit_last_position/output_0"],
        vec![attr_i("axis", 1)],
    );
    let first = pkg.vocab.first as usize;
    let mut rows: Vec<usize> = (first..first + SPEECH_CODES as usize).collect();
    rows.extend(pkg.stop_ids.iter().map(|&id| id as usize));
    if let Some(&bad) = rows.iter().find(|&&r| r >= vocab_rows) {
        return Err(src.unsupported(format!(
            "the head has {vocab_rows} rows but id {bad} is needed"
        )));
    }
    let head_name = if src.info("output.weight").is_some() {
        "output.weight"
    } else {
        "token_embd.weight"
    };
    let head_bits = (options.head == HeadBits::Int4).then_some(4);
    let head = src.linear(head_name, h, vocab_rows, Some(&rows), head_bits)?;
    let head_desc = format!(
        "{} rows (speech ids and stop ids) of {head_name}, {}, last position only",
        rows.len(),
        match &head {
            Linear::Blocks(b) => format!("MatMulNBits {}-bit", b.bits),
            Linear::Float { .. } => "float32 MatMul".to_owned(),
        }
    );
    g.linear("/lm_head", "lm_head", &last, head, "logits")?;
    progress(total, total);

    let data_bytes = g.writer.finish().map_err(io(&out.join(DATA)))?;
    let mut inputs = vec![
        value_info(
            "input_ids",
            DataType::INT64,
            &[Err("batch_size"), Err("sequence_length")],
        ),
        value_info(
            "attention_mask",
            DataType::INT64,
            &[Err("batch_size"), Err("total_sequence_length")],
        ),
    ];
    let mut outputs = vec![value_info(
        "logits",
        DataType::FLOAT,
        &[Err("batch_size"), Ok(1), Ok(rows.len() as i64)],
    )];
    for kind in ["key", "value"] {
        for l in 0..s.layers {
            let dims = |len: &'static str| {
                [
                    Err("batch_size"),
                    Ok(s.kv_heads as i64),
                    Err(len),
                    Ok(hd as i64),
                ]
            };
            inputs.push(value_info(
                &format!("past_key_values.{l}.{kind}"),
                DataType::FLOAT,
                &dims("past_sequence_length"),
            ));
            outputs.push(value_info(
                &format!("present.{l}.{kind}"),
                DataType::FLOAT,
                &dims("total_sequence_length"),
            ));
        }
    }
    let mut graph = GraphProto::new();
    graph.name = "main_graph".into();
    graph.node = g.nodes;
    graph.initializer = g.inits;
    graph.input = inputs;
    graph.output = outputs;
    let mut model = ModelProto::new();
    model.ir_version = 10;
    model.producer_name = "onebit-tts models convert".into();
    model.producer_version = env!("CARGO_PKG_VERSION").into();
    model.opset_import = [("", 21), ("com.microsoft", 1)]
        .into_iter()
        .map(|(d, v)| {
            let mut o = OperatorSetIdProto::new();
            o.domain = d.into();
            o.version = v;
            o
        })
        .collect();
    model.graph = MessageField::some(graph);
    let bytes = model.write_to_bytes().map_err(|e| ConvertError::Io {
        path: path.clone(),
        err: std::io::Error::other(e.to_string()),
    })?;
    fs::write(&path, &bytes).map_err(io(&path))?;

    // genai_config.json in the builder's schema; the rest of the package as it is.
    let m = &pkg.genai.model;
    let eos: Vec<u32> = pkg
        .stop_ids
        .iter()
        .copied()
        .filter(|&id| id != pkg.vocab.end)
        .collect();
    let genai = serde_json::json!({
        "model": {
            "bos_token_id": m.bos_token_id,
            "context_length": s.context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": DECODER,
                "head_size": hd,
                "hidden_size": h,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": s.heads,
                "num_hidden_layers": s.layers,
                "num_key_value_heads": s.kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": m.pad_token_id,
            "type": arch_name,
            "vocab_size": vocab_rows,
        },
        "search": {"max_length": s.context, "past_present_share_buffer": false},
    });
    write_json(&out.join("genai_config.json"), &genai)?;
    let manifest = LogitsManifest {
        last_position_only: true,
        speech_head: Some(SpeechHead {
            speech_first_id: pkg.vocab.first,
            speech_count: SPEECH_CODES,
            extra_ids: pkg.stop_ids.clone(),
        }),
        source: Some(pkg.decoder_path.display().to_string()),
        ..LogitsManifest::default()
    };
    write_json(
        &out.join(LOGITS_MANIFEST),
        &serde_json::to_value(&manifest).expect("plain data"),
    )?;
    // Not the GGUF, its records, a conversion it already holds, nor this work directory (it may
    // lie inside the source: `models pull` converts into the package it assembles).
    let skip = [
        pkg.decoder_path.clone(),
        pkg.dir.join(super::install::PULLED),
        pkg.dir.join(CONVERTED),
        pkg.dir.join(CONVERTED_DIR),
        pkg.dir.join(out.file_name().unwrap_or_default()),
    ];
    crate::paths::copy_tree(&pkg.dir, out, &skip, crate::paths::Files::LinkLarge)
        .map_err(|(path, err)| ConvertError::Io { path, err })?;
    carry_neuphonic_facts(pkg, out)?;
    let report = ConvertReport {
        source: pkg.decoder_path.clone(),
        dir: out.to_path_buf(),
        architecture: arch_name,
        layers: s.layers,
        exact: src.exact,
        requantised: src.requantised,
        embedding,
        head: head_desc,
        bytes: bytes.len() as u64 + data_bytes,
    };
    write_json(
        &out.join(CONVERTED),
        &serde_json::to_value(&report).expect("plain data"),
    )?;
    Ok(report)
}

/// What the GGUF's own metadata says of the model (`neuphonic.input_format`, its emotions, read
/// as the vendor does) goes to the new package's config.json, where an ONNX package states it:
/// the converted model takes the same prompts and emotions as its source.
fn carry_neuphonic_facts(pkg: &ModelPackage, out: &Path) -> Result<(), ConvertError> {
    let path = out.join("config.json");
    let mut config: serde_json::Value = match fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            ConvertError::Package(PackageError::BadJson {
                path: path.clone(),
                what: "config.json",
                err: e.to_string(),
            })
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::json!({}),
        Err(e) => return Err(io(&path)(e)),
    };
    let Some(obj) = config.as_object_mut() else {
        return Err(ConvertError::Package(PackageError::Invalid {
            path,
            msg: "not a JSON object".into(),
        }));
    };
    let section = obj
        .entry("neuphonic")
        .or_insert_with(|| serde_json::json!({}));
    if !section.is_object() {
        *section = serde_json::json!({});
    }
    section["input_format"] = pkg.input_format.to_string().into();
    if let Some(emotions) = &pkg.emotions {
        section["supported_emotions"] = emotions.clone().into();
    }
    write_json(&path, &config)
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<(), ConvertError> {
    let text = serde_json::to_string_pretty(v).expect("plain data") + "\n";
    fs::write(path, text).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_rows_go_back_to_the_checkpoints_order() {
        // One head of 4: GGUF rows 0,1,2,3 hold checkpoint rows 0,2,1,3.
        assert_eq!(unpermute_rows(1, 4), vec![0, 2, 1, 3]);
        assert_eq!(unpermute_rows(2, 4)[4..], [4, 6, 5, 7]);
    }

    #[test]
    fn rotary_caches_follow_the_rope_formula() {
        let (cos, sin) = rotary_caches(3, 4, 10_000.0, 1.0, None);
        // Position 2, dimension pair 1: angle 2 * 10000^(-1/2).
        let a = 2.0f64 * 10_000f64.powf(-0.5);
        assert_eq!(cos[2 * 2 + 1], a.cos() as f32);
        assert_eq!(sin[2 * 2 + 1], a.sin() as f32);
        let (_, sin) = rotary_caches(3, 4, 10_000.0, 0.5, Some(&[1.0, 4.0]));
        assert_eq!(sin[2 * 2 + 1], (a * 0.5 / 4.0).sin() as f32);
    }
}
