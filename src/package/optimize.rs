//! `onebit-tts models optimize`: a graph edit of the decoder ONNX file that makes the lm_head cheaper,
//! with two switchable levers.
//!
//! - **Last position only.** The exporter's head projects every position (`[1, S, V]` logits in
//!   prefill) although only the last row is ever used. A `Gather(index -1, axis 1)` is inserted on the
//!   head's input, so the head sees `[1, 1, hidden]` and the logits are `[1, 1, V]`.
//! - **Speech-only head.** Only the 65,536 speech ids and the stop ids can be sampled. The head's
//!   `MatMulNBits` weight rows (packed weights, scales, zero points, bias) are cut to those rows and `N`
//!   set to match, so the logits row is compact: speech ids first, then the stop ids. The mapping is
//!   written to `onebit_logits.json` ([`super::logits`]); the engine reads it.
//!
//! The model is read and written with the full onnx.proto messages (unknown fields survive). Tensors
//! stored as external data are read from their files by offset; the cut head tensors go to a new
//! external file beside the model when the originals were external, inline otherwise. Everything else
//! of the package is copied (large files hard-linked, so the original external data is shared).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_proto::{DataLocation, DataType};
use onnx_protobuf::{
    AttributeProto, GraphProto, Message, ModelProto, NodeProto, StringStringEntryProto, TensorProto,
};
use protobuf::EnumOrUnknown;

use super::logits::{LOGITS_MANIFEST, LogitsManifest, SpeechHead};
use super::{ModelPackage, PackageError, SPEECH_CODES};

/// Name of the node the last-position lever inserts; [`inspect`] recognises the lever by it.
pub const LAST_POSITION_NODE: &str = "/lm_head/onebit_last_position/Gather";
pub(super) const LAST_POSITION_INDEX: &str = "onebit_last_position_index";
const SPEECH_SUFFIX: &str = ".onebit_speech";
/// Offsets in the new external data file are aligned to this (ORT can map aligned data).
const EXTERNAL_ALIGN: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum OptimizeError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error("{}: {msg}", .path.display())]
    Graph { path: PathBuf, msg: String },
    #[error("{}: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{0}")]
    Usage(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OptimizeError + '_ {
    move |err| OptimizeError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Which levers to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levers {
    pub last_position: bool,
    pub speech_head: bool,
}

impl Default for Levers {
    fn default() -> Self {
        Self {
            last_position: true,
            speech_head: true,
        }
    }
}

/// What [`optimize`] did.
#[derive(Debug, Clone)]
pub struct OptimizeReport {
    pub decoder: PathBuf,
    pub manifest: LogitsManifest,
    /// The head's rows before and after.
    pub rows_before: usize,
    pub rows_after: usize,
    /// Bytes of the head's tensors (weights, scales, zero points, bias) before and after.
    pub head_bytes_before: u64,
    pub head_bytes_after: u64,
    /// The new external data file, when the head's tensors were external.
    pub external: Option<PathBuf>,
    pub files_linked: usize,
    pub files_copied: usize,
}

impl OptimizeReport {
    pub fn summary(&self) -> String {
        let mut s = format!(
            "decoder      {}\nlogits       {}\n",
            self.decoder.display(),
            self.manifest.describe(self.rows_before)
        );
        if self.rows_after != self.rows_before {
            s += &format!(
                "head         {} -> {} rows, {:.1} -> {:.1} MiB\n",
                self.rows_before,
                self.rows_after,
                self.head_bytes_before as f64 / 1048576.0,
                self.head_bytes_after as f64 / 1048576.0,
            );
        }
        if let Some(e) = &self.external {
            s += &format!("head data    {}\n", e.display());
        }
        s += &format!(
            "other files  {} copied, {} hard-linked",
            self.files_copied, self.files_linked
        );
        s
    }
}

/// The decoder's lm_head as [`inspect`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadInfo {
    pub node: String,
    /// Output rows (logits width).
    pub n: usize,
    /// Input width (hidden size).
    pub k: usize,
    pub bits: usize,
    pub block_size: usize,
    /// The head's input passes through the last-position Gather.
    pub last_position: bool,
}

