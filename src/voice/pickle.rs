//! A small pickle reader for the opcodes `torch.save` emits, and nothing more.
//!
//! Python's unpickler runs code (`GLOBAL` + `REDUCE` call arbitrary callables), so a voice file
//! from the internet must never go through it. This reader only builds a tree of plain values:
//! a `GLOBAL` is a name, a `REDUCE` is a record of "this callable with these arguments", and the
//! caller decides what, if anything, such a record means. Nothing is ever called or imported.
//!
//! Values live in an arena and refer to each other by index. That keeps the pickle's sharing
//! semantics (a dict memoized with `BINPUT` and filled later by `SETITEMS` is the same object when
//! fetched back with `BINGET`) while memory stays linear in the input: each opcode adds at most one
//! node, so a hostile file cannot blow up by repeating `BINGET`s.

use std::collections::HashMap;

/// Index of a value in [`Pickle`]'s arena.
pub(crate) type Id = usize;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    /// Every integer opcode; `LONG1`/`LONG4` up to 16 bytes (torch's legacy magic number needs 10).
    Int(i128),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Id>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    /// `GLOBAL` / `STACK_GLOBAL`: a dotted name, never resolved.
    Global {
        module: String,
        name: String,
    },
    /// `BINPERSID`: the persistent id torch uses for storages.
    PersId(Id),
    /// `REDUCE` / `NEWOBJ`: `func(*args)`, plus what `BUILD`, `SETITEM(S)` and `APPEND(S)` added.
    Object {
        func: Id,
        args: Id,
        state: Option<Id>,
        items: Vec<(Id, Id)>,
        list: Vec<Id>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum PickleError {
    #[error("the pickle ends early (at byte {0})")]
    Truncated(usize),
    #[error("unsupported pickle opcode 0x{op:02x} at byte {pos}")]
    Unsupported { op: u8, pos: usize },
    #[error("malformed pickle at byte {pos}: {msg}")]
    Malformed { pos: usize, msg: String },
}

/// One parsed pickle: an arena of values and the root the `STOP` opcode returned.
#[derive(Debug)]
pub(crate) struct Pickle {
    arena: Vec<Value>,
    root: Id,
}

impl Pickle {
    /// Parses one pickle from the start of `data`; returns it and the number of bytes it used
    /// (torch's legacy format concatenates several pickles and raw data in one file).
    pub(crate) fn parse(data: &[u8]) -> Result<(Pickle, usize), PickleError> {
        Parser {
            data,
            pos: 0,
            arena: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
        .run()
    }

    pub(crate) fn root(&self) -> Id {
        self.root
    }

    pub(crate) fn get(&self, id: Id) -> &Value {
        // Ids only come from this arena, so the index is always in range.
        &self.arena[id]
    }

    /// Every value, for callers that look for all persistent ids.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Value> {
        self.arena.iter()
    }

    pub(crate) fn as_str(&self, id: Id) -> Option<&str> {
        match self.get(id) {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_int(&self, id: Id) -> Option<i128> {
        match self.get(id) {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub(crate) fn as_tuple(&self, id: Id) -> Option<&[Id]> {
        match self.get(id) {
            Value::Tuple(t) => Some(t),
            _ => None,
        }
    }

    /// `module.name` when `id` is a global.
    pub(crate) fn global_name(&self, id: Id) -> Option<String> {
        match self.get(id) {
            Value::Global { module, name } => Some(format!("{module}.{name}")),
            _ => None,
        }
    }

    /// A short description for error messages; bounded depth, so cycles and deep nesting are fine.
    pub(crate) fn describe(&self, id: Id) -> String {
        self.describe_depth(id, 3)
    }

    fn describe_depth(&self, id: Id, depth: usize) -> String {
        let list = |ids: &[Id], open: &str, close: &str| {
            if depth == 0 {
                return format!("{open}...{close}");
            }
            let mut parts: Vec<String> = ids
                .iter()
                .take(6)
                .map(|i| self.describe_depth(*i, depth - 1))
                .collect();
            if ids.len() > 6 {
                parts.push("...".into());
            }
            format!("{open}{}{close}", parts.join(", "))
        };
        match self.get(id) {
            Value::None => "None".into(),
            Value::Bool(b) => if *b { "True" } else { "False" }.into(),
            Value::Int(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Str(s) => format!("{:?}", truncate(s, 40)),
            Value::Bytes(b) => format!("<{} bytes>", b.len()),
            Value::Tuple(t) => list(t, "(", ")"),
            Value::List(l) => list(l, "[", "]"),
            Value::Dict(d) => match d.len() {
                1 => "a dict of 1 item".into(),
                n => format!("a dict of {n} items"),
            },
            Value::Global { module, name } => format!("{module}.{name}"),
            Value::PersId(p) => format!("persistent id {}", self.describe_depth(*p, depth)),
            Value::Object { func, .. } => {
                format!("a {} object", self.describe_depth(*func, depth))
            }
        }
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    arena: Vec<Value>,
    stack: Vec<Id>,
    /// Stack lengths at each `MARK`.
    marks: Vec<usize>,
    memo: HashMap<u32, Id>,
}

impl<'a> Parser<'a> {
    fn run(mut self) -> Result<(Pickle, usize), PickleError> {
        loop {
            let at = self.pos;
            let op = self.u8()?;
            match op {
                // PROTO: torch writes 2; the opcodes below cover protocols 2..5 as far as
                // torch uses them.
                0x80 => {
                    let v = self.u8()?;
                    if !(2..=5).contains(&v) {
                        return Err(self.malformed(at, format!("pickle protocol {v}")));
                    }
                }
                // FRAME (protocol 4+): only a read-ahead hint.
                0x95 => {
                    self.take(8)?;
                }
                b'.' => {
                    // STOP
                    let root = self.pop(at)?;
                    return Ok((
                        Pickle {
                            arena: self.arena,
                            root,
                        },
                        self.pos,
                    ));
                }
                b'(' => self.marks.push(self.stack.len()),
                b'N' => self.push(Value::None),
                0x88 => self.push(Value::Bool(true)),
                0x89 => self.push(Value::Bool(false)),
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v.into()));
                }
                b'M' => {
                    let b = self.take(2)?;
                    self.push(Value::Int(u16::from_le_bytes([b[0], b[1]]).into()));
                }
                b'J' => {
                    let b = self.take(4)?;
                    self.push(Value::Int(
                        i32::from_le_bytes([b[0], b[1], b[2], b[3]]).into(),
                    ));
                }
                0x8a | 0x8b => {
                    // LONG1 / LONG4: little-endian two's complement of n bytes.
                    let n = if op == 0x8a {
                        self.u8()?.into()
                    } else {
                        self.len32()?
                    };
                    if n > 16 {
                        return Err(self.malformed(at, format!("a {n}-byte integer")));
                    }
                    let b = self.take(n)?;
                    self.push(Value::Int(long_le(b)));
                }
                b'G' => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.push(Value::Float(f64::from_be_bytes(a)));
                }
                b'X' | 0x8c | 0x8d | b'T' | b'U' => {
                    // BINUNICODE, SHORT_BINUNICODE, BINUNICODE8, and the Python 2 BINSTRING /
                    // SHORT_BINSTRING that legacy files written under Python 2 carry.
                    let n = match op {
                        0x8c | b'U' => self.u8()?.into(),
                        0x8d => self.len64()?,
                        _ => self.len32()?,
                    };
                    let b = self.take(n)?;
                    let s = std::str::from_utf8(b)
                        .map_err(|_| self.malformed(at, "a string that is not UTF-8".into()))?;
                    let s = s.to_owned();
                    self.push(Value::Str(s));
                }
                b'C' | b'B' | 0x8e => {
                    // SHORT_BINBYTES, BINBYTES, BINBYTES8
                    let n = match op {
                        b'C' => self.u8()?.into(),
                        0x8e => self.len64()?,
                        _ => self.len32()?,
                    };
                    let b = self.take(n)?.to_vec();
                    self.push(Value::Bytes(b));
                }
                b'c' => {
                    let module = self.line(at)?;
                    let name = self.line(at)?;
                    self.push(Value::Global { module, name });
                }
                0x93 => {
                    // STACK_GLOBAL
                    let name = self.pop(at)?;
                    let module = self.pop(at)?;
                    match (self.arena[module].clone(), self.arena[name].clone()) {
                        (Value::Str(module), Value::Str(name)) => {
                            self.push(Value::Global { module, name })
                        }
                        _ => {
                            return Err(self.malformed(at, "STACK_GLOBAL needs two strings".into()));
                        }
                    }
                }
                b'Q' => {
                    let pid = self.pop(at)?;
                    self.push(Value::PersId(pid));
                }
                b')' => self.push(Value::Tuple(Vec::new())),
                b']' => self.push(Value::List(Vec::new())),
                b'}' => self.push(Value::Dict(Vec::new())),
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() < floor + n {
                        return Err(self.malformed(at, "a tuple with too few items".into()));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.push(Value::Tuple(items));
                }
                b't' => {
                    let items = self.pop_mark(at)?;
                    self.push(Value::Tuple(items));
                }
                b'l' => {
                    let items = self.pop_mark(at)?;
                    self.push(Value::List(items));
                }
                b'd' => {
                    let items = self.pop_mark(at)?;
                    let pairs = pairs(&items).ok_or_else(|| {
                        self.malformed(at, "a dict with an odd number of items".into())
                    })?;
                    self.push(Value::Dict(pairs));
                }
                b'a' => {
                    let v = self.pop(at)?;
                    self.extend_list(at, vec![v])?;
                }
                b'e' => {
                    let items = self.pop_mark(at)?;
                    self.extend_list(at, items)?;
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    self.extend_dict(at, vec![(k, v)])?;
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    let pairs = pairs(&items).ok_or_else(|| {
                        self.malformed(at, "SETITEMS with an odd number of items".into())
                    })?;
                    self.extend_dict(at, pairs)?;
                }
                b'R' | 0x81 => {
                    // REDUCE / NEWOBJ: recorded, never called.
                    let args = self.pop(at)?;
                    let func = self.pop(at)?;
                    self.push(Value::Object {
                        func,
                        args,
                        state: None,
                        items: Vec::new(),
                        list: Vec::new(),
                    });
                }
                b'b' => {
                    let st = self.pop(at)?;
                    let obj = self.top(at)?;
                    match &mut self.arena[obj] {
                        Value::Object { state, .. } => *state = Some(st),
                        _ => return Err(self.malformed(at, "BUILD on a non-object".into())),
                    }
                }
                b'q' => {
                    let k = self.u8()?.into();
                    self.put(at, k)?;
                }
                b'r' => {
                    let b = self.take(4)?;
                    self.put(at, u32::from_le_bytes([b[0], b[1], b[2], b[3]]))?;
                }
                0x94 => {
                    // MEMOIZE: the next free memo index.
                    let k = u32::try_from(self.memo.len())
                        .map_err(|_| self.malformed(at, "memo overflow".into()))?;
                    self.put(at, k)?;
                }
                b'h' | b'j' => {
                    let k = if op == b'h' {
                        self.u8()?.into()
                    } else {
                        let b = self.take(4)?;
                        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                    };
                    let id = *self
                        .memo
                        .get(&k)
                        .ok_or_else(|| self.malformed(at, format!("memo key {k} is not set")))?;
                    // The same object again, not a copy (see the module comment).
                    self.stack.push(id);
                }
                b'0' => {
                    self.pop(at)?;
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let id = self.top(at)?;
                    self.stack.push(id);
                }
                _ => return Err(PickleError::Unsupported { op, pos: at }),
            }
        }
    }

    fn malformed(&self, pos: usize, msg: String) -> PickleError {
        PickleError::Malformed { pos, msg }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        // Lengths come from the file: check them against what is left before slicing or
        // allocating, so a huge length is an error and not an allocation.
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.data.len())
            .ok_or(PickleError::Truncated(self.data.len()))?;
        let data: &'a [u8] = self.data;
        self.pos = end;
        Ok(&data[end - n..end])
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn len32(&mut self) -> Result<usize, PickleError> {
        let b = self.take(4)?;
        usize::try_from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .map_err(|_| PickleError::Truncated(self.data.len()))
    }

    fn len64(&mut self) -> Result<usize, PickleError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        usize::try_from(u64::from_le_bytes(a)).map_err(|_| PickleError::Truncated(self.data.len()))
    }

    /// A newline-terminated ASCII line (the `GLOBAL` operands).
    fn line(&mut self, at: usize) -> Result<String, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|b| *b == b'\n')
            .ok_or(PickleError::Truncated(self.data.len()))?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| self.malformed(at, "a GLOBAL name that is not UTF-8".into()))?
            .to_owned();
        self.pos += n + 1;
        Ok(s)
    }

    fn push(&mut self, v: Value) {
        self.arena.push(v);
        self.stack.push(self.arena.len() - 1);
    }

    fn pop(&mut self, at: usize) -> Result<Id, PickleError> {
        // A MARK hides what is below it.
        if self.marks.last().is_some_and(|m| *m >= self.stack.len()) {
            return Err(self.malformed(at, "pop across a MARK".into()));
        }
        self.stack
            .pop()
            .ok_or_else(|| self.malformed(at, "pop from an empty stack".into()))
    }

    fn top(&self, at: usize) -> Result<Id, PickleError> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.malformed(at, "an empty stack".into()))
    }

    fn pop_mark(&mut self, at: usize) -> Result<Vec<Id>, PickleError> {
        let m = self
            .marks
            .pop()
            .ok_or_else(|| self.malformed(at, "no MARK".into()))?;
        if m > self.stack.len() {
            return Err(self.malformed(at, "a MARK above the stack".into()));
        }
        Ok(self.stack.split_off(m))
    }

    fn put(&mut self, at: usize, k: u32) -> Result<(), PickleError> {
        let id = self.top(at)?;
        self.memo.insert(k, id);
        Ok(())
    }

    fn extend_list(&mut self, at: usize, items: Vec<Id>) -> Result<(), PickleError> {
        let target = self.top(at)?;
        match &mut self.arena[target] {
            Value::List(l) | Value::Object { list: l, .. } => {
                l.extend(items);
                Ok(())
            }
            _ => Err(self.malformed(at, "APPEND to a non-list".into())),
        }
    }

    fn extend_dict(&mut self, at: usize, items: Vec<(Id, Id)>) -> Result<(), PickleError> {
        let target = self.top(at)?;
        match &mut self.arena[target] {
            // An OrderedDict arrives as REDUCE(collections.OrderedDict, ()) + SETITEMS.
            Value::Dict(d) | Value::Object { items: d, .. } => {
                d.extend(items);
                Ok(())
            }
            _ => Err(self.malformed(at, "SETITEM on a non-dict".into())),
        }
    }
}

