//! The core's modules form no import cycle: a module a cycle runs through cannot be read, changed or
//! tested without the others (graph.rs and functions.rs once needed each other only because `Model`
//! held `Vec<Function>`).
//!
//! Granularity: a node is a top-level module of the crate, a file `src/<name>.rs` or a folder
//! `src/<name>/` with everything under it (`passes/attention/grouped.rs` is `passes`, `writer/plan.rs`
//! is `writer`): submodules of one folder are one unit of this layout (and checked among themselves
//! below).
//! `lib.rs` is the root, not a node: it declares the modules and re-exports their items, and
//! `crate::Model` counts as a use of the module `lib.rs` re-exports `Model` from. An edge is any path
//! naming another top-level module in code — `use crate::x`, `crate::x::f()`, `crate::{x, y}`, a
//! `super::` chain climbing out to the root — in test code too (`#[cfg(test)]` modules are built and
//! kept by the same crate); comments, doc links and string literals do not count.
//!
//! Within a folder, its direct submodules form no cycle either (`writer/proto` -> `writer/value_info`
//! and back was the last one): `super::x` climbing to the folder and `crate::<folder>::x` are edges.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where an edge was first seen: file (relative to `src`) and line.
type Site = (String, usize);

/// module -> module it uses -> first place it does.
type Edges = BTreeMap<String, BTreeMap<String, Site>>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Other,
}

