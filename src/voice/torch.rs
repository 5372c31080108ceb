//! Reference codes from torch `.pt` files, read without Python or torch.
//!
//! `torch.save(codes, "NAME.pt")` (torch >= 1.6) writes a zip archive: `<prefix>/data.pkl` is a
//! protocol-2 pickle that rebuilds the tensor with `torch._utils._rebuild_tensor_v2(storage,
//! offset, size, stride, ...)`, where `storage` is a persistent id `('storage', torch.IntStorage,
//! key, location, numel)`, and `<prefix>/data/<key>` holds the storage's raw bytes. The prefix is
//! the archive name torch picked (the vendor files use the original file stems), so it is found,
//! not assumed. Torch's older non-zip format (a run of pickles followed by raw storages) is read
//! too, because with the pickle reader in hand it costs little; the even older tar format is
//! refused.
//!
//! Only what a voice needs is accepted: one integer tensor (int16, int32 or int64) that is 1-D or
//! squeezes to 1-D and is contiguous. Anything else is refused with a message saying what was
//! found, rather than guessed at.

use std::collections::HashMap;
use std::io::{Cursor, Read};

use super::pickle::{Id, Pickle, PickleError, Value};

/// Upper bound for `data.pkl`: a tensor's pickle is ~150 bytes; a whole model's is megabytes and
/// not a voice.
const MAX_PICKLE: u64 = 1 << 20;

/// `torch.serialization.MAGIC_NUMBER` and `PROTOCOL_VERSION` of the legacy format.
const LEGACY_MAGIC: i128 = 0x1950_a86a_20f9_469c_fc6c;
const LEGACY_PROTOCOL: i128 = 1001;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TorchError {
    #[error("not a torch file: {0}")]
    NotTorch(String),
    #[error("not a readable torch zip archive (truncated or damaged?): {0}")]
    Zip(String),
    #[error("legacy torch format not supported; re-save with torch>=1.6")]
    LegacyTar,
    #[error("{part}: {source}")]
    Pickle {
        part: String,
        #[source]
        source: PickleError,
    },
    /// The pickle is fine but does not describe something a voice can use.
    #[error("{0}")]
    Content(String),
}

/// Element type of a code storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dtype {
    I16,
    I32,
    I64,
}

impl Dtype {
    fn size(self) -> usize {
        match self {
            Dtype::I16 => 2,
            Dtype::I32 => 4,
            Dtype::I64 => 8,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
        }
    }

    fn read(self, b: &[u8], big_endian: bool) -> i64 {
        // `b` is exactly `size()` bytes (callers slice with chunks_exact).
        let mut a = [0u8; 8];
        let n = self.size();
        a[..n].copy_from_slice(&b[..n]);
        match (self, big_endian) {
            (Dtype::I16, false) => i16::from_le_bytes([a[0], a[1]]).into(),
            (Dtype::I16, true) => i16::from_be_bytes([a[0], a[1]]).into(),
            (Dtype::I32, false) => i32::from_le_bytes([a[0], a[1], a[2], a[3]]).into(),
            (Dtype::I32, true) => i32::from_be_bytes([a[0], a[1], a[2], a[3]]).into(),
            (Dtype::I64, false) => i64::from_le_bytes(a),
            (Dtype::I64, true) => i64::from_be_bytes(a),
        }
    }
}

/// Element size of every storage class torch pickles, for skipping storages in the legacy format;
/// `None` for names torch does not use.
fn element_size(class: &str) -> Option<usize> {
    Some(match class {
        "ByteStorage" | "CharStorage" | "BoolStorage" | "QUInt8Storage" | "QInt8Storage" => 1,
        "ShortStorage" | "HalfStorage" | "BFloat16Storage" => 2,
        "IntStorage" | "FloatStorage" | "QInt32Storage" => 4,
        "LongStorage" | "DoubleStorage" | "ComplexFloatStorage" => 8,
        "ComplexDoubleStorage" => 16,
        _ => return None,
    })
}

