//! A subject's tune space: its real settings as knobs of a search, each with the levels tried
//! (cheapest first, the reader's default first of all), and which points are one
//! configuration once the reader's own clamps are applied.
//!
//! For NCCL the dimensions are rows of [`tcpx_model::setting::SETTINGS`]; the level `default`
//! leaves the variable unset. For the socket backend they are knobs of
//! [`tcpx_model::knob::KNOBS`] (`chunk`, `window`, `channels`, `socks_per_channel`, ...) and
//! `layout` (`CxS`: channels x sockets per channel, for a search at a fixed socket count).

use std::collections::BTreeMap;

use tcpx_model::setting::{self, Network, SettingSpec};
use tcpx_model::Knob;
use tcpx_plan::search::{Dim, Space};

use crate::Subject;

/// The level that leaves a setting at its reader's default.
pub const DEFAULT_LEVEL: &str = "default";

/// The most levels a range (`lo..hi`, doubling) expands to.
const MAX_RANGE_LEVELS: usize = 40;

/// What one dimension of a space sets.
#[derive(Debug, Clone)]
pub enum DimKind {
    /// An NCCL or plugin variable.
    Setting(&'static SettingSpec),
    /// A knob of the socket backend.
    Knob(Knob),
    /// `CxS`: channels and sockets per channel at once.
    Layout,
}

/// A space with what each of its dimensions sets and the base point (the defaults).
#[derive(Debug, Clone)]
pub struct TuneSpace {
    pub subject: Subject,
    pub space: Space,
    pub kinds: Vec<DimKind>,
    pub base: Vec<usize>,
}

/// The socket backend's default space: layout, chunk and window at the command line's defaults
/// first.
const SOCKET_DEFAULT: &[(&str, &[&str])] = &[
    ("channels", &["1", "2", "4"]),
    ("socks_per_channel", &["1", "2", "4", "8", "16"]),
    ("chunk", &["auto", "1M", "2M", "4M", "8M", "16M"]),
    ("window", &["auto", "4", "8", "16", "32"]),
];

impl TuneSpace {
    /// The subject's default space: every setting with default levels (NCCL, the plugin), or the
    /// socket backend's layout, chunk and window.
    pub fn default_for(subject: Subject) -> TuneSpace {
        match subject {
            Subject::Nccl(n) => {
                let dims: Vec<(String, Vec<String>)> = setting::for_network(n)
                    .filter(|s| !s.levels.is_empty())
                    .map(|s| (s.var.to_string(), setting_levels(s)))
                    .collect();
                TuneSpace::build(subject, dims).expect("the settings table's levels are valid")
            }
            Subject::SocketBackend => TuneSpace::build(
                subject,
                SOCKET_DEFAULT
                    .iter()
                    .map(|(k, ls)| (k.to_string(), ls.iter().map(|s| s.to_string()).collect()))
                    .collect(),
            )
            .expect("the socket backend's default space is valid"),
        }
    }

    /// A space of the dimensions `specs` give, each `NAME=v1,v2,...` or `NAME=lo..hi` (doubling),
    /// `default` for the reader's default (NCCL) or `auto` (the socket backend's chunk).
    pub fn parse(subject: Subject, specs: &[String]) -> Result<TuneSpace, String> {
        let mut dims = Vec::new();
        for spec in specs {
            let (name, levels) = spec
                .split_once('=')
                .ok_or_else(|| format!("--space `{spec}`: write NAME=v1,v2,... or NAME=lo..hi"))?;
            let name = name.trim();
            let kind = kind_of(subject, name)?;
            let levels = expand(&kind, name, levels)?;
            dims.push((name.to_string(), levels));
        }
        TuneSpace::build(subject, dims)
    }

    fn build(subject: Subject, dims: Vec<(String, Vec<String>)>) -> Result<TuneSpace, String> {
        let mut kinds = Vec::new();
        let mut out = Vec::new();
        for (name, levels) in dims {
            let kind = kind_of(subject, &name)?;
            for l in &levels {
                check_level(&kind, &name, l)?;
            }
            kinds.push(kind);
            out.push(Dim { name, levels });
        }
        let space = Space::new(out)?;
        let base = space
            .dims
            .iter()
            .zip(&kinds)
            .map(|(d, k)| base_level(k, d))
            .collect();
        Ok(TuneSpace {
            subject,
            space,
            kinds,
            base,
        })
    }

