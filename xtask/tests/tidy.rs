//! Tidy checks over the sources that keep the structure ARCHITECTURE.md describes from growing
//! back its knots: no module cycle inside a crate, no match on a backend's name outside the
//! crates that own backends, no library function returning `anyhow`, `unsafe` only in the
//! C-boundary crates and a `// SAFETY:` comment on every `unsafe` block. Each checker is a pure
//! function over text, tested first on a small planted violation, then run on the tree.
//!
//! Violations let through are listed (`KNOWN_*`, all empty now): a new one fails, and so does a
//! listed one that is gone (take it off the list), so the lists only shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The crates of the workspace: `(name, src directory)`.
fn crates() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("src").is_dir())
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, p.join("src"))
        })
        .collect();
    out.sort();
    out
}

/// `text` without its test module (from `#[cfg(test)]` followed by `mod tests`) and without
/// line comments: test code may reach anywhere, and prose is not a dependency.
fn production_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|n| n.trim_start().starts_with("mod tests"))
        {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Module cycles

/// The module path of `file` inside a crate whose sources are in `src` (`lib.rs`/`main.rs` is
/// the root, "").
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") || !parts.is_empty() && stem != "mod" {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

/// The module a path of `segments` names, as the longest prefix that is one of `modules`.
fn resolve(modules: &BTreeSet<String>, segments: &[&str]) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// Each `crate::a::b` and `super::x` path in `code` (module `module`), as the module it names.
fn references(modules: &BTreeSet<String>, module: &str, code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    // Paths, with `{a, b::c}` groups expanded one level (enough for `use crate::{a, b}`).
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let at_word = i == 0 || !ident(bytes[i - 1]) && bytes[i - 1] != ':';
        let rest: String = bytes[i..bytes.len().min(i + 7)].iter().collect();
        let (base, skip): (Vec<String>, usize) = if at_word && rest.starts_with("crate::") {
            (Vec::new(), 7)
        } else if at_word && rest.starts_with("super::") {
            let mut base: Vec<String> = if module.is_empty() {
                Vec::new()
            } else {
                module.split("::").map(str::to_string).collect()
            };
            let mut j = i;
            while bytes[j..].iter().collect::<String>().starts_with("super::") {
                base.pop();
                j += 7;
            }
            (base, j - i)
        } else {
            i += 1;
            continue;
        };
        i += skip;
        let mut heads: Vec<Vec<String>> = Vec::new();
        if bytes.get(i) == Some(&'{') {
            let end = bytes[i..]
                .iter()
                .position(|&c| c == '}')
                .map_or(bytes.len(), |e| i + e);
            let group: String = bytes[i + 1..end].iter().collect();
            for item in group.split(',') {
                let segs: Vec<String> = item
                    .trim()
                    .split("::")
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty() && s.chars().all(ident))
                    .collect();
                heads.push(segs);
            }
            i = end;
        } else {
            let start = i;
            while i < bytes.len() && (ident(bytes[i]) || bytes[i] == ':') {
                i += 1;
            }
            let path: String = bytes[start..i].iter().collect();
            heads.push(
                path.split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
            );
        }
        for h in heads {
            let mut full = base.clone();
            full.extend(h);
            let segs: Vec<&str> = full.iter().map(String::as_str).collect();
            if let Some(m) = resolve(modules, &segs) {
                if m != module && !m.is_empty() {
                    out.insert(m);
                }
            }
        }
    }
    out
}

/// The cycles among the modules of one crate, `files` being `(module path, source)`: each as
/// its modules sorted, the strongly connected components of more than one module of the graph
/// "module A names module B" (`crate::` and `super::` paths in production code; a module's own
/// descendants count as itself, `mod` declarations are not references).
fn module_cycles(files: &[(String, String)]) -> Vec<Vec<String>> {
    let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, text) in files {
        let refs = references(&modules, m, &production_code(text));
        // A module naming its own ancestor or descendant is nesting, not a knot between
        // modules: drop those.
        let refs = refs
            .into_iter()
            .filter(|r| {
                !(m.is_empty()
                    || r.is_empty()
                    || m.starts_with(&format!("{r}::"))
                    || r.starts_with(&format!("{m}::")))
            })
            .collect();
        edges.insert(m.clone(), refs);
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect()
}