impl HeadInfo {
    pub fn describe(&self) -> String {
        format!(
            "MatMulNBits {:?} (N {}, K {}, {} bits, block {}){}",
            self.node,
            self.n,
            self.k,
            self.bits,
            self.block_size,
            if self.last_position {
                ", input cut to the last position"
            } else {
                ""
            }
        )
    }
}

fn read_model(path: &Path) -> Result<ModelProto, OptimizeError> {
    let bytes = fs::read(path).map_err(io(path))?;
    ModelProto::parse_from_bytes(&bytes).map_err(|e| OptimizeError::Graph {
        path: path.to_path_buf(),
        msg: format!("not an ONNX model: {e}"),
    })
}

/// A graph's weights: initializer name -> (its bytes, the main-graph nodes that consume it).
/// Residency weighs ONNX Runtime's node placement with it (`npu::residency::Placement`).
pub type GraphWeights = HashMap<String, (u64, Vec<String>)>;

/// Reads the initializers of `path`'s main graph and their consumers. Only the graph file is
/// read: external data is sized from the tensor's dims and type, not loaded.
pub fn graph_weights(path: &Path) -> Result<GraphWeights, OptimizeError> {
    let model = read_model(path)?;
    let g = &model.graph;
    let mut out: GraphWeights = g
        .initializer
        .iter()
        .map(|t| {
            // A malformed model's dims must not overflow: saturate.
            let count = t
                .dims
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
                .unwrap_or(u64::MAX);
            let bits = match EnumOrUnknown::<DataType>::from_i32(t.data_type).enum_value() {
                Ok(DataType::INT4 | DataType::UINT4) => 4,
                _ => elem_size(t.data_type).unwrap_or(0) as u64 * 8,
            };
            (
                t.name.clone(),
                (count.saturating_mul(bits).div_ceil(8), Vec::new()),
            )
        })
        .collect();
    for n in &g.node {
        for i in &n.input {
            if let Some((_, consumers)) = out.get_mut(i) {
                consumers.push(n.name.clone());
            }
        }
    }
    Ok(out)
}

/// What `models check` says of a package's lm_head: the head as the graph has it, checked
/// against the package's logits manifest; `Err` when they disagree. A head this module cannot
/// read is only a note for a package that was never optimized (nothing depends on it then).
pub fn check_head(pkg: &super::ModelPackage) -> Result<String, OptimizeError> {
    if pkg.format == super::BackboneFormat::Gguf {
        return Ok("GGUF: llama.cpp computes the logits of the positions asked for".into());
    }
    let logits = &pkg.genai.model.decoder.outputs.logits;
    match inspect(&pkg.decoder_path, logits) {
        Ok(head) => {
            let want = pkg.logits.width(pkg.genai.model.vocab_size);
            if head.n != want || head.last_position != pkg.logits.last_position_only {
                return Err(OptimizeError::Graph {
                    path: pkg.decoder_path.clone(),
                    msg: format!(
                        "the graph's lm_head ({}) does not match the package's logits ({})",
                        head.describe(),
                        pkg.logits.describe(pkg.genai.model.vocab_size)
                    ),
                });
            }
            Ok(head.describe())
        }
        Err(e) if !pkg.logits.is_optimized() => Ok(format!("not optimizable: {e}")),
        Err(e) => Err(e),
    }
}

/// Finds the lm_head of `decoder` (the `MatMulNBits` node whose output becomes `logits`).
pub fn inspect(decoder: &Path, logits: &str) -> Result<HeadInfo, OptimizeError> {
    let model = read_model(decoder)?;
    let graph = model.graph.as_ref().ok_or_else(|| OptimizeError::Graph {
        path: decoder.to_path_buf(),
        msg: "the model has no graph".into(),
    })?;
    let at = |msg: String| OptimizeError::Graph {
        path: decoder.to_path_buf(),
        msg,
    };
    let i = find_head(graph, logits).map_err(at)?;
    let head = &graph.node[i];
    let attrs = head_attrs(head).map_err(at)?;
    let last_position = graph
        .node
        .iter()
        .any(|n| n.name == LAST_POSITION_NODE && n.output.first() == head.input.first());
    Ok(HeadInfo {
        node: head.name.clone(),
        n: attrs.n,
        k: attrs.k,
        bits: attrs.bits,
        block_size: attrs.block_size,
        last_position,
    })
}