/// The tokens of Rust source that matter for paths, with their line, comments and literals skipped.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let at = |k: usize| chars.get(k).copied().unwrap_or('\0');
    // skips up to and including the closing quote of a (byte) string, counting lines
    let skip_string = |mut k: usize, line: &mut usize| {
        while k < chars.len() && chars[k] != '"' {
            if chars[k] == '\\' {
                k += 1;
            }
            if at(k) == '\n' {
                *line += 1;
            }
            k += 1;
        }
        k + 1
    };
    while i < chars.len() {
        let c = chars[i];
        let ident_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            loop {
                if i >= chars.len() {
                    break;
                }
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if !ident_before
            && (c == 'r' || (c == 'b' && at(i + 1) == 'r'))
            && matches!(at(i + usize::from(c == 'b') + 1), '"' | '#')
            && {
                // r"..", r#".."#, br#".."#: a raw string unless the hashes lead to no quote (r#ident)
                let mut k = i + usize::from(c == 'b') + 1;
                while at(k) == '#' {
                    k += 1;
                }
                at(k) == '"'
            }
        {
            let mut k = i + usize::from(c == 'b') + 1;
            let mut hashes = 0;
            while at(k) == '#' {
                hashes += 1;
                k += 1;
            }
            k += 1;
            loop {
                if k >= chars.len() {
                    break;
                }
                if chars[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#') {
                    k += 1 + hashes;
                    break;
                }
                if chars[k] == '\n' {
                    line += 1;
                }
                k += 1;
            }
            i = k;
        } else if c == '"' {
            i = skip_string(i + 1, &mut line);
        } else if c == '\'' {
            // a char literal ('x', '\n', '\u{..}'), or else a lifetime / label, whose name is skipped
            if at(i + 1) == '\\' {
                // past the backslash and the escaped character (which may be a quote)
                let mut k = i + 3;
                while k < chars.len() && chars[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            out.push((Tok::Ident(chars[start..i].iter().collect()), line));
        } else if c.is_ascii_digit() {
            while at(i).is_alphanumeric() || at(i) == '_' || at(i) == '.' {
                i += 1;
            }
            out.push((Tok::Other, line));
        } else {
            let tok = match c {
                ':' if at(i + 1) == ':' => {
                    i += 1;
                    Tok::PathSep
                }
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                _ => Tok::Other,
            };
            out.push((tok, line));
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

/// The first names of the paths at `toks[k..]` below the root: `x` of `x::..`, or `x`, `y` of
/// `{x::.., y, self}` (`self` is the root itself).
fn root_items(toks: &[(Tok, usize)], k: usize) -> Vec<String> {
    match toks.get(k) {
        Some((Tok::Ident(s), _)) => vec![s.clone()],
        Some((Tok::Open, _)) => {
            let (mut depth, mut items, mut expect) = (0usize, Vec::new(), true);
            for (t, _) in &toks[k..] {
                match t {
                    Tok::Open => {
                        depth += 1;
                        expect = depth == 1;
                    }
                    Tok::Close => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Comma if depth == 1 => expect = true,
                    Tok::Ident(s) if expect => {
                        if s != "self" {
                            items.push(s.clone());
                        }
                        expect = false;
                    }
                    _ => expect = false,
                }
            }
            items
        }
        _ => Vec::new(),
    }
}

/// Where a path starts in code: `crate::` (`climbs` None) or a `super::` chain climbing `climbs`
/// levels, with the number of inline `mod x { .. }` blocks open there (which `super::` climbs out of
/// first), the index of its first token after the prefix, and its line.
struct PathStart {
    climbs: Option<usize>,
    inline: usize,
    at: usize,
    line: usize,
}

fn path_starts(toks: &[(Tok, usize)]) -> Vec<PathStart> {
    let mut found = Vec::new();
    let mut depth = 0usize;
    let mut inline: Vec<usize> = Vec::new(); // the brace depth inside each open inline module
    let mut k = 0;
    while k < toks.len() {
        let (tok, line) = &toks[k];
        let path_sep_next = toks.get(k + 1).map(|t| &t.0) == Some(&Tok::PathSep);
        match tok {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(s) if s == "mod" => {
                if let (Some(_), Some((Tok::Open, _))) = (ident(toks.get(k + 1)), toks.get(k + 2)) {
                    inline.push(depth + 1);
                }
            }
            Tok::Ident(s) if s == "crate" && path_sep_next => found.push(PathStart {
                climbs: None,
                inline: inline.len(),
                at: k + 2,
                line: *line,
            }),
            Tok::Ident(s)
                if s == "super" && path_sep_next && (k == 0 || toks[k - 1].0 != Tok::PathSep) =>
            {
                let mut climbs = 0;
                let mut j = k;
                while ident(toks.get(j)) == Some("super")
                    && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::PathSep)
                {
                    climbs += 1;
                    j += 2;
                }
                found.push(PathStart {
                    climbs: Some(climbs),
                    inline: inline.len(),
                    at: j,
                    line: *line,
                });
                k = j;
                continue;
            }
            _ => {}
        }
        k += 1;
    }
    found
}

/// The names of the crate root's paths in one file: (name, line). `module` is the file's module path
/// (`["passes", "attention"]` for `passes/attention/mod.rs`), which inline `mod x { .. }` blocks extend
/// for `super::`.
fn root_references(src: &str, module: &[String]) -> Vec<(String, usize)> {
    let toks = tokens(src);
    let mut found = Vec::new();
    for p in path_starts(&toks) {
        if p.climbs.is_none_or(|c| c == module.len() + p.inline) {
            found.extend(
                root_items(&toks, p.at)
                    .into_iter()
                    .map(|item| (item, p.line)),
            );
        }
    }
    found
}

/// The names a file of a folder (`module`: `["writer", "proto"]`) reads from that folder: the items
/// of `super::` chains that climb to the folder (from the file or from an inline module in it) and of
/// `crate::<folder>::` paths, with their lines.
fn folder_references(src: &str, module: &[String]) -> Vec<(String, usize)> {
    let toks = tokens(src);
    let mut found = Vec::new();
    for p in path_starts(&toks) {
        let at = match p.climbs {
            None if ident(toks.get(p.at)) == Some(module[0].as_str())
                && toks.get(p.at + 1).map(|t| &t.0) == Some(&Tok::PathSep) =>
            {
                p.at + 2
            }
            Some(c) if c + 1 == module.len() + p.inline => p.at,
            _ => continue,
        };
        found.extend(root_items(&toks, at).into_iter().map(|item| (item, p.line)));
    }
    found
}

/// The edges between the direct submodules of each folder (`writer/proto` -> `writer/value_info`),
/// named `folder/child`: within a folder, files may not use each other in a cycle either.
fn folder_edges(files: &[(PathBuf, String)]) -> Edges {
    let mut children: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (p, _) in files {
        let m = module_path(p);
        if m.len() >= 2 {
            children
                .entry(m[0].clone())
                .or_default()
                .insert(m[1].clone());
        }
    }
    let mut edges = Edges::new();
    for (rel, src) in files {
        let m = module_path(rel);
        if m.len() < 2 {
            continue;
        }
        let from = format!("{}/{}", m[0], m[1]);
        edges.entry(from.clone()).or_default();
        for (name, line) in folder_references(src, &m[..2.min(m.len())]) {
            if name != m[1] && children[&m[0]].contains(&name) {
                edges
                    .entry(from.clone())
                    .or_default()
                    .entry(format!("{}/{name}", m[0]))
                    .or_insert_with(|| (rel.display().to_string(), line));
            }
        }
    }
    edges
}

/// Item name -> module for lib.rs's `pub use module::{A, B};` / `pub use module::A;` lines.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let toks = tokens(lib);
    let mut map = BTreeMap::new();
    for (k, w) in toks.windows(3).enumerate() {
        let (Tok::Ident(kw), Tok::Ident(module), Tok::PathSep) = (&w[0].0, &w[1].0, &w[2].0) else {
            continue;
        };
        if kw != "use" {
            continue;
        }
        for item in root_items(&toks, k + 3) {
            map.insert(item, module.clone());
        }
    }
    map
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("entry").path())
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

/// The module path of a file relative to `src` (`passes/attention/mod.rs` -> passes, attention).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The edges between top-level modules of the sources `(path relative to src, text)`, lib.rs among
/// them. Panics on a root name that is neither a module nor one of lib.rs's re-exports, so that an
/// unresolved path cannot hide an edge.
fn edges(files: &[(PathBuf, String)]) -> Edges {
    let lib = files
        .iter()
        .find(|(p, _)| p == Path::new("lib.rs"))
        .map(|(_, s)| s.as_str())
        .expect("lib.rs");
    let reexported = reexports(lib);
    let modules: BTreeSet<String> = files
        .iter()
        .filter(|(p, _)| p != Path::new("lib.rs"))
        .map(|(p, _)| module_path(p)[0].clone())
        .collect();
    let mut edges = Edges::new();
    for (rel, src) in files {
        if rel == Path::new("lib.rs") {
            continue;
        }
        let path = module_path(rel);
        let from = &path[0];
        edges.entry(from.clone()).or_default();
        for (name, line) in root_references(src, &path) {
            let to = if modules.contains(&name) {
                name
            } else if let Some(m) = reexported.get(&name) {
                m.clone()
            } else {
                panic!(
                    "{}:{line}: crate::{name} is neither a module nor re-exported by lib.rs",
                    rel.display()
                );
            };
            if &to != from {
                edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| (rel.display().to_string(), line));
            }
        }
    }
    edges
}

/// A cycle of `edges` as its modules, the first one repeated at the end; None when there is none.
fn find_cycle(edges: &Edges) -> Option<Vec<String>> {
    // depth-first, three colours: on the stack (grey) or done (black)
    fn visit<'a>(
        m: &'a str,
        edges: &'a Edges,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| *s == m) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|s| (*s).to_owned()).collect();
            cycle.push(m.to_owned());
            return Some(cycle);
        }
        if done.contains(m) {
            return None;
        }
        stack.push(m);
        for next in edges.get(m).into_iter().flat_map(BTreeMap::keys) {
            if let Some(cycle) = visit(next, edges, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(m);
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|m| visit(m, edges, &mut Vec::new(), &mut done))
}

/// The cycle with, for each step, where the first module uses the next.
fn describe(cycle: &[String], edges: &Edges) -> String {
    cycle
        .windows(2)
        .map(|w| {
            let (file, line) = &edges[&w[0]][&w[1]];
            format!("  {} -> {}   ({file}:{line})", w[0], w[1])
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn sources() -> Vec<(PathBuf, String)> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read");
            (p.strip_prefix(&src).expect("under src").to_path_buf(), text)
        })
        .collect()
}

#[test]
fn top_level_modules_form_no_cycle() {
    let edges = edges(&sources());
    assert!(edges.contains_key("graph") && edges.contains_key("passes"));
    if let Some(cycle) = find_cycle(&edges) {
        panic!(
            "the core's modules use each other in a cycle:\n{}\nmove what both need into a module \
             of its own (see this test's module comment for what counts)",
            describe(&cycle, &edges)
        );
    }
}

#[test]
fn the_files_of_a_folder_form_no_cycle() {
    let edges = folder_edges(&sources());
    assert!(edges.contains_key("writer/proto") && edges.contains_key("writer/value_info"));
    if let Some(cycle) = find_cycle(&edges) {
        panic!(
            "the files of a folder use each other in a cycle:\n{}\nmove what both need into one of \
             them, or a third file",
            describe(&cycle, &edges)
        );
    }
}

#[test]
fn the_folder_reader_sees_super_and_crate_paths() {
    let file = |p: &str, s: &str| (PathBuf::from(p), s.to_owned());
    let files = [
        file("w/mod.rs", "mod a;\nmod b;\nmod c;"),
        file(
            "w/a.rs",
            "use super::b::f;\n#[cfg(test)]\nmod tests {\n    use super::super::c::g;\n}\n",
        ),
        file(
            "w/b.rs",
            "use crate::w::{a, c::g};\nfn h() { super::super::x::y() }",
        ),
        file("w/c.rs", "// use super::a;\nfn f() {}"),
    ];
    let edges = folder_edges(&files);
    let to = |m: &str| edges[m].keys().cloned().collect::<Vec<_>>();
    assert_eq!(to("w/a"), ["w/b", "w/c"]); // the inline tests module's super::super reaches w
    assert_eq!(to("w/b"), ["w/a", "w/c"]); // super::super from b climbs past w: not a sibling
    assert!(to("w/c").is_empty()); // nothing from comments
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["w/a".into(), "w/b".into(), "w/a".into()])
    );
}

