//! `tcpx-run bench`: one experiment as server, client or both (local), printed as an
//! nccl-tests table (or, with `--json`, one JSON document on stdout and the table on stderr) and
//! appended to a CSV file. The run is `tcpx_flows::standalone`; this module maps flags
//! onto it, prints the JSON document and writes a flow process's report.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use tcpx_bench::flags::ExperimentFlags;
use tcpx_bench::Experiment;
use tcpx_flows::standalone::{self, BenchRole, Standalone};

pub use tcpx_flows::standalone::host_name;

/// Default control port.
pub const DEFAULT_PORT: u16 = 5299;

/// `--role`'s values: the words of [`BenchRole`], each with what that side does.
fn role_parser() -> impl clap::builder::TypedValueParser<Value = BenchRole> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let help = |r: BenchRole| match r {
        BenchRole::Server => "Receives; listens for the client",
        BenchRole::Client => "Sends; connects to the server given by --peer",
        BenchRole::Local => "Both, in this process, over loopback",
    };
    PossibleValuesParser::new(BenchRole::ALL.map(|r| PossibleValue::new(r.as_str()).help(help(r))))
        .try_map(|w| BenchRole::from_word(&w).ok_or_else(|| format!("unknown role `{w}`")))
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Which side this process plays.
    #[arg(long, value_parser = role_parser(), default_value = "local")]
    role: BenchRole,
    /// Client: the server's address (HOST or HOST:PORT). Server: the address to listen on.
    #[arg(long)]
    peer: Option<String>,
    /// Control port (server listens, client connects) when --peer gives none.
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Write this side's raw samples (t_s,source,subject,metric,value per size) to this CSV file.
    #[arg(long)]
    samples_csv: Option<PathBuf>,
    /// CSV file to append results to.
    #[arg(long, default_value = "reports/bench.csv")]
    csv: PathBuf,
    /// Do not write CSV.
    #[arg(long)]
    no_csv: bool,
    /// Print one JSON document on stdout (tool, version, host, time, experiment, every figure)
    /// and nothing else; the table goes to stderr.
    #[arg(long)]
    json: bool,
    /// (Internal, for multi-process children) the experiment as JSON; other settings are ignored.
    #[arg(long, hide = true)]
    experiment_json: Option<String>,
    /// (Internal, for multi-process children) write this process's `ChildReport` (measurements,
    /// NIC plan, typed error) to this file for the parent to read.
    #[arg(long, hide = true)]
    report_json: Option<PathBuf>,
    /// Test hook (server only): accept the client's control connection, then exit with status 3,
    /// as a child that crashes mid-experiment would.
    #[arg(long, hide = true)]
    test_exit_after_accept: bool,
    /// Test hook (client only): exit with status 3 before connecting, as a child that dies
    /// early would; its server is left waiting for a client that never comes.
    #[arg(long, hide = true)]
    test_exit_before_connect: bool,
    /// The experiment's knobs, one flag each, from the knob table (last, so that `--help` can
    /// place every flag).
    #[command(flatten)]
    knobs: KnobArgs,
}

/// Where `--help` lists each flag; flags not named here (a knob added to the table) follow in
/// table order.
const HELP_ORDER: &[&str] = &[
    "role",
    "peer",
    "port",
    "size",
    "iters",
    "warmup",
    "flows",
    "channels",
    "socks-per-channel",
    "chunk",
    "window",
    "transport",
    "memory",
    "verify",
    "sock-buf",
    "zero-copy-min",
    "timeout",
    "send-cpus",
    "recv-cpus",
    "sample-ms",
    "samples-csv",
    "env",
    "name",
    "csv",
    "no-csv",
    "json",
    "nics",
    "nic-policy",
    "multi-process",
];

/// Every knob of [`tcpx_model::KNOBS`] that has a flag, as `tcpx-run bench`'s argument: its
/// name, variable, default, help and value shape from the table; values kept as text for
/// [`ExperimentFlags`].
#[derive(Clone, Debug, Default)]
pub struct KnobArgs(ExperimentFlags);

impl KnobArgs {
    /// The experiment these flags give (for `fleet`, which takes the same knob flags).
    pub fn experiment(&self) -> std::result::Result<Experiment, String> {
        self.0.experiment()
    }
}

/// `--verify`'s words, for a knob that is on or off.
const ON_OFF: [&str; 2] = ["on", "off"];