/// The index of the node that computes the lm_head: follows `logits` back through Cast/Identity
/// to a com.microsoft MatMulNBits.
fn find_head(g: &GraphProto, logits: &str) -> Result<usize, String> {
    if !g.output.iter().any(|o| o.name == logits) {
        return Err(format!(
            "the graph has no output {logits:?} (genai_config.json model.decoder.outputs.logits)"
        ));
    }
    let mut name = logits.to_owned();
    for _ in 0..8 {
        let i = g
            .node
            .iter()
            .position(|n| n.output.contains(&name))
            .ok_or_else(|| format!("no node computes {name:?}"))?;
        let n = &g.node[i];
        match (n.domain.as_str(), n.op_type.as_str()) {
            ("com.microsoft", "MatMulNBits") => return Ok(i),
            ("" | "ai.onnx", "Cast" | "Identity") if !n.input.is_empty() => {
                name = n.input[0].clone();
            }
            (domain, op) => {
                return Err(format!(
                    "the logits come from a {op} node{} ({:?}), not a com.microsoft MatMulNBits lm_head; models optimize needs the onnxruntime-genai int4 export",
                    if domain.is_empty() {
                        String::new()
                    } else {
                        format!(" of domain {domain}")
                    },
                    n.name
                ));
            }
        }
    }
    Err(format!("no MatMulNBits within 8 nodes of {logits:?}"))
}

struct HeadAttrs {
    n: usize,
    k: usize,
    bits: usize,
    block_size: usize,
}

fn int_attr(node: &NodeProto, name: &str) -> Option<i64> {
    node.attribute.iter().find(|a| a.name == name).map(|a| a.i)
}

fn head_attrs(node: &NodeProto) -> Result<HeadAttrs, String> {
    let get = |name: &str| {
        int_attr(node, name)
            .filter(|&v| v > 0)
            .map(|v| v as usize)
            .ok_or_else(|| format!("MatMulNBits {:?} has no attribute {name}", node.name))
    };
    Ok(HeadAttrs {
        n: get("N")?,
        k: get("K")?,
        bits: get("bits")?,
        block_size: get("block_size")?,
    })
}

fn elem_size(data_type: i32) -> Option<usize> {
    use DataType::*;
    let dt = EnumOrUnknown::<DataType>::from_i32(data_type)
        .enum_value()
        .ok()?;
    Some(match dt {
        UINT8 | INT8 | BOOL => 1,
        UINT16 | INT16 | FLOAT16 | BFLOAT16 => 2,
        FLOAT | INT32 | UINT32 => 4,
        INT64 | UINT64 | DOUBLE => 8,
        _ => return None,
    })
}

fn is_external(t: &TensorProto) -> bool {
    t.data_location.enum_value() == Ok(DataLocation::EXTERNAL)
}

/// Reads the byte ranges `(start, len)` of a tensor's data, wherever it is stored.
struct TensorReader<'a> {
    dir: &'a Path,
    files: HashMap<PathBuf, File>,
}

