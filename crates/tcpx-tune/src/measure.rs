//! Measuring one point by the subject itself, in fresh processes.
//!
//! [`NcclPoint`]: libnccl send/recv between two rank processes on one GPU (two NCCL hosts), the
//! point's variables in their environment and NCCL's log read back
//! ([`tcpx_validate::run_point`]): a point whose log shows another network than the one tuned
//! (a silent fallback) counts as failed. [`BenchPoint`]: `tcpx-run bench --role local` with the
//! point's knobs as flags ([`tcpx_validate::run_bench_child`]). Both are bounded by a deadline
//! per point; the figure is the receiver's busbw at the largest size.

use serde::Serialize;
use tcpx_model::setting::Network;
use tcpx_model::Knob;
use tcpx_validate::{BenchCommand, Setup, ValidateConfig};

/// What one point gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Receiver busbw in GB/s (1e9 B/s) at the largest size, or why the point failed.
    pub gbs: Result<f64, String>,
    pub evidence: Option<Evidence>,
}

/// What NCCL's log said about a point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evidence {
    /// Networks named by "Using network X".
    pub networks: Vec<String>,
    /// Variables set that NCCL (or the plugin) did not report reading as set.
    pub problems: Vec<String>,
}

/// Measures points of a space.
pub trait Measure {
    /// Measures the point whose settings are `values` (`name=value`, `default` levels
    /// included); `name` names its files.
    fn measure(&mut self, values: &[(String, String)], name: &str) -> Measured;
    /// What a point measures, in words (for the report).
    fn describe(&self) -> String;
}

/// The largest size's figure of a run's `(size, GB/s)` list.
fn largest(figures: &[(u64, f64)]) -> Result<f64, String> {
    figures
        .iter()
        .max_by_key(|(s, _)| *s)
        .map(|(_, g)| *g)
        .ok_or_else(|| "the run reported no figure".to_string())
}

/// libnccl send/recv of a point (see the module documentation).
pub struct NcclPoint<'a> {
    pub network: Network,
    pub cfg: ValidateConfig,
    pub setup: Setup,
    pub command: BenchCommand<'a>,
    /// Set in every point, the base included: `NCCL_NET`, so NCCL fails rather than run another
    /// network than the one tuned.
    pub pinned: Vec<(String, String)>,
    /// The net plugin NCCL loads (the `tcpx` network), with the process environment's GDR level
    /// and plugin chunk: each point's plugin variables are worked out with its own settings
    /// ([`tcpx_validate::net_plugin_env`]), so a point's own `NCCL_DYNAMIC_CHUNK_SIZE` is kept.
    pub plugin: Option<PluginEnv>,
}

/// A net plugin and the environment's say on it.
#[derive(Debug, Clone)]
pub struct PluginEnv {
    pub path: String,
    pub gdr_level: Option<String>,
    pub chunk: Option<String>,
}

impl Measure for NcclPoint<'_> {
    fn measure(&mut self, values: &[(String, String)], name: &str) -> Measured {
        let mut vars: Vec<(String, String)> = self.pinned.clone();
        for (k, v) in values {
            if v == crate::space::DEFAULT_LEVEL {
                continue;
            }
            match tcpx_model::setting::spec(self.network, k).map(|s| s.parse(v).map(|n| s.text(n)))
            {
                Some(Ok(text)) => vars.push((k.clone(), text)),
                Some(Err(e)) => {
                    return Measured {
                        gbs: Err(e),
                        evidence: None,
                    }
                }
                None => {
                    return Measured {
                        gbs: Err(format!("`{k}` is not a setting of this network")),
                        evidence: None,
                    }
                }
            }
        }
        let mut setup = self.setup.clone();
        if let Some(p) = &self.plugin {
            match tcpx_validate::net_plugin_env(
                Some(&p.path),
                &vars,
                p.gdr_level.as_deref(),
                p.chunk.as_deref(),
            ) {
                Ok(x) => setup.extras = x,
                Err(e) => {
                    return Measured {
                        gbs: Err(e),
                        evidence: None,
                    }
                }
            }
        }
        let (figures, ev) = tcpx_validate::run_point(&self.cfg, &vars, &setup, self.command, name);
        let evidence = ev.map(|e| Evidence {
            networks: e.networks.clone(),
            problems: e.problems.clone(),
        });
        let want = self.network.nccl_net_name();
        let gbs = figures
            .and_then(|f| largest(&f))
            .and_then(|g| match &evidence {
                Some(e)
                    if !e.networks.is_empty()
                        && !e.networks.iter().all(|n| n.eq_ignore_ascii_case(want)) =>
                {
                    Err(format!(
                        "NCCL used network {} instead of {want}: not the network being tuned",
                        e.networks.join(", ")
                    ))
                }
                _ => Ok(g),
            });
        Measured { gbs, evidence }
    }

    fn describe(&self) -> String {
        let sizes: Vec<String> = self
            .cfg
            .sizes
            .iter()
            .map(|&s| tcpx_model::format_size(s))
            .collect();
        format!(
            "libnccl send/recv of {} ({} timed iterations after {} untimed), {}, receiver busbw \
             at the largest size; every point in two fresh rank processes",
            sizes.join(", "),
            self.cfg.iters,
            self.cfg.warmup,
            self.setup.placement.describe()
        )
    }
}