fn knob_arg(spec: &'static tcpx_model::KnobSpec, flag: &'static str) -> clap::Arg {
    use clap::{builder::PossibleValuesParser, Arg, ArgAction};
    use tcpx_model::KnobKind;
    let mut arg = Arg::new(spec.name)
        .long(flag)
        .help(spec.flag_help())
        .value_name(spec.value_name());
    if let Some(a) = spec.alias {
        arg = arg.visible_alias(a);
    }
    if let Some(env) = spec.env {
        arg = arg.env(env);
    }
    if spec.switch.is_some() {
        return arg.action(ArgAction::SetTrue);
    }
    arg = arg.allow_hyphen_values(spec.numeric());
    match spec.flag_kind() {
        KnobKind::Bool => {
            let default = if spec.default == "false" { "off" } else { "on" };
            arg.value_parser(PossibleValuesParser::new(ON_OFF))
                .default_value(default)
        }
        KnobKind::Settings => arg.action(ArgAction::Append),
        KnobKind::Names => arg.action(ArgAction::Append).value_delimiter(','),
        // Unset means "auto" / "off": no default to show.
        KnobKind::OptSize { .. } | KnobKind::OptInt { .. } => arg,
        _ if spec.default.is_empty() => arg,
        _ => arg.default_value(spec.default),
    }
}

fn flagged_knobs() -> impl Iterator<Item = (&'static tcpx_model::KnobSpec, &'static str)> {
    tcpx_model::KNOBS.iter().filter_map(|s| Some((s, s.flag?)))
}