impl TensorReader<'_> {
    fn total_bytes(t: &TensorProto) -> Result<u64, String> {
        let size = elem_size(t.data_type)
            .ok_or_else(|| format!("{:?}: unsupported element type {}", t.name, t.data_type))?;
        let count: i64 = t.dims.iter().product();
        if count < 0 {
            return Err(format!("{:?}: negative dims {:?}", t.name, t.dims));
        }
        Ok(count as u64 * size as u64)
    }

    fn read(&mut self, t: &TensorProto, ranges: &[(u64, u64)]) -> Result<Vec<u8>, String> {
        let total = Self::total_bytes(t)?;
        let mut out = Vec::with_capacity(ranges.iter().map(|r| r.1 as usize).sum());
        if is_external(t) {
            let entry = |k: &str| {
                t.external_data
                    .iter()
                    .find(|e| e.key == k)
                    .map(|e| e.value.as_str())
            };
            let location = entry("location")
                .ok_or_else(|| format!("{:?}: external data without a location", t.name))?;
            let num = |k: &str| -> Result<Option<u64>, String> {
                entry(k)
                    .map(|v| {
                        v.parse::<u64>()
                            .map_err(|_| format!("{:?}: external {k} {v:?}", t.name))
                    })
                    .transpose()
            };
            let offset = num("offset")?.unwrap_or(0);
            if let Some(len) = num("length")?
                && len != total
            {
                return Err(format!(
                    "{:?}: external length {len} but dims {:?} need {total} bytes",
                    t.name, t.dims
                ));
            }
            let path = self.dir.join(location);
            if !self.files.contains_key(&path) {
                let f = File::open(&path)
                    .map_err(|e| format!("{:?}: external data {}: {e}", t.name, path.display()))?;
                self.files.insert(path.clone(), f);
            }
            let f = self.files.get_mut(&path).expect("inserted above");
            for &(start, len) in ranges {
                let mut buf = vec![0u8; len as usize];
                f.seek(SeekFrom::Start(offset + start))
                    .and_then(|_| f.read_exact(&mut buf))
                    .map_err(|e| {
                        format!(
                            "{:?}: reading {len} bytes at {} of {}: {e}",
                            t.name,
                            offset + start,
                            path.display()
                        )
                    })?;
                out.extend_from_slice(&buf);
            }
            return Ok(out);
        }
        let inline = inline_bytes(t)?;
        if inline.len() as u64 != total {
            return Err(format!(
                "{:?}: {} bytes of data but dims {:?} need {total}",
                t.name,
                inline.len(),
                t.dims
            ));
        }
        for &(start, len) in ranges {
            out.extend_from_slice(&inline[start as usize..(start + len) as usize]);
        }
        Ok(out)
    }
}

/// A tensor's inline data as little-endian bytes (raw_data, or the typed fields).
fn inline_bytes(t: &TensorProto) -> Result<std::borrow::Cow<'_, [u8]>, String> {
    if !t.raw_data.is_empty() {
        return Ok(t.raw_data.as_slice().into());
    }
    let size = elem_size(t.data_type).unwrap_or(0);
    if !t.float_data.is_empty() {
        return Ok(t
            .float_data
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect::<Vec<_>>()
            .into());
    }
    if !t.int32_data.is_empty() && (1..=4).contains(&size) {
        return Ok(t
            .int32_data
            .iter()
            .flat_map(|v| v.to_le_bytes()[..size].to_vec())
            .collect::<Vec<_>>()
            .into());
    }
    if !t.int64_data.is_empty() {
        return Ok(t
            .int64_data
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>()
            .into());
    }
    if t.dims.iter().product::<i64>() == 0 {
        return Ok(Vec::new().into());
    }
    Err(format!(
        "{:?}: data stored in a field this tool does not read",
        t.name
    ))
}

/// Where new tensor data goes: inline, or appended to one new external file.
pub(super) struct TensorWriter {
    dir: PathBuf,
    location: String,
    file: Option<File>,
    len: u64,
}

impl TensorWriter {
    /// Appends to `dir/location`, created at the first external tensor.
    pub(super) fn new(dir: &Path, location: &str) -> Self {
        Self {
            dir: dir.to_path_buf(),
            location: location.to_owned(),
            file: None,
            len: 0,
        }
    }

    /// Flushes the external file to disk; its length (0: nothing was external).
    pub(super) fn finish(&mut self) -> std::io::Result<u64> {
        if let Some(f) = self.file.take() {
            f.sync_all()?;
        }
        Ok(self.len)
    }