fn pairs(items: &[Id]) -> Option<Vec<(Id, Id)>> {
    items
        .len()
        .is_multiple_of(2)
        .then(|| items.chunks_exact(2).map(|c| (c[0], c[1])).collect())
}

/// Python's `LONG1`/`LONG4` payload: little-endian two's complement, at most 16 bytes.
fn long_le(b: &[u8]) -> i128 {
    if b.is_empty() {
        return 0;
    }
    let negative = b[b.len() - 1] & 0x80 != 0;
    let mut a = [if negative { 0xff } else { 0 }; 16];
    a[..b.len()].copy_from_slice(b);
    i128::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> Pickle {
        Pickle::parse(b).unwrap().0
    }

    #[test]
    fn integers_of_every_width() {
        for (bytes, want) in [
            (&b"\x80\x02K\x07."[..], 7i128),
            (b"\x80\x02M\x74\x01.", 372),
            (b"\x80\x02J\xff\xff\xff\xff.", -1),
            (b"\x80\x02\x8a\x00.", 0),
            (b"\x80\x02\x8a\x02\x00\x80.", -32768),
            (
                b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.",
                0x1950_a86a_20f9_469c_fc6c,
            ),
        ] {
            let p = parse(bytes);
            assert_eq!(p.as_int(p.root()), Some(want), "{bytes:?}");
        }
    }

    #[test]
    fn reports_how_much_it_read() {
        let (p, n) = Pickle::parse(b"\x80\x02K\x01.rest").unwrap();
        assert_eq!(n, 5);
        assert_eq!(p.as_int(p.root()), Some(1));
    }

    #[test]
    fn memo_returns_the_same_object_not_a_snapshot() {
        // EMPTY_DICT, BINPUT 0, MARK, 'a', 1, SETITEMS, POP, BINGET 0, STOP: the dict fetched back
        // must hold the item set after it was memoized (pickle semantics).
        let b = b"\x80\x02}q\x00(X\x01\x00\x00\x00aK\x01u0h\x00.";
        let p = parse(b);
        match p.get(p.root()) {
            Value::Dict(d) => assert_eq!(d.len(), 1),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn reduce_is_recorded_not_called() {
        let b = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00lsq\x00\x85R.";
        let p = parse(b);
        match p.get(p.root()) {
            Value::Object { func, args, .. } => {
                assert_eq!(p.global_name(*func).as_deref(), Some("os.system"));
                assert_eq!(p.as_tuple(*args).map(|t| t.len()), Some(1));
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert_eq!(
            Pickle::parse(b"\x80\x02X\xff\xff\xff\x7f").unwrap_err(),
            PickleError::Truncated(7)
        );
        assert_eq!(
            Pickle::parse(b"\x80\x02K").unwrap_err(),
            PickleError::Truncated(3)
        );
        assert!(matches!(
            Pickle::parse(b"\x80\x02i__builtin__\n").unwrap_err(),
            PickleError::Unsupported { op: b'i', pos: 2 }
        ));
        assert!(matches!(
            Pickle::parse(b"\x80\x02h\x05.").unwrap_err(),
            PickleError::Malformed { .. }
        ));
        assert!(matches!(
            Pickle::parse(b"\x80\x02.").unwrap_err(),
            PickleError::Malformed { .. }
        ));
        assert!(matches!(
            Pickle::parse(b"\x80\x02\x85.").unwrap_err(),
            PickleError::Malformed { .. }
        ));
        assert!(matches!(
            Pickle::parse(b"\x80\x02K\x01(\x85.").unwrap_err(),
            PickleError::Malformed { .. }
        ));
        assert!(matches!(
            Pickle::parse(b"\x80\x02(.").unwrap_err(),
            PickleError::Malformed { .. }
        ));
        assert!(Pickle::parse(b"").is_err());
        assert!(Pickle::parse(b"\x80\x09.").is_err());
    }

    #[test]
    fn every_prefix_of_a_torch_pickle_fails_cleanly() {
        // The data.pkl of the vendor's dave.pt (372 int32 codes).
        let full: &[u8] = b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x01ctorch\nIntStorage\nq\x02X\x01\x00\x00\x000q\x03X\x03\x00\x00\x00cpuq\x04Mt\x01tq\x05QK\x00Mt\x01\x85q\x06K\x01\x85q\x07\x89ccollections\nOrderedDict\nq\x08)Rq\ttq\nRq\x0b.";
        let (p, n) = Pickle::parse(full).unwrap();
        assert_eq!(n, full.len());
        assert_eq!(
            p.describe(p.root()),
            "a torch._utils._rebuild_tensor_v2 object"
        );
        for cut in 0..full.len() {
            assert!(Pickle::parse(&full[..cut]).is_err(), "prefix {cut}");
        }
    }
}