/// `tcpx-run bench --role local` of a point (the socket backend).
pub struct BenchPoint<'a> {
    /// Arguments after `tcpx-run` every point shares (`bench --role local --transport socket
    /// --memory ... --size ... --json --no-csv`).
    pub common: Vec<String>,
    pub command: BenchCommand<'a>,
    pub limit: std::time::Duration,
}

impl BenchPoint<'_> {
    /// The flags a point adds: each knob's own `--flag value` (from the knob table); `layout`
    /// is `--channels C --socks-per-channel S`.
    pub fn flags(values: &[(String, String)]) -> Result<Vec<String>, String> {
        let mut out = Vec::new();
        for (k, v) in values {
            let pairs: Vec<(Knob, String)> = if k == "layout" {
                let (c, s) = v
                    .split_once('x')
                    .ok_or_else(|| format!("layout={v}: write CxS"))?;
                vec![
                    (Knob::Channels, c.into()),
                    (Knob::SocksPerChannel, s.into()),
                ]
            } else {
                let knob = Knob::from_name(k).ok_or_else(|| format!("unknown knob `{k}`"))?;
                vec![(knob, v.clone())]
            };
            for (knob, value) in pairs {
                if value == "auto" {
                    // The bench's own default: no flag.
                    continue;
                }
                let flag = knob
                    .spec()
                    .flag
                    .ok_or_else(|| format!("`{}` has no bench flag", knob.name()))?;
                out.push(format!("--{flag}"));
                out.push(value);
            }
        }
        Ok(out)
    }
}

impl Measure for BenchPoint<'_> {
    fn measure(&mut self, values: &[(String, String)], name: &str) -> Measured {
        let gbs = BenchPoint::flags(values).and_then(|flags| {
            let mut args = self.common.clone();
            args.extend(flags);
            args.push("--name".into());
            args.push(name.to_string());
            tcpx_validate::run_bench_child(&args, self.command, self.limit)
                .and_then(|f| largest(&f))
        });
        Measured {
            gbs,
            evidence: None,
        }
    }

    fn describe(&self) -> String {
        format!(
            "tcpx-run {}, receiver busbw at the largest size; every point in a fresh process",
            self.common.join(" ")
        )
    }
}

/// What `tcpx-run tune` was given for measuring points (the environment already read).
#[derive(Debug, Clone)]
pub struct PointOptions {
    pub sizes: Vec<u64>,
    /// `--size` as given (the bench child takes it as text).
    pub size_text: String,
    pub iters: u32,
    pub warmup: u32,
    /// The GPU NCCL's two ranks share as two NCCL hosts.
    pub gpu: usize,
    /// The socket backend's memory (`host`, `cuda:S,R`).
    pub memory: String,
    /// The plugin NCCL loads (`tcpx`): `--net-plugin`, else `$NCCL_NET_PLUGIN`.
    pub net_plugin: Option<String>,
    /// `$NCCL_NET_GDR_LEVEL` and `$NCCL_DYNAMIC_CHUNK_SIZE`.
    pub gdr_level: Option<String>,
    pub plugin_chunk: Option<String>,
    /// The most one point may take.
    pub limit: std::time::Duration,
    pub nccl_logs: Option<std::path::PathBuf>,
}

