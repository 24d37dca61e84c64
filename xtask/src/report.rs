//! `cargo xtask report`: an index over every plan run in reports/ (index.md, index.html), and
//! with `--compare A B` a per-configuration comparison of two runs (compare-A-vs-B.md/.html).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tcpx_report::index;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Directory holding the run directories.
    #[arg(long, default_value = "reports")]
    reports: PathBuf,
    /// Compare two runs (directory names under --reports, or paths): per-configuration deltas.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    compare: Option<Vec<String>>,
}

fn run_dir(reports: &Path, name: &str) -> PathBuf {
    let p = PathBuf::from(name);
    if p.join("report.json").is_file() {
        p
    } else {
        reports.join(name)
    }
}

fn short(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

pub fn run(root: &Path, a: ReportArgs) -> Result<()> {
    let reports = if a.reports.is_absolute() {
        a.reports.clone()
    } else {
        root.join(&a.reports)
    };
    if let Some(pair) = &a.compare {
        let (da, db) = (run_dir(&reports, &pair[0]), run_dir(&reports, &pair[1]));
        let ra = tcpx_report::load_run(&da)?;
        let rb = tcpx_report::load_run(&db)?;
        let (na, nb) = (short(&da), short(&db));
        let stem = format!("compare-{na}-vs-{nb}");
        let md = reports.join(format!("{stem}.md"));
        let html = reports.join(format!("{stem}.html"));
        std::fs::write(&md, index::compare_markdown(&na, &ra, &nb, &rb))
            .with_context(|| format!("writing {}", md.display()))?;
        std::fs::write(&html, index::compare_html(&na, &ra, &nb, &rb))
            .with_context(|| format!("writing {}", html.display()))?;
        println!("{}\n{}", md.display(), html.display());
        return Ok(());
    }
    let (entries, unreadable) = index::scan(&reports)?;
    let md = reports.join("index.md");
    let html = reports.join("index.html");
    std::fs::write(&md, index::index_markdown(&entries, &unreadable))
        .with_context(|| format!("writing {}", md.display()))?;
    std::fs::write(&html, index::index_html(&entries, &unreadable))
        .with_context(|| format!("writing {}", html.display()))?;
    println!(
        "{} runs indexed{}\n{}\n{}",
        entries.len(),
        if unreadable.is_empty() {
            String::new()
        } else {
            format!(", {} unreadable", unreadable.len())
        },
        md.display(),
        html.display()
    );
    if entries.is_empty() && !unreadable.is_empty() {
        bail!("no run directory in {} could be read", reports.display());
    }
    Ok(())
}