    /// The variables a point sets (NCCL: `default` levels left out), as the reader takes them.
    pub fn vars(&self, coords: &[usize]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for ((d, k), &i) in self.space.dims.iter().zip(&self.kinds).zip(coords) {
            let level = &d.levels[i];
            match k {
                DimKind::Setting(s) => {
                    if level != DEFAULT_LEVEL {
                        if let Ok(v) = s.parse(level) {
                            out.push((s.var.to_string(), s.text(v)));
                        }
                    }
                }
                DimKind::Knob(knob) => out.push((knob.name().to_string(), level.clone())),
                DimKind::Layout => {
                    if let Some((c, s)) = level.split_once('x') {
                        out.push(("channels".into(), c.to_string()));
                        out.push(("socks_per_channel".into(), s.to_string()));
                    }
                }
            }
        }
        out
    }

    fn network(&self) -> Option<Network> {
        match self.subject {
            Subject::Nccl(n) => Some(n),
            Subject::SocketBackend => None,
        }
    }

    /// Two points with the same key run identically (NCCL's clamps applied).
    pub fn key(&self, coords: &[usize]) -> String {
        let vars = self.vars(coords);
        match self.network() {
            Some(n) => {
                let map: BTreeMap<String, String> = vars.into_iter().collect();
                match setting::effective(n, &map) {
                    Ok(e) => format!("{:?}", e.values),
                    Err(_) => format!("{coords:?}"),
                }
            }
            None => {
                let mut v = vars;
                v.sort();
                format!("{v:?}")
            }
        }
    }

    /// Why a point cannot run at all (the reader would give it no sockets), found without
    /// running it.
    pub fn refusal(&self, coords: &[usize]) -> Option<String> {
        let n = self.network()?;
        let map: BTreeMap<String, String> = self.vars(coords).into_iter().collect();
        match setting::effective(n, &map) {
            Ok(e) => e.unrunnable,
            Err(e) => Some(e),
        }
    }