/// A subject's way of measuring points, with what was found on the machine.
pub struct Prepared<'a> {
    pub measure: Box<dyn Measure + 'a>,
    /// libnccl, the GPUs and where the ranks go (NCCL subjects).
    pub found: Option<String>,
    /// The plugin NCCL loads (`tcpx`).
    pub net_plugin: Option<String>,
}

/// How `subject`'s points are measured here, `command` starting a bare `tcpx-run`; an error
/// says what is missing (libnccl, a GPU, the plugin).
pub fn prepare<'a>(
    subject: crate::Subject,
    o: &PointOptions,
    command: BenchCommand<'a>,
) -> Result<Prepared<'a>, String> {
    match subject {
        crate::Subject::Nccl(network) => {
            let cfg = ValidateConfig {
                sizes: o.sizes.clone(),
                reps: 1,
                iters: o.iters,
                warmup: o.warmup,
                send_gpu: o.gpu,
                recv_gpu: o.gpu,
            };
            let nccl = tcpx_ffi::nccl::Nccl::load()
                .map(|n| format!("libnccl {} ({})", n.version(), n.path()))
                .map_err(|e| e.to_string());
            let gpus = tcpx_gpu::device_count().map_err(|e| e.to_string());
            let (found, placement) = tcpx_validate::prerequisites(gpus, nccl, &cfg)
                .map_err(|e| format!("tune {} cannot run here: {e}", subject.name()))?;
            let plugin = match network {
                Network::Socket => None,
                Network::Tcpx => {
                    let p = o.net_plugin.clone().ok_or(
                        "tune tcpx needs the plugin NCCL loads: give --net-plugin PATH (the \
                         GPUDirect-TCPX libnccl-net.so)",
                    )?;
                    if !std::path::Path::new(&p).is_file() && p.contains('/') {
                        return Err(format!("--net-plugin {p}: no such file"));
                    }
                    Some(PluginEnv {
                        path: p,
                        gdr_level: o.gdr_level.clone(),
                        chunk: o.plugin_chunk.clone(),
                    })
                }
            };
            if let Some(d) = &o.nccl_logs {
                std::fs::create_dir_all(d)
                    .map_err(|e| format!("--nccl-logs {}: creating it: {e}", d.display()))?;
            }
            let setup = Setup {
                placement,
                extras: Default::default(),
                log_dir: o.nccl_logs.clone(),
                run_deadline: o.limit,
            };
            let net_plugin = plugin.as_ref().map(|p| p.path.clone());
            Ok(Prepared {
                measure: Box::new(NcclPoint {
                    network,
                    cfg,
                    setup,
                    command,
                    pinned: vec![("NCCL_NET".into(), network.nccl_net_name().into())],
                    plugin,
                }),
                found: Some(found),
                net_plugin,
            })
        }
        crate::Subject::SocketBackend => {
            let memory: tcpx_model::Memory = o
                .memory
                .parse()
                .map_err(|e| format!("--memory `{}`: {e}", o.memory))?;
            let common: Vec<String> = [
                "bench",
                "--role",
                "local",
                "--transport",
                crate::Subject::SocketBackend.name(),
                "--memory",
                &memory.to_string(),
                "--size",
                &o.size_text,
                "--iters",
                &o.iters.to_string(),
                "--warmup",
                &o.warmup.to_string(),
                "--no-csv",
                "--json",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            Ok(Prepared {
                measure: Box::new(BenchPoint {
                    common,
                    command,
                    limit: o.limit,
                }),
                found: None,
                net_plugin: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_points_knobs_become_the_benchs_own_flags() {
        let f = BenchPoint::flags(&[
            ("layout".into(), "2x8".into()),
            ("chunk".into(), "4M".into()),
            ("window".into(), "32".into()),
        ])
        .unwrap();
        assert_eq!(
            f,
            [
                "--channels",
                "2",
                "--socks-per-channel",
                "8",
                "--chunk",
                "4M",
                "--window",
                "32"
            ]
        );
        assert!(BenchPoint::flags(&[("nonsense".into(), "1".into())]).is_err());
    }

    #[test]
    fn the_largest_sizes_figure_is_the_points() {
        assert_eq!(
            largest(&[(1 << 20, 1.0), (1 << 28, 9.5), (1 << 24, 4.0)]),
            Ok(9.5)
        );
        assert!(largest(&[]).is_err());
    }
}