impl clap::Args for KnobArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let cmd = cmd.args(flagged_knobs().map(|(s, f)| knob_arg(s, f)));
        // Every flag in its place: the derived ones came first, the knobs' were added here.
        let later = HELP_ORDER.len();
        let flags: Vec<(clap::Id, usize)> = cmd
            .get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                let place = HELP_ORDER.iter().position(|h| *h == long).or_else(|| {
                    tcpx_model::KNOBS
                        .iter()
                        .position(|s| s.flag == Some(long))
                        .map(|i| later + i)
                })?;
                Some((a.get_id().clone(), place))
            })
            .collect();
        flags.into_iter().fold(cmd, |cmd, (id, place)| {
            cmd.mut_arg(id, |a| a.display_order(place))
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for KnobArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = ExperimentFlags::default();
        for (spec, _) in flagged_knobs() {
            let values: Vec<String> = match spec.switch {
                Some(on) if m.get_flag(spec.name) => vec![on.to_string()],
                Some(_) => Vec::new(),
                None => m
                    .get_many::<String>(spec.name)
                    .map(|v| v.cloned().collect())
                    .unwrap_or_default(),
            };
            if !values.is_empty() {
                flags.0.insert(spec.knob, values);
            }
        }
        Ok(KnobArgs(flags))
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl BenchArgs {
    /// The experiment, and for a netplugin run the plugin chunk with where it came from (a
    /// supplied one is already among the experiment's variables).
    pub fn experiment(
        &self,
    ) -> Result<(Experiment, Option<tcpx_transport::netplugin::PluginChunk>)> {
        if let Some(json) = &self.experiment_json {
            // A flow process: its parent decided the chunk and put it in the experiment (this
            // keeps it); whoever else gives an experiment as JSON gets the same rule.
            let mut exp = tcpx_bench::flags::experiment_from_json(json).map_err(|e| anyhow!(e))?;
            let chunk = plugin_chunk(&mut exp)?;
            let top = exp.flow_index.is_none();
            return Ok((exp, chunk.filter(|_| top)));
        }
        let exp = self.knobs.0.experiment().map_err(|e| {
            anyhow!(tcpx_model::knob::error_from_env(
                e,
                |k| std::env::var(k).ok(),
                std::env::args()
            ))
        })?;
        let mut exp = exp;
        let chunk = plugin_chunk(&mut exp)?;
        standalone::check(&exp, self.samples_csv.as_deref())?;
        Ok((exp, chunk))
    }

    fn standalone(&self, exp: Experiment, side_env: tcpx_bench::SideEnv) -> Standalone {
        Standalone {
            role: self.role,
            peer: self.peer.clone(),
            port: self.port,
            exp,
            csv: (!self.no_csv).then(|| self.csv.clone()),
            samples_csv: self.samples_csv.clone(),
            side_env,
        }
    }
}

pub fn run(a: &BenchArgs) -> Result<ExitCode> {
    // A flow process dies with the process that started it.
    if let Err(e) = tcpx_flows::process::die_with_parent_from_env() {
        eprintln!("tcpx-run bench: {e}");
        return Ok(ExitCode::from(2));
    }
    let Some(report) = &a.report_json else {
        return run_side(a);
    };
    // The parent decides from the report alone: write one whatever happened.
    let result = run_side(a);
    if let Err(e) = &result {
        if let Err(w) = standalone::child_report_for(e.as_ref()).write(report) {
            eprintln!(
                "tcpx-run bench: writing the report {}: {w}",
                report.display()
            );
        }
    }
    result
}

/// One side of the experiment (or the multi-process parent); writes the success report when
/// asked for one.
fn run_side(a: &BenchArgs) -> Result<ExitCode> {
    let (exp, chunk) = a.experiment()?;
    // This process's backend settings, read once from its environment.
    let run = a.standalone(exp, crate::backend_env::side_env()?);
    let json = a.json;
    let text = move || human(json);
    if let Some(c) = &chunk {
        let mut out = text();
        writeln!(out, "# {}", c.line())?;
        out.flush()?;
    }
    let r = if run.runs_a_process_per_flow(tcpx_gpu::device_count().unwrap_or(0)) {
        let launcher = crate::flow_launcher::SelfLauncher::shared()?;
        run.run_multi_process(&*launcher, &text)?
    } else {
        if a.test_exit_after_accept && a.role == BenchRole::Server {
            return exit_after_accept(&run);
        }
        if a.test_exit_before_connect && a.role == BenchRole::Client {
            eprintln!(
                "tcpx-run bench: test hook --test-exit-before-connect: exiting with status 3"
            );
            std::process::exit(3);
        }
        run.run_in_process(&text)?
    };
    if a.json {
        let mut doc = r.json_document("tcpx-run bench", crate::VERSION, run.role, &run.exp);
        if let Some(c) = &chunk {
            doc["start"]["plugin_chunk"] = serde_json::json!({
                "variable": tcpx_transport::netplugin::DYNAMIC_CHUNK_VAR,
                "bytes": c.bytes,
                "source": c.source.as_str(),
            });
        }
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string(&doc)?)?;
        out.flush()?;
    }
    if let Some(path) = &a.report_json {
        r.child_report()
            .write(path)
            .with_context(|| format!("writing the report {}", path.display()))?;
    }
    if let Some(e) = r.csv_error {
        return Err(anyhow::Error::new(e)
            .context("the run finished but its CSV rows could not all be written"));
    }
    if r.wrong_bytes > 0 {
        eprintln!(
            "tcpx-run: {} received bytes differ from what was sent",
            r.wrong_bytes
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// A netplugin run never starts with GPUDirect-TCPX's dynamic chunk at 0: the experiment's value
/// or the environment's is kept (a zero or unusable one refused with the fix), and with neither
/// Google's value goes into the experiment's variables (`tcpx_transport::netplugin::
/// supply_plugin_chunk` decides; the binary reads the environment).
pub fn plugin_chunk(
    exp: &mut Experiment,
) -> Result<Option<tcpx_transport::netplugin::PluginChunk>> {
    use tcpx_transport::netplugin::{supply_plugin_chunk, DYNAMIC_CHUNK_VAR};
    let process = std::env::var(DYNAMIC_CHUNK_VAR).ok();
    supply_plugin_chunk(exp, process.as_deref()).map_err(|e| anyhow!(e))
}

/// Where the human text goes: stdout, or stderr when stdout carries the `--json` document.
///
/// The handle is unlocked: each write takes the stream's lock and lets it go. A locked handle
/// (`stderr().lock()`) is held for the whole run, and a plugin thread logging a warning to
/// stderr (GPUDirect-TCPX warns on every host-memory receive) then waits for it forever while
/// the run waits for that thread: the `--json` stall of issue 29.
fn human(json: bool) -> Box<dyn Write> {
    if json {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    }
}

/// The test hook behind `--test-exit-after-accept`: the client sees its control connection
/// close during the handshake, as when the server process dies.
fn exit_after_accept(run: &Standalone) -> Result<ExitCode> {
    let listener = tcpx_bench::bind_control(run.address("0.0.0.0")?)?;
    let deadline = std::time::Instant::now() + run.exp.timeout();
    let peer = tcpx_transport::socket::accept_until(&listener, deadline)?
        .map(|(_, p)| p.to_string())
        .unwrap_or_else(|| "nobody (timed out)".into());
    eprintln!("tcpx-run bench: test hook --test-exit-after-accept: accepted {peer}, exiting with status 3");
    std::process::exit(3);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tcpx-run bench`'s flags are the knob table's: every knob with a flag has it, with the
    /// table's environment variable and default.
    #[test]
    fn bench_flags_follow_the_knob_table() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let cmd = <Cli as clap::CommandFactory>::command();
        for spec in tcpx_model::KNOBS {
            let Some(flag) = spec.flag else {
                continue;
            };
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                .unwrap_or_else(|| panic!("knob {} names --{flag}, which bench lacks", spec.name));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                spec.env,
                "--{flag}'s variable"
            );
            let defaults: Vec<_> = arg
                .get_default_values()
                .iter()
                .filter_map(|d| d.to_str())
                .collect();
            if let [d] = defaults.as_slice() {
                // Flags that are switches (verify on/off, multi-process) spell their default
                // their own way.
                if !matches!(flag, "verify" | "multi-process") {
                    assert_eq!(*d, spec.default, "--{flag}'s default");
                }
            }
        }
        // And no flag reads a TCPX_ variable the table does not list.
        for arg in cmd.get_arguments() {
            if let Some(env) = arg.get_env().and_then(|e| e.to_str()) {
                assert!(
                    tcpx_model::knob::by_env(env).is_some(),
                    "--{:?} reads {env}, which no knob declares",
                    arg.get_long()
                );
            }
        }
    }
}