fn code_dtype(class: &str) -> Result<Dtype, TorchError> {
    match class {
        "ShortStorage" => Ok(Dtype::I16),
        "IntStorage" => Ok(Dtype::I32),
        "LongStorage" => Ok(Dtype::I64),
        other => Err(TorchError::Content(format!(
            "the tensor's storage is torch.{other}; codes must be integers \
             (torch.ShortStorage, IntStorage or LongStorage: int16, int32 or int64)"
        ))),
    }
}

/// A storage as the persistent id names it.
struct StorageRef {
    class: String,
    key: String,
    numel: u64,
}

/// The tensor `_rebuild_tensor_v2` would build.
struct TensorRef {
    storage: StorageRef,
    offset: u64,
    size: Vec<u64>,
    stride: Vec<i64>,
}

/// Reads the one integer tensor in a `.pt` file as signed values (range checks are the caller's).
pub(crate) fn read_pt(bytes: &[u8]) -> Result<Vec<i64>, TorchError> {
    if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
        read_zip(bytes)
    } else if bytes.get(257..262) == Some(b"ustar") {
        Err(TorchError::LegacyTar)
    } else if bytes.first() == Some(&0x80) {
        read_legacy(bytes)
    } else {
        Err(TorchError::NotTorch(
            "neither a zip archive (torch>=1.6) nor a legacy torch pickle".into(),
        ))
    }
}

fn read_zip(bytes: &[u8]) -> Result<Vec<i64>, TorchError> {
    let mut zip =
        zip::ZipArchive::new(Cursor::new(bytes)).map_err(|e| TorchError::Zip(e.to_string()))?;
    let names: Vec<String> = zip
        .file_names()
        .filter_map(|n| n.ok().map(|n| n.into_owned()))
        .collect();
    let pkls: Vec<&String> = names
        .iter()
        .filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .collect();
    let pkl = match pkls.as_slice() {
        [one] => (*one).clone(),
        [] if names.iter().any(|n| n.ends_with("constants.pkl")) => {
            return Err(TorchError::NotTorch(
                "a TorchScript archive (torch.jit.save), not a tensor saved with torch.save".into(),
            ));
        }
        [] => {
            return Err(TorchError::NotTorch(
                "the zip archive has no <prefix>/data.pkl member".into(),
            ));
        }
        _ => {
            return Err(TorchError::NotTorch(format!(
                "the zip archive has {} data.pkl members",
                pkls.len()
            )));
        }
    };
    let prefix = &pkl[..pkl.len() - "data.pkl".len()];

    // torch >= 2.1 records the byte order; older archives are little-endian.
    let order_member = format!("{prefix}byteorder");
    let big_endian = if names.contains(&order_member) {
        match read_member(&mut zip, &order_member, 16)?.as_slice() {
            b"little" => false,
            b"big" => true,
            other => {
                return Err(TorchError::Content(format!(
                    "{order_member} says {:?}; expected \"little\" or \"big\"",
                    String::from_utf8_lossy(other)
                )));
            }
        }
    } else {
        false
    };

    let pkl_bytes = read_member(&mut zip, &pkl, MAX_PICKLE)?;
    let (pickle, used) = Pickle::parse(&pkl_bytes).map_err(|source| TorchError::Pickle {
        part: pkl.clone(),
        source,
    })?;
    if used != pkl_bytes.len() {
        return Err(TorchError::Content(format!(
            "{pkl} has {} bytes after the end of its pickle",
            pkl_bytes.len() - used
        )));
    }
    let tensor = find_tensor(&pickle, &pkl)?;
    let dtype = code_dtype(&tensor.storage.class)?;
    let member = format!("{prefix}data/{}", tensor.storage.key);
    if !names.contains(&member) {
        return Err(TorchError::Content(format!(
            "the archive has no storage member {member} (the pickle refers to it)"
        )));
    }
    let expected = storage_bytes(&tensor.storage, dtype.size())?;
    let data = read_member(&mut zip, &member, expected)?;
    gather(&tensor, dtype, &data, &member, big_endian)
}