    pub(super) fn store(
        &mut self,
        t: &mut TensorProto,
        data: Vec<u8>,
        external: bool,
    ) -> Result<(), String> {
        t.raw_data.clear();
        t.float_data.clear();
        t.int32_data.clear();
        t.int64_data.clear();
        t.double_data.clear();
        t.uint64_data.clear();
        t.external_data.clear();
        if !external {
            t.data_location = EnumOrUnknown::new(DataLocation::DEFAULT);
            t.raw_data = data;
            return Ok(());
        }
        let path = self.dir.join(&self.location);
        if self.file.is_none() {
            self.file =
                Some(File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?);
        }
        let f = self.file.as_mut().expect("opened above");
        let offset = self.len.div_ceil(EXTERNAL_ALIGN) * EXTERNAL_ALIGN;
        let pad = vec![0u8; (offset - self.len) as usize];
        f.write_all(&pad)
            .and_then(|_| f.write_all(&data))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        self.len = offset + data.len() as u64;
        let kv = |k: &str, v: String| {
            let mut e = StringStringEntryProto::new();
            e.key = k.into();
            e.value = v;
            e
        };
        t.external_data = vec![
            kv("location", self.location.clone()),
            kv("offset", offset.to_string()),
            kv("length", data.len().to_string()),
        ];
        t.data_location = EnumOrUnknown::new(DataLocation::EXTERNAL);
        Ok(())
    }
}

/// How many nodes (in `g` and its subgraphs) read `name`.
fn uses(g: &GraphProto, name: &str) -> usize {
    g.node
        .iter()
        .map(|n| {
            n.input.iter().filter(|i| *i == name).count()
                + n.attribute
                    .iter()
                    .map(|a| {
                        a.g.as_ref().map_or(0, |s| uses(s, name))
                            + a.graphs.iter().map(|s| uses(s, name)).sum::<usize>()
                    })
                    .sum::<usize>()
        })
        .sum()
}

fn unique_name(g: &GraphProto, base: &str) -> String {
    let taken = |n: &str| {
        g.initializer.iter().any(|t| t.name == n)
            || g.node.iter().any(|x| x.output.iter().any(|o| o == n))
            || g.input.iter().any(|i| i.name == n)
    };
    let mut name = base.to_owned();
    let mut i = 1;
    while taken(&name) {
        name = format!("{base}_{i}");
        i += 1;
    }
    name
}

/// Sets dimension `axis` of a graph output's declared shape, when it declares one.
fn set_output_dim(g: &mut GraphProto, name: &str, axis: usize, value: i64) {
    if let Some(o) = g.output.iter_mut().find(|o| o.name == name)
        && let Some(tp) = o.type_.as_mut()
        && tp.has_tensor_type()
        && let Some(shape) = tp.mut_tensor_type().shape.as_mut()
        && let Some(d) = shape.dim.get_mut(axis)
    {
        d.set_dim_value(value);
    }
}