    /// What the readers change of a point's values (NCCL's clamps), one line each.
    pub fn clamps(&self, coords: &[usize]) -> Vec<String> {
        let Some(n) = self.network() else {
            return Vec::new();
        };
        let map: BTreeMap<String, String> = self.vars(coords).into_iter().collect();
        setting::effective(n, &map)
            .map(|e| e.clamps)
            .unwrap_or_default()
    }
}

/// `default` then the row's levels other than its base value.
fn setting_levels(s: &SettingSpec) -> Vec<String> {
    std::iter::once(DEFAULT_LEVEL.to_string())
        .chain(
            s.levels
                .iter()
                .filter(|&&l| l != s.base)
                .map(|&l| s.display(l)),
        )
        .collect()
}

fn kind_of(subject: Subject, name: &str) -> Result<DimKind, String> {
    match subject {
        Subject::Nccl(n) => setting::spec(n, name).map(DimKind::Setting).ok_or_else(|| {
            let known: Vec<&str> = setting::for_network(n).map(|s| s.var).collect();
            format!(
                "`{name}` is not a setting of {} (known: {})",
                subject.describe(),
                known.join(", ")
            )
        }),
        Subject::SocketBackend => {
            if name == "layout" {
                return Ok(DimKind::Layout);
            }
            match Knob::from_name(name) {
                Some(k) if TUNABLE_KNOBS.contains(&k) => Ok(DimKind::Knob(k)),
                _ => Err(format!(
                    "`{name}` is not a knob tune varies for the socket backend (known: layout, {})",
                    TUNABLE_KNOBS
                        .iter()
                        .map(|k| k.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
    }
}

/// The socket backend's knobs a search may vary: the ones that set how bytes move, not what is
/// measured.
const TUNABLE_KNOBS: &[Knob] = &[
    Knob::Channels,
    Knob::SocksPerChannel,
    Knob::Chunk,
    Knob::Window,
    Knob::SockBuf,
    Knob::ZeroCopyMin,
    Knob::StagingRing,
];

fn check_level(kind: &DimKind, name: &str, level: &str) -> Result<(), String> {
    match kind {
        DimKind::Setting(s) => {
            if level != DEFAULT_LEVEL {
                s.parse(level)?;
            }
            Ok(())
        }
        DimKind::Knob(k) => knob_level(*k, level).map_err(|err| format!("{name}={level}: {err}")),
        DimKind::Layout => {
            let bad = || format!("layout={level}: write channels x sockets per channel, e.g. 2x8");
            let (c, s) = level.split_once('x').ok_or_else(bad)?;
            knob_level(Knob::Channels, c)
                .and_then(|_| knob_level(Knob::SocksPerChannel, s))
                .map_err(|err| format!("layout={level}: {err}"))
        }
    }
}

/// `level` is a value of `knob` within the knob table's range, and the bench takes it.
fn knob_level(knob: Knob, level: &str) -> Result<(), String> {
    use tcpx_model::KnobKind;
    let out_of = |lo: &dyn std::fmt::Display, hi: &dyn std::fmt::Display| {
        format!("outside the knob's range {lo}..={hi}")
    };
    match knob.spec().kind {
        KnobKind::OptInt { .. } if level.trim() == "auto" => return Ok(()),
        KnobKind::Int { min, max } | KnobKind::OptInt { min, max } => {
            let v: i64 = level
                .trim()
                .parse()
                .map_err(|_| "a whole number is expected".to_string())?;
            if v < min || v > max {
                return Err(out_of(&min, &max));
            }
        }
        KnobKind::Size { min, max } | KnobKind::OptSize { min, max } => {
            if matches!(knob.spec().kind, KnobKind::OptSize { .. }) && level.trim() == "auto" {
                return Ok(());
            }
            let v = tcpx_model::parse_size(level.trim())?;
            if v < min || v > max {
                return Err(out_of(&min, &max));
            }
        }
        _ => {}
    }
    let mut e = tcpx_model::Experiment::default();
    e.set_knob(knob, &[level]).map(|_| ())
}

/// `v1,v2` or a doubling range `lo..hi`.
fn expand(kind: &DimKind, name: &str, text: &str) -> Result<Vec<String>, String> {
    let text = text.trim();
    if let Some((lo, hi)) = text.split_once("..") {
        let bytes = matches!(
            kind,
            DimKind::Setting(SettingSpec {
                kind: setting::SettingKind::Bytes { .. },
                ..
            }) | DimKind::Knob(Knob::Chunk | Knob::SockBuf | Knob::ZeroCopyMin | Knob::StagingRing)
        );
        let parse = |t: &str| -> Result<u64, String> {
            if bytes {
                tcpx_model::parse_size(t.trim()).map_err(|e| format!("{name}: {e}"))
            } else {
                t.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{name}: `{t}` is not a whole number"))
            }
        };
        let (lo, hi) = (parse(lo)?, parse(hi)?);
        if lo == 0 || lo > hi {
            return Err(format!(
                "{name}={text}: a range runs from a positive value up to a larger one"
            ));
        }
        let mut out = Vec::new();
        let mut v = lo;
        while v <= hi {
            if out.len() == MAX_RANGE_LEVELS {
                return Err(format!(
                    "{name}={text}: more than {MAX_RANGE_LEVELS} levels"
                ));
            }
            out.push(if bytes {
                tcpx_model::format_size(v)
            } else {
                v.to_string()
            });
            v = v.saturating_mul(2);
            if v == u64::MAX {
                break;
            }
        }
        return Ok(out);
    }
    let levels: Vec<String> = text
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if levels.is_empty() {
        return Err(format!("--space {name}=: give at least one value"));
    }
    Ok(levels)
}

/// The level that is the default: `default` (NCCL), the knob's default text (socket backend),
/// else the first.
fn base_level(kind: &DimKind, d: &Dim) -> usize {
    let wanted: Option<String> = match kind {
        DimKind::Setting(_) => Some(DEFAULT_LEVEL.to_string()),
        DimKind::Knob(k) => Some(k.default_text().to_string()),
        DimKind::Layout => Some(format!(
            "{}x{}",
            Knob::Channels.default_text(),
            Knob::SocksPerChannel.default_text()
        )),
    };
    wanted
        .and_then(|w| d.levels.iter().position(|l| *l == w))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nccl_default_space_is_the_settings_that_move_point_to_point() {
        let s = TuneSpace::default_for(Subject::Nccl(Network::Socket));
        let names: Vec<&str> = s.space.dims.iter().map(|d| d.name.as_str()).collect();
        for v in [
            "NCCL_NCHANNELS_PER_NET_PEER",
            "NCCL_P2P_NET_CHUNKSIZE",
            "NCCL_BUFFSIZE",
            "NCCL_NSOCKS_PERTHREAD",
            "NCCL_SOCKET_NTHREADS",
        ] {
            assert!(names.contains(&v), "{v} missing from {names:?}");
        }
        assert!(s.base.iter().all(|&b| b == 0), "the base is every default");
        assert!(s.vars(&s.base).is_empty(), "the base sets nothing");
        // 4M buffers are NCCL's default: not a level of their own.
        let buff = s
            .space
            .dims
            .iter()
            .find(|d| d.name == "NCCL_BUFFSIZE")
            .unwrap();
        assert!(!buff.levels.contains(&"4M".to_string()));
    }

    #[test]
    fn points_nccl_runs_identically_share_a_key_and_impossible_ones_are_refused() {
        let s = TuneSpace::parse(
            Subject::Nccl(Network::Socket),
            &[
                "NCCL_SOCKET_NTHREADS=default,4".into(),
                "NCCL_NSOCKS_PERTHREAD=default,4".into(),
            ],
        )
        .unwrap();
        // Without helper threads, sockets per thread change nothing.
        assert_eq!(s.key(&[0, 0]), s.key(&[0, 1]));
        assert_ne!(s.key(&[1, 0]), s.key(&[1, 1]));
        let t = TuneSpace::parse(
            Subject::Nccl(Network::Tcpx),
            &["NCCL_SOCKET_NTHREADS=1,16".into()],
        )
        .unwrap();
        assert!(t.refusal(&[1]).unwrap().contains("no socket"));
        assert!(t.refusal(&[0]).is_none());
    }

    #[test]
    fn spaces_are_parsed_with_ranges_and_checked_against_each_readers_limits() {
        let s = TuneSpace::parse(
            Subject::Nccl(Network::Socket),
            &["NCCL_P2P_NET_CHUNKSIZE=128K..2M".into()],
        )
        .unwrap();
        assert_eq!(s.space.dims[0].levels, ["128K", "256K", "512K", "1M", "2M"]);
        assert_eq!(
            s.vars(&[4]),
            [("NCCL_P2P_NET_CHUNKSIZE".to_string(), "2097152".to_string())]
        );
        let e = TuneSpace::parse(
            Subject::Nccl(Network::Tcpx),
            &["NCCL_NSOCKS_PERTHREAD=1,16".into()],
        )
        .unwrap_err();
        assert!(e.contains("GPUDirect-TCPX"), "{e}");
        assert!(
            TuneSpace::parse(Subject::Nccl(Network::Socket), &["LD_PRELOAD=x".into()]).is_err()
        );
        assert!(
            TuneSpace::parse(Subject::Nccl(Network::Socket), &["NCCL_BUFFSIZE".into()]).is_err()
        );
        assert!(TuneSpace::parse(Subject::SocketBackend, &["window=0,4".into()]).is_err());
        assert!(TuneSpace::parse(Subject::SocketBackend, &["layout=2x".into()]).is_err());
        assert!(TuneSpace::parse(Subject::SocketBackend, &["iters=1,2".into()]).is_err());
    }

    #[test]
    fn the_socket_space_starts_from_the_command_lines_defaults() {
        let s = TuneSpace::default_for(Subject::SocketBackend);
        let base = s.space.describe(&s.base);
        assert_eq!(
            base,
            "channels=2 socks_per_channel=4 chunk=auto window=auto"
        );
        let l = TuneSpace::parse(Subject::SocketBackend, &["layout=1x16,2x8,4x4".into()]).unwrap();
        assert_eq!(
            l.vars(&[1]),
            [
                ("channels".to_string(), "2".to_string()),
                ("socks_per_channel".to_string(), "8".to_string())
            ]
        );
    }
}
