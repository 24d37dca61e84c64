//! tcpx-tune: finds the settings that make one backend fast on this machine, by measuring that
//! backend itself, and hands them over as the variables the backend reads.
//!
//! For: `tcpx-run tune`. A [`Subject`] is what is tuned: libnccl's send/recv over its own
//! NET/Socket, libnccl over the GPUDirect-TCPX plugin, or tcpx-lab's own socket backend. Its
//! [`space`] is made of the subject's real settings (NCCL's and the plugin's variables from
//! [`tcpx_model::setting`], the socket backend's knobs from [`tcpx_model::knob`]), each point
//! is measured by the subject itself in fresh processes ([`measure`]: NCCL reads its environment
//! once per process), and [`tcpx_plan::search::Search`] decides what to measure within the
//! budget and which point wins. [`output`] writes the run directory: every point
//! (`points.csv`), the search's path as a chart (`search.svg`), `summary.md`, `tune.json`, and
//! `tuned.env` with the winner's variables untranslated and, for NCCL, `NCCL_NET` pinned to the
//! network the tuning used, so a job that would fall back to another network fails loudly.
//!
//! Not for: proving the result in NCCL against its defaults (`tcpx-validate` does, on the
//! tuned.env written here), running plans (`tcpx-orchestrate`), or moving bytes.

#![forbid(unsafe_code)]

pub mod limits;
pub mod measure;
pub mod output;
pub mod space;

use std::time::Instant;

use serde::Serialize;
use tcpx_model::setting::Network;
use tcpx_plan::search::{Budget, Outcome, PointRecord, Search, Step};

pub use output::OutputError;
pub use space::TuneSpace;

/// What is tuned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// libnccl's send/recv, its network transport `Network` (one GPU as two NCCL hosts, or two
    /// nodes).
    Nccl(Network),
    /// tcpx-lab's own socket backend (`tcpx-run bench --transport socket`).
    SocketBackend,
}

impl Subject {
    /// The name on the command line and in the run directory's name.
    pub fn name(self) -> &'static str {
        match self {
            Subject::Nccl(Network::Socket) => "nccl",
            Subject::Nccl(Network::Tcpx) => "tcpx",
            Subject::SocketBackend => "socket",
        }
    }

    pub const ALL: [Subject; 3] = [
        Subject::Nccl(Network::Socket),
        Subject::Nccl(Network::Tcpx),
        Subject::SocketBackend,
    ];

    /// `nccl` (NCCL's NET/Socket), `tcpx` (NCCL over the GPUDirect-TCPX plugin) or `socket`.
    pub fn parse(text: &str) -> Result<Subject, String> {
        Subject::ALL
            .into_iter()
            .find(|s| s.name() == text)
            .ok_or_else(|| {
                format!(
                    "unknown subject `{text}`: nccl (libnccl over NET/Socket), tcpx (libnccl over \
                     the GPUDirect-TCPX plugin) or socket (tcpx-lab's socket backend)"
                )
            })
    }

    /// What a person reads.
    pub fn describe(self) -> &'static str {
        match self {
            Subject::Nccl(Network::Socket) => "libnccl send/recv over NCCL's NET/Socket",
            Subject::Nccl(Network::Tcpx) => "libnccl send/recv over the GPUDirect-TCPX plugin",
            Subject::SocketBackend => "tcpx-lab's socket backend (tcpx-run bench)",
        }
    }
}

/// One measured point as the run directory records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointRow {
    pub record: PointRecord,
    /// The point's settings, `name=value` in the space's order.
    pub values: Vec<(String, String)>,
    /// What NCCL's log said about this point (networks used, problems), where there is one.
    pub evidence: Option<measure::Evidence>,
}

/// What one tune run found.
#[derive(Debug, Clone, Serialize)]
pub struct TuneRun {
    pub subject: Subject,
    pub space: tcpx_plan::search::Space,
    pub budget: Budget,
    pub seed: u64,
    /// What each point measured (its size, iterations), in words.
    pub measured: String,
    pub points: Vec<PointRow>,
    pub outcome: Outcome,
    /// Seconds the whole search took.
    pub elapsed_s: f64,
}

impl TuneRun {
    /// The winner's settings (`name=value`), if any point succeeded.
    pub fn winner_values(&self) -> Option<Vec<(String, String)>> {
        self.outcome.winner.as_ref().map(|w| self.space.values(w))
    }

    /// Winner over base, `median(winner) / median(base)`, with its interval.
    pub fn gain(&self) -> Option<tcpx_report::stats::Ratio> {
        tcpx_report::stats::ratio_of_medians(
            &self.outcome.base_samples,
            &self.outcome.winner_samples,
        )
    }
}

/// Progress while a search runs: one line per point.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    pub done: usize,
    pub budget: Budget,
    pub elapsed_s: f64,
    pub row: &'a PointRow,
    /// The best median so far and its settings.
    pub best: Option<(f64, String)>,
}

/// Runs the search over `space` from its base, each point measured by `measure`, within
/// `budget`; `progress` hears every point.
pub fn run(
    subject: Subject,
    space: &TuneSpace,
    budget: Budget,
    seed: u64,
    measure: &mut dyn measure::Measure,
    progress: &mut dyn FnMut(&Progress),
) -> Result<TuneRun, String> {
    let key_space = space.clone();
    let mut search = Search::new(space.space.clone(), space.base.clone(), budget, seed)?
        .with_key(move |c| key_space.key(c));
    let start = Instant::now();
    let mut rows: Vec<PointRow> = Vec::new();
    let mut best: Option<(f64, String)> = None;
    while let Step::Measure(req) = search.next(start.elapsed().as_secs_f64()) {
        let values = space.space.values(&req.coords);
        let name = format!("point{:03}-{}", req.id, req.phase.as_str());
        let t = Instant::now();
        let got = match space.refusal(&req.coords) {
            Some(why) => measure::Measured {
                gbs: Err(why),
                evidence: None,
            },
            None => measure.measure(&values, &name),
        };
        search.record(req.id, got.gbs.clone(), t.elapsed().as_secs_f64())?;
        let record = search
            .records()
            .last()
            .cloned()
            .ok_or("the search lost a point")?;
        if let Ok(v) = record.value {
            if best.as_ref().is_none_or(|(b, _)| v > *b) {
                best = Some((v, space.space.describe(&req.coords)));
            }
        }
        rows.push(PointRow {
            record,
            values,
            evidence: got.evidence,
        });
        progress(&Progress {
            done: rows.len(),
            budget,
            elapsed_s: start.elapsed().as_secs_f64(),
            row: rows.last().expect("just pushed"),
            best: best.clone(),
        });
    }
    let outcome = search.outcome();
    Ok(TuneRun {
        subject,
        space: space.space.clone(),
        budget,
        seed,
        measured: measure.describe(),
        points: rows,
        outcome,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}