/// Cuts the head's rows to `rows` (`(first, count)` runs of old rows, in the new order); returns
/// the head tensors' bytes before and after.
fn cut_head(
    g: &mut GraphProto,
    head: usize,
    n_old: usize,
    rows: &[(usize, usize)],
    reader: &mut TensorReader<'_>,
    writer: &mut TensorWriter,
) -> Result<(u64, u64), String> {
    let n_new: usize = rows.iter().map(|r| r.1).sum();
    if let Some(&(s, c)) = rows.iter().find(|r| r.0 + r.1 > n_old) {
        return Err(format!(
            "the head has {n_old} rows; rows {s}..{} do not exist",
            s + c
        ));
    }
    let (mut before, mut after) = (0u64, 0u64);
    // MatMulNBits inputs: A, B, scales, zero_points, g_idx, bias. g_idx indexes K, not N.
    for slot in [1usize, 2, 3, 5] {
        let Some(name) = g.node[head].input.get(slot).cloned() else {
            continue;
        };
        if name.is_empty() {
            continue;
        }
        let Some(ti) = g.initializer.iter().position(|t| t.name == name) else {
            return Err(format!(
                "the head's input {slot} ({name:?}) is computed by the graph, not an initializer; its rows cannot be cut"
            ));
        };
        let t = &g.initializer[ti];
        let total = TensorReader::total_bytes(t)?;
        if total % n_old as u64 != 0 {
            return Err(format!(
                "{name:?} ({total} bytes, dims {:?}) does not split into {n_old} rows",
                t.dims
            ));
        }
        let row = total / n_old as u64;
        let ranges: Vec<(u64, u64)> = rows
            .iter()
            .map(|&(s, c)| (s as u64 * row, c as u64 * row))
            .collect();
        let data = reader.read(t, &ranges)?;
        let mut dims = t.dims.clone();
        match dims.first_mut() {
            Some(d) if *d == n_old as i64 => *d = n_new as i64,
            Some(d) if t.dims.len() == 1 && *d % n_old as i64 == 0 => {
                *d = *d / n_old as i64 * n_new as i64
            }
            _ => {
                return Err(format!(
                    "{name:?} has dims {:?}; expected the head's {n_old} rows first",
                    t.dims
                ));
            }
        }
        let mut new = t.clone();
        new.name = unique_name(g, &format!("{name}{SPEECH_SUFFIX}"));
        new.dims = dims;
        before += total;
        after += data.len() as u64;
        writer.store(&mut new, data, is_external(t))?;
        let new_name = new.name.clone();
        g.node[head].input[slot] = new_name;
        g.initializer.push(new);
        if uses(g, &name) == 0 {
            g.initializer.retain(|t| t.name != name);
        }
    }
    let node = &mut g.node[head];
    let n_attr = node
        .attribute
        .iter_mut()
        .find(|a| a.name == "N")
        .expect("checked by head_attrs");
    n_attr.i = n_new as i64;
    Ok((before, after))
}

/// Inserts `Gather(A, [-1], axis=1)` on the head's input.
fn cut_to_last_position(model: &mut ModelProto, head: usize) -> Result<(), String> {
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .unwrap_or(0);
    if opset < 13 {
        return Err(format!(
            "the model imports ONNX opset {opset}; the last-position Gather needs 13 or newer"
        ));
    }
    let g = model.graph.as_mut().expect("checked by the caller");
    let a = g.node[head].input[0].clone();
    let index = unique_name(g, LAST_POSITION_INDEX);
    let out = unique_name(g, "/lm_head/onebit_last_position/output_0");
    let mut t = TensorProto::new();
    t.name = index.clone();
    t.data_type = DataType::INT64 as i32;
    t.dims = vec![1];
    t.raw_data = (-1i64).to_le_bytes().to_vec();
    g.initializer.push(t);
    let mut axis = AttributeProto::new();
    axis.name = "axis".into();
    axis.type_ = EnumOrUnknown::new(AttributeType::INT);
    axis.i = 1;
    let mut node = NodeProto::new();
    node.name = LAST_POSITION_NODE.into();
    node.op_type = "Gather".into();
    node.input = vec![a, index];
    node.output = vec![out.clone()];
    node.attribute = vec![axis];
    g.node[head].input[0] = out;
    g.node.insert(head, node);
    Ok(())
}