/// Reads a member of at most `max` bytes (the limit comes before any allocation).
fn read_member(
    zip: &mut zip::ZipArchive<Cursor<&[u8]>>,
    name: &str,
    max: u64,
) -> Result<Vec<u8>, TorchError> {
    let file = zip
        .by_name(name)
        .map_err(|e| TorchError::Zip(format!("member {name}: {e}")))?;
    if file.size() > max {
        return Err(TorchError::Content(format!(
            "member {name} holds {} bytes; expected at most {max}",
            file.size()
        )));
    }
    let mut out = Vec::new();
    file.take(max)
        .read_to_end(&mut out)
        .map_err(|e| TorchError::Zip(format!("member {name}: {e}")))?;
    Ok(out)
}

fn storage_bytes(s: &StorageRef, elem: usize) -> Result<u64, TorchError> {
    s.numel
        .checked_mul(elem as u64)
        .ok_or_else(|| TorchError::Content(format!("storage size {} overflows", s.numel)))
}

/// Torch's pre-1.6 format: magic, protocol and sys-info pickles, the object pickle, a pickle
/// listing storage keys, then per key an int64 element count and the raw elements.
fn read_legacy(bytes: &[u8]) -> Result<Vec<i64>, TorchError> {
    let mut pos = 0usize;
    let mut next = |part: &str| -> Result<Pickle, TorchError> {
        let (p, n) = Pickle::parse(&bytes[pos..]).map_err(|source| TorchError::Pickle {
            part: format!("legacy {part} pickle (at byte {pos})"),
            source,
        })?;
        pos += n;
        Ok(p)
    };
    let magic = next("magic-number")?;
    if magic.as_int(magic.root()) != Some(LEGACY_MAGIC) {
        return Err(TorchError::NotTorch(
            "a pickle, but not one torch.save wrote (no torch magic number)".into(),
        ));
    }
    let proto = next("protocol")?;
    if proto.as_int(proto.root()) != Some(LEGACY_PROTOCOL) {
        return Err(TorchError::Content(format!(
            "legacy torch protocol {}; only {LEGACY_PROTOCOL} is known",
            proto.describe(proto.root())
        )));
    }
    let sys = next("sys-info")?;
    if let Value::Dict(items) = sys.get(sys.root()) {
        let big = items.iter().any(|(k, v)| {
            sys.as_str(*k) == Some("little_endian") && *sys.get(*v) == Value::Bool(false)
        });
        if big {
            return Err(TorchError::Content(
                "a big-endian legacy torch file; re-save with torch>=1.6".into(),
            ));
        }
    }
    let main = next("object")?;
    let tensor = find_tensor(&main, "the legacy object pickle")?;
    let dtype = code_dtype(&tensor.storage.class)?;
    let keys = next("storage-keys")?;

    // Element size per storage key, from every persistent id in the object pickle.
    let mut sizes: HashMap<String, usize> = HashMap::new();
    for v in main.values() {
        if let Value::PersId(t) = v {
            let s = storage_ref(&main, *t)?;
            let size = element_size(&s.class).ok_or_else(|| {
                TorchError::Content(format!("unknown storage class torch.{}", s.class))
            })?;
            sizes.insert(s.key, size);
        }
    }
    let key_ids: Vec<Id> = match keys.get(keys.root()) {
        Value::List(l) | Value::Tuple(l) => l.clone(),
        _ => {
            return Err(TorchError::Content(
                "the legacy storage-key pickle is not a list".into(),
            ));
        }
    };
    let mut found: Option<&[u8]> = None;
    for id in key_ids {
        let key = keys
            .as_str(id)
            .ok_or_else(|| TorchError::Content("a legacy storage key is not a string".into()))?;
        let elem = *sizes.get(key).ok_or_else(|| {
            TorchError::Content(format!("legacy storage {key:?} is not used by the object"))
        })?;
        let count = bytes
            .get(pos..pos + 8)
            .map(|b| {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                u64::from_le_bytes(a)
            })
            .ok_or_else(|| TorchError::Content(format!("legacy storage {key:?} is truncated")))?;
        pos += 8;
        let len = count
            .checked_mul(elem as u64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| pos.checked_add(*n).is_some_and(|end| end <= bytes.len()))
            .ok_or_else(|| TorchError::Content(format!("legacy storage {key:?} is truncated")))?;
        if key == tensor.storage.key {
            found = Some(&bytes[pos..pos + len]);
        }
        pos += len;
    }
    let data = found.ok_or_else(|| {
        TorchError::Content(format!(
            "the legacy file has no data for storage {:?}",
            tensor.storage.key
        ))
    })?;
    // The legacy writer always stores little-endian data.
    gather(&tensor, dtype, data, "the legacy storage", false)
}