/// The reader finds the forms of paths the test relies on, and only in code: a cycle written in any
/// of them is found.
#[test]
fn the_reader_sees_every_form_of_path_and_finds_cycles() {
    let file = |p: &str, s: &str| (PathBuf::from(p), s.to_owned());
    let files = [
        file(
            "lib.rs",
            "pub mod a;\npub use a::{Thing, Other};\npub use c::Alone;",
        ),
        file(
            "a.rs",
            "// use crate::b;\n/* crate::b:: */ const S: &str = \"crate::b::x\";\nconst R: &str = \
             r#\"crate::b\"#;\nfn f<'a>(x: &'a u8) -> char { let _ = 'b'; '\\'' }\n\
             #[cfg(test)]\nmod tests {\n    use super::super::c::f;\n}\n",
        ),
        file("b.rs", "use crate::{self, a::Thing};"),
        file("c.rs", "pub(crate) fn f() -> crate::Other { todo!() }"),
        file("d/mod.rs", "mod e;\npub(crate) fn g() { crate::Alone }"),
        file("d/e.rs", "use super::super::b::x;\nuse super::g;"),
    ];
    let edges = edges(&files);
    let to = |m: &str| edges[m].keys().cloned().collect::<Vec<_>>();
    assert_eq!(to("a"), ["c"]); // from the inline tests module; nothing from comments or strings
    assert_eq!(to("b"), ["a"]);
    assert_eq!(to("c"), ["a"]); // crate::Other is a's
    assert_eq!(to("d"), ["b", "c"]);
    let cycle = find_cycle(&edges).expect("a -> c -> a");
    assert_eq!(cycle, ["a", "c", "a"]);
    assert!(describe(&cycle, &edges).contains("a.rs:7"));
    let acyclic: Edges = edges
        .into_iter()
        .map(|(m, to)| {
            (
                m.clone(),
                to.into_iter()
                    .filter(|(t, _)| m != "c" || t != "a")
                    .collect(),
            )
        })
        .collect();
    assert_eq!(find_cycle(&acyclic), None);
}