/// Writes an optimized copy of the package `src` to `dst` (a new or empty directory).
pub fn optimize(src: &Path, dst: &Path, levers: Levers) -> Result<OptimizeReport, OptimizeError> {
    if !levers.last_position && !levers.speech_head {
        return Err(OptimizeError::Usage(
            "both levers are off (--no-last-position --no-speech-head): nothing to do".into(),
        ));
    }
    let pkg = ModelPackage::load(src, None)?;
    if pkg.format == super::BackboneFormat::Gguf {
        return Err(OptimizeError::Usage(format!(
            "{} is a GGUF package: `models optimize` edits ONNX graphs, and llama.cpp already \
             computes only the logits asked for",
            src.display()
        )));
    }
    if pkg.logits.is_optimized() {
        return Err(OptimizeError::Usage(format!(
            "{} is already optimized ({}: {}); optimize the original package",
            src.display(),
            LOGITS_MANIFEST,
            pkg.logits.describe(pkg.genai.model.vocab_size)
        )));
    }
    let src = fs::canonicalize(src).map_err(io(src))?;
    check_destination(&src, dst)?;

    let decoder = &pkg.decoder_path;
    let graph_err = |msg: String| OptimizeError::Graph {
        path: decoder.clone(),
        msg,
    };
    let mut model = read_model(decoder)?;
    let graph = model
        .graph
        .as_mut()
        .ok_or_else(|| graph_err("the model has no graph".into()))?;
    let logits = pkg.genai.model.decoder.outputs.logits.clone();
    let head = find_head(graph, &logits).map_err(graph_err)?;
    let attrs = head_attrs(&graph.node[head]).map_err(graph_err)?;
    let vocab = pkg.genai.model.vocab_size;
    if attrs.n != vocab {
        return Err(graph_err(format!(
            "the lm_head has {} rows but genai_config.json says vocab_size {vocab}",
            attrs.n
        )));
    }
    if graph.node.iter().any(|n| n.name == LAST_POSITION_NODE) {
        return Err(OptimizeError::Usage(format!(
            "{} already has the last-position Gather but no {LOGITS_MANIFEST}; optimize the original package",
            decoder.display()
        )));
    }

    let rel = Path::new(&pkg.genai.model.decoder.filename);
    let out_decoder = dst.join(rel);
    let out_dir = out_decoder.parent().unwrap_or(dst).to_path_buf();
    let model_dir = decoder.parent().unwrap_or(Path::new(".")).to_path_buf();
    let file_name = rel
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("model.onnx");
    let created = !dst.exists();
    fs::create_dir_all(&out_dir).map_err(io(&out_dir))?;

    let result = (|| {
        let mut manifest = LogitsManifest {
            source: Some(src.display().to_string()),
            ..LogitsManifest::default()
        };
        let mut writer = TensorWriter {
            dir: out_dir.clone(),
            location: format!("{file_name}.onebit.data"),
            file: None,
            len: 0,
        };
        let (mut before, mut after) = (0, 0);
        let mut rows_after = attrs.n;
        if levers.speech_head {
            let first = pkg.vocab.first as usize;
            let mut rows = vec![(first, SPEECH_CODES as usize)];
            rows.extend(pkg.stop_ids.iter().map(|&id| (id as usize, 1)));
            let mut reader = TensorReader {
                dir: &model_dir,
                files: HashMap::new(),
            };
            let g = model.graph.as_mut().expect("checked above");
            (before, after) =
                cut_head(g, head, attrs.n, &rows, &mut reader, &mut writer).map_err(graph_err)?;
            rows_after = rows.iter().map(|r| r.1).sum();
            set_output_dim(g, &logits, 2, rows_after as i64);
            manifest.speech_head = Some(SpeechHead {
                speech_first_id: pkg.vocab.first,
                speech_count: SPEECH_CODES,
                extra_ids: pkg.stop_ids.clone(),
            });
        }
        if levers.last_position {
            cut_to_last_position(&mut model, head).map_err(graph_err)?;
            let g = model.graph.as_mut().expect("checked above");
            set_output_dim(g, &logits, 1, 1);
            manifest.last_position_only = true;
        }
        if let Some(f) = writer.file.take() {
            f.sync_all().map_err(io(&out_dir))?;
        }
        // The rest of the package first, so nothing it holds can overwrite what is written here.
        let skip = [
            src.join(rel),
            src.join(rel.with_file_name(&writer.location)),
            src.join(LOGITS_MANIFEST),
        ];
        let counts = crate::paths::copy_tree(&src, dst, &skip, crate::paths::Files::LinkLarge)
            .map_err(|(path, err)| OptimizeError::Io { path, err })?;
        let bytes = model
            .write_to_bytes()
            .map_err(|e| graph_err(format!("cannot serialise the edited model: {e}")))?;
        fs::write(&out_decoder, bytes).map_err(io(&out_decoder))?;
        let manifest_path = dst.join(LOGITS_MANIFEST);
        let json = serde_json::to_string_pretty(&manifest).expect("plain data");
        fs::write(&manifest_path, json + "\n").map_err(io(&manifest_path))?;
        Ok(OptimizeReport {
            decoder: out_decoder.clone(),
            manifest,
            rows_before: attrs.n,
            rows_after,
            head_bytes_before: before,
            head_bytes_after: after,
            external: (writer.len > 0).then(|| out_dir.join(&writer.location)),
            files_copied: counts.0,
            files_linked: counts.1,
        })
    })();
    if result.is_err() && created {
        let _ = fs::remove_dir_all(dst);
    }
    result
}