/// Tarjan's strongly connected components, each sorted, the list sorted.
fn strongly_connected(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        if let Some(ws) = s.edges.get(v) {
            for w in ws {
                let w = w.as_str();
                if !s.edges.contains_key(w) {
                    continue;
                }
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let l = s.low[w].min(s.low[v]);
                    s.low.insert(v, l);
                } else if s.on.contains(w) {
                    let l = s.index[w].min(s.low[v]);
                    s.low.insert(v, l);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut c = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                c.push(w.to_string());
                if w == v {
                    break;
                }
            }
            c.sort();
            s.out.push(c);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// Cycles let through, as `crate: a, b, ...`: none (every one found has been opened), so any
/// cycle fails the check.
const KNOWN_CYCLES: &[&str] = &[];

#[test]
fn module_cycle_checker_finds_a_planted_cycle() {
    let files = |b: &str| {
        vec![
            ("".to_string(), "mod a;\nmod b;\nmod c;\n".to_string()),
            ("a".to_string(), "use crate::b::f;\n".to_string()),
            ("b".to_string(), b.to_string()),
            ("c".to_string(), "use super::a;\n".to_string()),
        ]
    };
    assert!(module_cycles(&files("pub fn f() {}\n")).is_empty());
    assert_eq!(
        module_cycles(&files("use crate::{c::g, d};\npub fn f() {}\n")),
        [["a", "b", "c"]]
    );
    // Test code and comments are not references; nesting is not a cycle.
    let quiet = "// crate::a::x\n#[cfg(test)]\nmod tests {\n    use crate::a::x;\n}\n";
    assert!(module_cycles(&files(quiet)).is_empty());
    let nested = vec![
        ("p".to_string(), "use self::q::x;\n".to_string()),
        (
            "p::q".to_string(),
            "use super::y;\nuse crate::p::z;\n".to_string(),
        ),
    ];
    assert!(module_cycles(&nested).is_empty());
}

#[test]
fn no_module_cycle_inside_a_crate() {
    let mut found = Vec::new();
    for (name, src) in crates() {
        let files: Vec<(String, String)> = rust_files(&src)
            .iter()
            .filter(|f| !f.components().any(|c| c.as_os_str() == "bin"))
            .map(|f| (module_of(&src, f), fs::read_to_string(f).unwrap()))
            .collect();
        for c in module_cycles(&files) {
            found.push(format!("{name}: {}", c.join(", ")));
        }
    }
    let (new, gone) = ratchet(&found, KNOWN_CYCLES);
    assert!(
        new.is_empty(),
        "module cycles (each module names another of the same list, through `crate::` or \
         `super::` paths): move what both need into a module both use, or merge them:\n{}",
        new.join("\n")
    );
    assert!(
        gone.is_empty(),
        "cycles no longer there: take them off KNOWN_CYCLES: {gone:?}"
    );
}

/// `found` against a list of known violations: the new ones and the listed ones that are gone.
fn ratchet<'a>(found: &'a [String], known: &'a [&'a str]) -> (Vec<&'a str>, Vec<&'a str>) {
    let new = found
        .iter()
        .map(String::as_str)
        .filter(|f| !known.contains(f))
        .collect();
    let gone = known
        .iter()
        .copied()
        .filter(|k| !found.iter().any(|f| f == k))
        .collect();
    (new, gone)
}

// ---------------------------------------------------------------------------------------------
// Backend names

/// Crates that may decide by a backend's name: the backends' own crate and the vocabulary.
const BACKEND_HOMES: &[&str] = &["tcpx-transport", "tcpx-model"];