/// The tensor at the root: a tensor itself, or a dict holding one tensor (or a "codes" entry).
fn find_tensor(p: &Pickle, part: &str) -> Result<TensorRef, TorchError> {
    let root = p.root();
    if let Some(t) = tensor_at(p, root)? {
        return Ok(t);
    }
    let items: &[(Id, Id)] = match p.get(root) {
        Value::Dict(d) => d,
        Value::Object { func, items, .. }
            if p.global_name(*func).as_deref() == Some("collections.OrderedDict") =>
        {
            items
        }
        _ => &[],
    };
    let pick = items
        .iter()
        .find(|(k, _)| p.as_str(*k) == Some("codes"))
        .or(if items.len() == 1 {
            items.first()
        } else {
            None
        });
    if let Some((_, v)) = pick
        && let Some(t) = tensor_at(p, *v)?
    {
        return Ok(t);
    }
    Err(TorchError::Content(format!(
        "{part} holds {}, not a tensor of codes",
        p.describe(root)
    )))
}

/// `Some` when `id` is a `_rebuild_tensor(_v2)` call; an error when it is one we cannot use.
fn tensor_at(p: &Pickle, id: Id) -> Result<Option<TensorRef>, TorchError> {
    let Value::Object { func, args, .. } = p.get(id) else {
        return Ok(None);
    };
    let name = p.global_name(*func).unwrap_or_default();
    if name != "torch._utils._rebuild_tensor_v2" && name != "torch._utils._rebuild_tensor" {
        if name.starts_with("torch.") {
            return Err(TorchError::Content(format!(
                "the file holds {name}(...), not a plain tensor of codes"
            )));
        }
        return Ok(None);
    }
    let bad = |what: &str| TorchError::Content(format!("{name} arguments: {what}"));
    let args = p.as_tuple(*args).ok_or_else(|| bad("not a tuple"))?;
    let [storage, offset, size, stride, ..] = args else {
        return Err(bad("fewer than 4"));
    };
    let Value::PersId(pid) = p.get(*storage) else {
        return Err(bad("the storage is not a persistent id"));
    };
    let storage = storage_ref(p, *pid)?;
    let offset = p
        .as_int(*offset)
        .and_then(|o| u64::try_from(o).ok())
        .ok_or_else(|| bad("the storage offset is not a non-negative integer"))?;
    let ints = |id: Id, what: &str| -> Result<Vec<i128>, TorchError> {
        let t = p
            .as_tuple(id)
            .ok_or_else(|| bad(&format!("the {what} is not a tuple")))?;
        t.iter()
            .map(|i| {
                p.as_int(*i)
                    .ok_or_else(|| bad(&format!("the {what} holds a non-integer")))
            })
            .collect()
    };
    let size: Vec<u64> = ints(*size, "size")?
        .into_iter()
        .map(|s| u64::try_from(s).map_err(|_| bad("a negative size")))
        .collect::<Result<_, _>>()?;
    let stride: Vec<i64> = ints(*stride, "stride")?
        .into_iter()
        .map(|s| i64::try_from(s).map_err(|_| bad("a stride out of range")))
        .collect::<Result<_, _>>()?;
    if size.len() != stride.len() {
        return Err(bad("size and stride differ in length"));
    }
    Ok(Some(TensorRef {
        storage,
        offset,
        size,
        stride,
    }))
}

