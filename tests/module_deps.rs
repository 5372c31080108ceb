//! The library's modules depend on one another without cycles, so each can be read, tested and
//! changed from the bottom up (docs/design.md draws the order). Read from the source: every
//! `crate::`, `super::` and `self::` path in `src/` (test modules and comments aside) is an edge
//! from the module of its file to the deepest module it names. Two levels are checked: the
//! crate's top-level modules, and the children of any one module (a module's own file, where
//! its stage error and re-exports live, may be used by all its children).
//!
//! A path through a parent's re-export counts as an edge to the parent, so a cycle hidden behind
//! `pub use` is not seen; the grep in docs/design.md's "Module order" is the other half.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `engine/worker/proxy.rs` -> ["engine", "worker", "proxy"]; `audio/mod.rs` -> ["audio"];
/// `lib.rs` -> [].
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The source without `//` comments and without `#[cfg(test)] mod x { ... }` blocks.
fn code_of(src: &str) -> String {
    let no_comments: String = src
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = String::new();
    let mut rest = no_comments.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_block = trimmed.starts_with("mod ")
            && trimmed
                .find(['{', ';'])
                .is_some_and(|i| trimmed.as_bytes()[i] == b'{');
        if !is_block {
            rest = after;
            continue;
        }
        let open = after.find('{').expect("block");
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths of a use tree starting at `s` (just after `crate::`, `super::` or `self::`).
fn use_tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let s = s.trim_start();
    if let Some(inner) = s.strip_prefix('{') {
        let mut depth = 1usize;
        let mut start = 0usize;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        use_tree(&inner[start..i], prefix, out);
                        return;
                    }
                }
                ',' if depth == 1 => {
                    use_tree(&inner[start..i], prefix, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let end = s.find(|c: char| !is_ident(c)).unwrap_or(s.len());
    if end == 0 {
        if !prefix.is_empty() {
            out.push(prefix.to_vec());
        }
        return;
    }
    let mut path = prefix.to_vec();
    path.push(s[..end].to_owned());
    match s[end..].strip_prefix("::") {
        Some(rest) => use_tree(rest, &path, out),
        None => out.push(path),
    }
}

/// Every module path `code` (of module `me`) names, made absolute.
fn named_paths(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("::") {
        let head_start = code[..at]
            .rfind(|c: char| !is_ident(c))
            .map_or(0, |i| i + 1);
        let head = &code[head_start..at];
        if code[..head_start].ends_with("::") {
            continue;
        }
        // A file's module is `me` (a `mod.rs` is its directory's module); `super` is its parent.
        let base: Vec<String> = match head {
            "crate" => Vec::new(),
            "self" => me.to_vec(),
            "super" => me[..me.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        let mut paths = Vec::new();
        use_tree(&code[at + 2..], &[], &mut paths);
        for p in paths {
            let mut abs = base.clone();
            for seg in p {
                if seg == "super" {
                    abs.pop();
                } else if seg != "self" {
                    abs.push(seg);
                }
            }
            out.push(abs);
        }
    }
    out
}

/// Module -> the modules it names (deepest known module of each path), itself excluded.
fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    // The binary (src/bin/) is a crate of its own over the library: its `crate::` is not the
    // library's.
    files.retain(|f| !f.strip_prefix(&src).is_ok_and(|r| r.starts_with("bin")));
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(&src).expect("under src")))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let me = module_of(rel);
        let code = code_of(&std::fs::read_to_string(f).expect("read"));
        for p in named_paths(&code, &me) {
            let target = (0..=p.len())
                .rev()
                .map(|n| p[..n].to_vec())
                .find(|m| modules.contains(m))
                .unwrap_or_default();
            if target != me {
                edges.entry(me.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// A cycle in `g`, as the nodes along it, if there is one.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_owned(), 1);
        stack.push(n.to_owned());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|s| s == m).expect("on stack");
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, g, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// The edges between the children of `parent` (for `parent` = [] the top-level modules).
fn children_graph(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    parent: &[String],
) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let child = |m: &Vec<String>| -> Option<String> {
        (m.len() > parent.len() && m[..parent.len()] == *parent).then(|| m[parent.len()].clone())
    };
    for (a, bs) in edges {
        let Some(ca) = child(a) else { continue };
        for b in bs {
            if let Some(cb) = child(b)
                && cb != ca
            {
                g.entry(ca.clone()).or_default().insert(cb);
            }
        }
    }
    g
}

#[test]
fn top_level_modules_have_no_cycles() {
    let edges = graph();
    let top = children_graph(&edges, &[]);
    assert!(top.contains_key("synth"), "the graph was read: {top:?}");
    if let Some(c) = find_cycle(&top) {
        panic!("module cycle: {}", c.join(" -> "));
    }
}

#[test]
fn no_module_has_children_in_a_cycle() {
    let edges = graph();
    let parents: BTreeSet<Vec<String>> = edges
        .keys()
        .chain(edges.values().flatten())
        .filter(|m| !m.is_empty())
        .map(|m| m[..m.len() - 1].to_vec())
        .collect();
    for p in parents.iter().filter(|p| !p.is_empty()) {
        if let Some(c) = find_cycle(&children_graph(&edges, p)) {
            panic!("module cycle inside {}: {}", p.join("::"), c.join(" -> "));
        }
    }
}

#[test]
fn the_codec_does_not_depend_on_the_engine() {
    let edges = graph();
    for (m, deps) in edges
        .iter()
        .filter(|(m, _)| m.first().is_some_and(|f| f == "codec"))
    {
        assert!(
            !deps
                .iter()
                .any(|d| d.first().is_some_and(|f| f == "engine")),
            "{} depends on {deps:?}",
            m.join("::")
        );
    }
}

#[test]
fn the_reader_sees_use_trees_and_relative_paths() {
    let me: Vec<String> = vec!["engine".into(), "oga".into()];
    let code = "use super::{Backbone, worker::{proxy, child}};\nuse crate::package::{self, genai};\nlet x = crate::runtime::info();";
    let mut got = named_paths(code, &me);
    got.sort();
    let want: Vec<Vec<String>> = [
        "crate:engine:Backbone",
        "crate:engine:worker:child",
        "crate:engine:worker:proxy",
        "crate:package",
        "crate:package:genai",
        "crate:runtime:info",
    ]
    .iter()
    .map(|s| s.split(':').skip(1).map(str::to_owned).collect())
    .collect();
    assert_eq!(got, want);
    assert_eq!(
        code_of("a\n#[cfg(test)]\nmod tests { use crate::x; { } }\nb // crate::y"),
        "a\n\nb "
    );
}