/// Each backend as code names it: the enum variant and the name string.
const BACKENDS: &[(&str, &str)] = &[
    ("Backend::Socket", "\"socket\""),
    ("Backend::NetPlugin", "\"netplugin\""),
    ("Backend::Nccl", "\"nccl\""),
    ("Backend::CudaP2p", "\"cudap2p\""),
];

/// How many times production code in `text` decides by a backend's name: compares a value with
/// one (`== Backend::Nccl`, `!= "nccl"`), matches one (`Backend::Socket =>`, `"socket" |`), or
/// tests one with `matches!`. Making a backend value (`transport: Backend::Nccl`) is not a
/// decision.
fn backend_matches(text: &str) -> usize {
    let mut n = 0;
    for line in production_code(text).lines() {
        for (variant, name) in BACKENDS {
            for token in [variant, name] {
                let mut from = 0;
                while let Some(at) = line[from..].find(token) {
                    let start = from + at;
                    let end = start + token.len();
                    from = end;
                    let after = &line[end..];
                    if token == variant && after.starts_with(|c: char| c.is_alphanumeric()) {
                        continue;
                    }
                    let before = line[..start].trim_end();
                    // `tcpx_bench::Backend::Nccl`: the comparison is before the path.
                    let before = before
                        .trim_end_matches(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
                        .trim_end();
                    let after = after.trim_start();
                    let compared = before.ends_with("==") || before.ends_with("!=");
                    let matched = ["=>", "|", "==", "!="].iter().any(|p| after.starts_with(p));
                    let tested = line[..start].contains("matches!(");
                    if compared || matched || tested {
                        n += 1;
                    }
                }
            }
        }
    }
    n
}

/// Decisions by a backend's name let through outside [`BACKEND_HOMES`], as `path: count`: none
/// (each became a capability the backend answers), so any such decision fails the check.
const KNOWN_BACKEND_MATCHES: &[&str] = &[];

#[test]
fn backend_match_checker_finds_planted_matches() {
    let code = r#"
fn f(exp: &Experiment) {
    if exp.transport == tcpx_bench::Backend::Nccl {}
    if name != "socket" {}
    match b {
        Backend::NetPlugin | Backend::Socket => {}
        _ => {}
    }
    let p2p = matches!(exp.transport, Backend::CudaP2p);
    let made = Experiment { transport: Backend::Nccl, ..base };
    let named = Backend::NccLike;
}
#[cfg(test)]
mod tests {
    fn g() { assert!(x == "nccl"); }
}
"#;
    assert_eq!(backend_matches(code), 5);
    assert_eq!(
        backend_matches("let s = \"socket\";\n// if b == \"nccl\"\n"),
        0
    );
}

#[test]
fn no_match_on_a_backend_name_outside_its_homes() {
    let mut found = Vec::new();
    for (name, src) in crates() {
        if BACKEND_HOMES.contains(&name.as_str()) {
            continue;
        }
        for f in rust_files(&src) {
            let n = backend_matches(&fs::read_to_string(&f).unwrap());
            if n > 0 {
                let rel = f
                    .strip_prefix(root())
                    .unwrap_or(&f)
                    .to_string_lossy()
                    .to_string();
                let rel = rel.trim_start_matches("../").to_string();
                found.push(format!("{rel}: {n}"));
            }
        }
    }
    let (new, gone) = ratchet(&found, KNOWN_BACKEND_MATCHES);
    assert!(
        new.is_empty(),
        "decisions by a backend's name outside {BACKEND_HOMES:?} (count per file): ask the \
         backend instead (`Backend::capabilities`, `registry::limits`, a function of \
         tcpx-transport's backend module):\n{}",
        new.join("\n")
    );
    assert!(
        gone.is_empty(),
        "fewer backend matches than listed: update KNOWN_BACKEND_MATCHES: {gone:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// SAFETY comments

/// The lines (1-based) of `unsafe` blocks in `text` with no `// SAFETY` comment above them in
/// the same paragraph (the lines up to the previous blank line; one comment may cover several
/// blocks, as for a set of symbols loaded together).
fn unsafe_without_safety(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let Some(at) = code.find("unsafe") else {
            continue;
        };
        let before_ok = code[..at]
            .chars()
            .last()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if !before_ok || !code[at + "unsafe".len()..].trim_start().starts_with('{') {
            continue;
        }
        let covered = lines[..=i]
            .iter()
            .rev()
            .take_while(|l| !l.trim().is_empty())
            .any(|l| l.contains("// SAFETY"));
        if !covered {
            out.push(i + 1);
        }
    }
    out
}

#[test]
fn safety_checker_finds_a_planted_bare_unsafe_block() {
    let code = "fn f() {\n    // SAFETY: p is valid.\n    let a = unsafe { *p };\n\n    \
                let b = unsafe { *q };\n    let t: unsafe extern \"C\" fn() = g;\n}\n";
    assert_eq!(unsafe_without_safety(code), [5]);
}

#[test]
fn every_unsafe_block_has_a_safety_comment() {
    let mut found = Vec::new();
    for (_, src) in crates() {
        for f in rust_files(&src) {
            for line in unsafe_without_safety(&fs::read_to_string(&f).unwrap()) {
                found.push(format!("{}:{line}", f.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "`unsafe` blocks without a `// SAFETY:` comment saying why they are sound:\n{}",
        found.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// where `unsafe` may appear

/// The C-boundary crates, the only ones allowed `unsafe` (each block with its SAFETY comment),
/// each with why: they call or are called through a C ABI that safe Rust cannot express.
const C_BOUNDARY: &[(&str, &str)] = &[
    (
        "tcpx-ffi",
        "the NCCL net plugin ABI and the plugin and libnccl loaders (dlopen, C tables)",
    ),
    (
        "tcpx-gpu",
        "CUDA through cudarc: raw device memory, IPC handles, kernel launches",
    ),
    ("tcpx-py", "the Python binding's FFI edge (PyO3 buffers)"),
    (
        "tcpx-watch-plugin",
        "a net plugin library NCCL loads: its exports are C entry points over raw pointers",
    ),
];

/// The lines (1-based) where `text` uses the `unsafe` keyword (a block, fn, impl, trait or
/// extern), comments aside.
fn unsafe_uses(text: &str) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("unsafe") {
            let before = rest[..at].chars().last();
            let after = rest[at + "unsafe".len()..].chars().next();
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            if !word(before) && !word(after) && !rest[..at].ends_with('"') {
                out.push(i + 1);
                break;
            }
            rest = &rest[at + "unsafe".len()..];
        }
    }
    out
}

#[test]
fn unsafe_checker_finds_planted_uses_and_ignores_the_lint_name() {
    let code = "#![forbid(unsafe_code)]\n// unsafe in a comment\nfn f() {\n    let a = unsafe { *p };\n}\n\
                unsafe fn g() {}\nunsafe impl Send for X {}\n";
    assert_eq!(unsafe_uses(code), [4, 6, 7]);
}

#[test]
fn unsafe_appears_only_in_the_c_boundary_crates() {
    let mut found = Vec::new();
    for (name, src) in crates() {
        if C_BOUNDARY.iter().any(|(c, _)| *c == name) {
            continue;
        }
        for f in rust_files(&src) {
            for line in unsafe_uses(&fs::read_to_string(&f).unwrap()) {
                found.push(format!("{}:{line}", f.display()));
            }
        }
    }
    for (name, _) in C_BOUNDARY {
        assert!(
            root().join("crates").join(name).is_dir(),
            "C_BOUNDARY names {name}, which is no crate any more: take it off the list"
        );
    }
    assert!(
        found.is_empty(),
        "`unsafe` outside the C-boundary crates ({}); move the FFI into one of them or, for a \
         new library loaded through a C ABI, add it to C_BOUNDARY with why:\n{}",
        C_BOUNDARY
            .iter()
            .map(|c| c.0)
            .collect::<Vec<_>>()
            .join(", "),
        found.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// anyhow in libraries

/// Crates whose code is a binary, not a library another crate calls: they may return `anyhow`.
fn is_library(src: &Path) -> bool {
    src.join("lib.rs").is_file()
}

/// The public functions in `text` (production code) that return `anyhow`'s error: a return type
/// naming `anyhow`, or a bare `Result<T>` in a file that imports `anyhow::Result`. Each as the
/// function's name. A library's callers get its own error type, which they can match on;
/// binaries add context with `anyhow` where they print.
fn pub_fns_returning_anyhow(text: &str) -> Vec<String> {
    let code = production_code(text);
    let uses_anyhow_result = code.lines().any(|l| {
        let l = l.trim_start();
        l.starts_with("use anyhow::")
            && (l.contains("::Result;") || l.contains(" Result") || l.contains("{Result"))
    });
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("pub fn ") {
        let before = &rest[..at];
        rest = &rest[at + "pub fn ".len()..];
        // `pub(crate) fn` does not contain "pub fn"; a word ending in "pub" is no keyword.
        if before.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The signature runs to the body or the `;` of a declaration, past the parameters.
        let open = rest.find('(').unwrap_or(0);
        let mut depth = 0usize;
        let mut close = rest.len();
        for (i, c) in rest[open..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        let tail = &rest[close..];
        let end = tail.find(['{', ';']).unwrap_or(tail.len());
        let sig = &tail[..end];
        let Some(arrow) = sig.find("->") else {
            continue;
        };
        let ret = sig[arrow + 2..].split(" where").next().unwrap_or("").trim();
        let bare_result = ret.starts_with("Result<") && !ret.contains(',');
        if ret.contains("anyhow") || uses_anyhow_result && bare_result {
            out.push(name);
        }
    }
    out
}

/// Library functions let through that return `anyhow`, as `path: function`: none (each returns
/// its crate's own error type), so any such function fails the check.
const KNOWN_ANYHOW: &[&str] = &[];

#[test]
fn anyhow_checker_finds_planted_library_functions() {
    let code = "use anyhow::{bail, Result};\n\
                pub fn a() -> anyhow::Result<u32> { 1 }\n\
                pub fn b(x: u32,\n    y: u32,\n) -> Result<()> {\n    Ok(())\n}\n\
                pub fn c() -> Result<(), MyError> { Ok(()) }\n\
                pub(crate) fn d() -> Result<()> { Ok(()) }\n\
                fn e() -> anyhow::Result<()> { Ok(()) }\n\
                pub fn f(g: impl Fn() -> u32) -> u32 { g() }\n\
                #[cfg(test)]\nmod tests {\n    pub fn h() -> anyhow::Result<()> { Ok(()) }\n}\n";
    assert_eq!(pub_fns_returning_anyhow(code), ["a", "b"]);
    // Without the import, a one-parameter `Result` is the crate's own alias.
    assert_eq!(
        pub_fns_returning_anyhow("pub fn b() -> Result<()> { Ok(()) }\n"),
        Vec::<String>::new()
    );
}

#[test]
fn no_library_returns_anyhow() {
    let mut found = Vec::new();
    for (_, src) in crates() {
        if !is_library(&src) {
            continue;
        }
        for f in rust_files(&src) {
            if f.components().any(|c| c.as_os_str() == "bin") || f.ends_with("main.rs") {
                continue;
            }
            for name in pub_fns_returning_anyhow(&fs::read_to_string(&f).unwrap()) {
                let rel = f.strip_prefix(root()).unwrap_or(&f).to_string_lossy();
                found.push(format!("{}: {name}", rel.trim_start_matches("../")));
            }
        }
    }
    let (new, gone) = ratchet(&found, KNOWN_ANYHOW);
    assert!(
        new.is_empty(),
        "public library functions returning anyhow's error (`path: function`): return the \
         crate's own error type (a `thiserror` enum, or a `String` reason) so callers can tell \
         failures apart; binaries add context with anyhow:\n{}",
        new.join("\n")
    );
    assert!(
        gone.is_empty(),
        "no longer returning anyhow: take them off KNOWN_ANYHOW: {gone:?}"
    );
}