/// `('storage', torch.XStorage, key, location, numel)`, plus a view entry in the legacy format.
fn storage_ref(p: &Pickle, id: Id) -> Result<StorageRef, TorchError> {
    let bad = || {
        TorchError::Content(format!(
            "unexpected persistent id {}; expected ('storage', torch.<Type>Storage, key, location, numel)",
            p.describe(id)
        ))
    };
    let t = p.as_tuple(id).ok_or_else(bad)?;
    let (kind, class, key, numel, view) = match t {
        [kind, class, key, _location, numel] => (kind, class, key, numel, None),
        [kind, class, key, _location, numel, view] => (kind, class, key, numel, Some(view)),
        _ => return Err(bad()),
    };
    if p.as_str(*kind) != Some("storage") {
        return Err(bad());
    }
    let class = match p.get(*class) {
        Value::Global { module, name } if module == "torch" => name.clone(),
        _ => return Err(bad()),
    };
    if let Some(view) = view
        && *p.get(*view) != Value::None
    {
        return Err(TorchError::Content(
            "the tensor is a view into a shared legacy storage; re-save it with torch>=1.6 \
             after .clone()"
                .into(),
        ));
    }
    // Keys are strings ("0") in the zip format; legacy files use str(id) too.
    let key = match p.get(*key) {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        _ => return Err(bad()),
    };
    let numel = p
        .as_int(*numel)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(bad)?;
    Ok(StorageRef { class, key, numel })
}

/// The tensor's values: shape squeezed to one dimension, which must be contiguous.
fn gather(
    t: &TensorRef,
    dtype: Dtype,
    data: &[u8],
    member: &str,
    big_endian: bool,
) -> Result<Vec<i64>, TorchError> {
    let expected = storage_bytes(&t.storage, dtype.size())?;
    if data.len() as u64 != expected {
        return Err(TorchError::Content(format!(
            "{member} holds {} bytes; the pickle says {} {} values ({expected} bytes)",
            data.len(),
            t.storage.numel,
            dtype.name()
        )));
    }
    if t.size.is_empty() {
        return Err(TorchError::Content(
            "the tensor is a scalar, not a sequence of codes".into(),
        ));
    }
    // Dimensions of size 1 carry no layout ([1, N] and [1, 1, N] are how encoders return codes).
    let kept: Vec<(u64, i64)> = t
        .size
        .iter()
        .zip(&t.stride)
        .filter(|(s, _)| **s != 1)
        .map(|(s, st)| (*s, *st))
        .collect();
    let (n, stride) = match kept.as_slice() {
        [] => (1, 1),
        [(n, s)] => (*n, *s),
        _ => {
            return Err(TorchError::Content(format!(
                "the tensor has shape {:?}; codes must be one sequence (1-D, [1, N] or [1, 1, N])",
                t.size
            )));
        }
    };
    if n == 0 {
        return Err(TorchError::Content(format!(
            "the tensor is empty (shape {:?})",
            t.size
        )));
    }
    if n > 1 && stride != 1 {
        return Err(TorchError::Content(format!(
            "the tensor is not contiguous (shape {:?}, stride {:?}); save codes.contiguous()",
            t.size, t.stride
        )));
    }
    let end = t
        .offset
        .checked_add(n)
        .filter(|e| *e <= t.storage.numel)
        .ok_or_else(|| {
            TorchError::Content(format!(
                "the tensor (offset {}, {} values) runs past its storage of {} values",
                t.offset, n, t.storage.numel
            ))
        })?;
    let elem = dtype.size();
    // Both bounds are within `data` (checked against numel * elem above), so they fit in usize.
    let (start, end) = (t.offset as usize * elem, end as usize * elem);
    Ok(data[start..end]
        .chunks_exact(elem)
        .map(|b| dtype.read(b, big_endian))
        .collect())
}