fn check_destination(src: &Path, dst: &Path) -> Result<(), OptimizeError> {
    if dst.exists() {
        let empty = dst.is_dir() && fs::read_dir(dst).map_err(io(dst))?.next().is_none();
        if !empty {
            return Err(OptimizeError::Usage(format!(
                "{} already exists; give a new (or empty) directory",
                dst.display()
            )));
        }
        let dst = fs::canonicalize(dst).map_err(io(dst))?;
        if dst.starts_with(src) {
            return Err(OptimizeError::Usage(format!(
                "{} is inside the source package {}",
                dst.display(),
                src.display()
            )));
        }
    } else if let Some(parent) = dst.parent().filter(|p| !p.as_os_str().is_empty())
        && let Ok(parent) = fs::canonicalize(parent)
        && parent.starts_with(src)
    {
        return Err(OptimizeError::Usage(format!(
            "{} is inside the source package {}",
            dst.display(),
            src.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_bytes_reads_typed_fields() {
        let mut t = TensorProto::new();
        t.data_type = DataType::FLOAT as i32;
        t.dims = vec![2];
        t.float_data = vec![1.0, -2.0];
        assert_eq!(
            inline_bytes(&t).unwrap().as_ref(),
            [1.0f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat()
        );
        let mut t = TensorProto::new();
        t.data_type = DataType::UINT8 as i32;
        t.dims = vec![3];
        t.int32_data = vec![1, 2, 255];
        assert_eq!(inline_bytes(&t).unwrap().as_ref(), [1u8, 2, 255]);
    }

    #[test]
    fn rows_are_cut_in_the_given_order() {
        // A 4-row head: B [4, 1, 2] uint8, scales [4] float.
        let mut g = GraphProto::new();
        let mut b = TensorProto::new();
        b.name = "B".into();
        b.data_type = DataType::UINT8 as i32;
        b.dims = vec![4, 1, 2];
        b.raw_data = (0u8..8).collect();
        let mut s = TensorProto::new();
        s.name = "S".into();
        s.data_type = DataType::FLOAT as i32;
        s.dims = vec![4];
        s.float_data = vec![0.0, 1.0, 2.0, 3.0];
        g.initializer = vec![b, s];
        let mut n = NodeProto::new();
        n.op_type = "MatMulNBits".into();
        n.domain = "com.microsoft".into();
        n.input = vec!["A".into(), "B".into(), "S".into()];
        let mut attr = AttributeProto::new();
        attr.name = "N".into();
        attr.i = 4;
        n.attribute = vec![attr];
        g.node = vec![n];
        let dir = std::env::temp_dir();
        let mut reader = TensorReader {
            dir: &dir,
            files: HashMap::new(),
        };
        let mut writer = TensorWriter {
            dir: dir.clone(),
            location: "unused".into(),
            file: None,
            len: 0,
        };
        cut_head(&mut g, 0, 4, &[(2, 2), (0, 1)], &mut reader, &mut writer).unwrap();
        assert_eq!(g.initializer.len(), 2, "the originals are dropped");
        let b = &g.initializer[0];
        assert_eq!(b.name, "B.onebit_speech");
        assert_eq!(b.dims, vec![3, 1, 2]);
        assert_eq!(b.raw_data, vec![4, 5, 6, 7, 0, 1]);
        let s = &g.initializer[1];
        assert_eq!(s.dims, vec![3]);
        assert_eq!(
            s.raw_data,
            [2.0f32, 3.0, 0.0]
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect::<Vec<_>>()
        );
        assert_eq!(int_attr(&g.node[0], "N"), Some(3));
        assert_eq!(g.node[0].input[1], "B.onebit_speech");
    }
}
