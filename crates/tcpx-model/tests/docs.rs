//! docs/PLANS.md's knob table and the model's knob table say the same: the same knobs in the same
//! order, and each row's values column names the range or words the table accepts.

use tcpx_model::{format_size, KnobKind, PLAN_KNOBS};

/// The rows of the table under `## Knobs`: (knob names of the first column, values column).
fn doc_rows() -> Vec<(Vec<String>, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/PLANS.md");
    let text = std::fs::read_to_string(path).expect("docs/PLANS.md is readable");
    let section = text
        .split("\n## Knobs\n")
        .nth(1)
        .expect("docs/PLANS.md has a `## Knobs` section");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| knob |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let names = cells[1]
                .split('/')
                .map(|n| n.trim().trim_matches('`').to_string())
                .collect();
            (names, without_thousands_separators(cells[2]))
        })
        .collect()
}

#[test]
fn the_docs_list_every_plan_knob_in_table_order() {
    let documented: Vec<String> = doc_rows().into_iter().flat_map(|(n, _)| n).collect();
    let declared: Vec<&str> = PLAN_KNOBS.iter().map(|s| s.name).collect();
    assert_eq!(
        documented, declared,
        "docs/PLANS.md's knob table and tcpx_model::KNOBS disagree"
    );
}

#[test]
fn the_docs_give_each_knob_its_range() {
    let rows = doc_rows();
    for spec in PLAN_KNOBS {
        let (names, values) = rows
            .iter()
            .find(|(n, _)| n.iter().any(|n| n == spec.name))
            .expect("every knob documented (the other test says which)");
        // A row for two knobs (`iters` / `warmup`) gives both ranges, `a / b`.
        let position = names.iter().position(|n| n == spec.name).unwrap_or(0);
        let values = values
            .split(" / ")
            .nth(if names.len() > 1 { position } else { 0 })
            .unwrap_or(values);
        let wanted: Vec<String> = match spec.kind {
            KnobKind::Int { min, max } => vec![format!("{min}..={max}")],
            KnobKind::OptInt { min, max } => vec![format!("{min}..={max}"), "\"auto\"".into()],
            KnobKind::Float { min, max } => vec![format!("{min}..={max}")],
            KnobKind::OptSize { min, max } => {
                vec![
                    format!("{}..={}", short(min), format_size(max)),
                    "\"auto\"".into(),
                ]
            }
            KnobKind::Choice(words) => words.iter().map(|w| format!("`{w}`")).collect(),
            KnobKind::Bool => vec!["bool".into()],
            KnobKind::Memory => vec!["`host`".into(), "`cuda`".into(), "`cuda:S,R`".into()],
            KnobKind::Text => vec!["text".into()],
            KnobKind::Size { .. } | KnobKind::Sizes { .. } => vec!["size".into()],
            KnobKind::Cpus | KnobKind::Settings | KnobKind::Names => Vec::new(),
        };
        for w in wanted {
            assert!(
                values.contains(&w),
                "docs/PLANS.md: knob `{}` should say {w} in its values column, says `{values}`",
                spec.name
            );
        }
    }
}

/// A lower bound as the docs write it: `4K` rather than `4096`, `1` as itself.
fn short(n: u64) -> String {
    if n >= 1024 {
        format_size(n)
    } else {
        n.to_string()
    }
}

/// `1,000,000` as `1000000`; other commas (`cuda:S,R`, lists) stay.
fn without_thousands_separators(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let between_digits = i > 0
            && chars[i - 1].is_ascii_digit()
            && chars.get(i + 1).is_some_and(char::is_ascii_digit);
        if !(c == ',' && between_digits) {
            out.push(c);
        }
    }
    out
}
