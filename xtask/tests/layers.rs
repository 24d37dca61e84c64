//! docs/ARCHITECTURE.md's crate list is the layering: every crate of ours may depend only on
//! crates listed below it. This test reads the list and each crate's `[dependencies]` and fails
//! on a dependency that points up (or on a crate the list forgot), so the map cannot drift from
//! the manifests.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The crate names of the first fenced block of ARCHITECTURE.md that lists `tcpx-model`, top to
/// bottom.
fn layers() -> Vec<String> {
    let doc = fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let block = doc
        .split("```")
        .find(|b| b.contains("\ntcpx-model"))
        .expect("ARCHITECTURE.md lists the crates in a fenced block");
    block
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("tcpx-"))
        .map(str::to_string)
        .collect()
}

/// `tcpx-*` names in the `[dependencies]` table of `manifest` (not dev- or build-dependencies).
fn dependencies(manifest: &str) -> Vec<String> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            inside = t == "[dependencies]";
            continue;
        }
        if inside && t.starts_with("tcpx-") {
            let name: String = t
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            out.push(name);
        }
    }
    out
}

#[test]
fn every_crate_depends_only_on_crates_listed_below_it() {
    let order = layers();
    assert!(
        order.len() >= 10,
        "too few crates read from the list: {order:?}"
    );
    let outside = ["tcpx-rxdm-standin", "tcpx-test-support"];
    let mut violations = Vec::new();
    for entry in fs::read_dir(root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let Ok(manifest) = fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let deps = dependencies(&manifest);
        if outside.contains(&name.as_str()) {
            if !deps.is_empty() {
                violations.push(format!(
                    "{name} is outside the layers but depends on {deps:?}"
                ));
            }
            continue;
        }
        let Some(at) = order.iter().position(|c| *c == name) else {
            violations.push(format!(
                "{name} is missing from ARCHITECTURE.md's crate list"
            ));
            continue;
        };
        for d in deps {
            match order.iter().position(|c| *c == d) {
                Some(below) if below > at => {}
                Some(_) => violations.push(format!("{name} depends on {d}, listed above it")),
                None => violations.push(format!("{name} depends on {d}, not in the list")),
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_manifest_reader_sees_only_normal_dependencies() {
    let m = "[package]\nname = \"x\"\n[dependencies]\ntcpx-model.workspace = true\nserde = \"1\"\n\
             tcpx-topo = { path = \"../t\" }\n[dev-dependencies]\ntcpx-bench.workspace = true\n";
    assert_eq!(dependencies(m), ["tcpx-model", "tcpx-topo"]);
}
