//! Every knob an experiment has, declared once.
//!
//! [`KNOBS`] names, for each [`Knob`], its type and range ([`KnobKind`]), its default, the
//! `tcpx-run bench` flag and environment variable that set it, its CSV column and its doc.
//! The command line, the CSV header, the plan API's checks, tuned.env's variables and
//! docs/PLANS.md's table are generated from it or tested against it: a new knob is one entry
//! here plus its use where it acts, and its rows in [`crate::equivalence::EQUIVALENCES`] when
//! NCCL, the GPUDirect-TCPX plugin or the UCCL seed benchmark has a setting for it.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What values a knob takes (in plans; the command line takes the same values as text).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KnobKind {
    /// Whole number in `min..=max`.
    Int {
        min: i64,
        max: i64,
    },
    /// Byte count (a number or a size text like "4M") in `min..=max`.
    Size {
        min: u64,
        max: u64,
    },
    /// Like `Int`, or `"auto"` / `()` for the default.
    OptInt {
        min: i64,
        max: i64,
    },
    /// Like `Size`, or `"auto"` / `()` for the default.
    OptSize {
        min: u64,
        max: u64,
    },
    /// A list of byte counts, each in `min..=max`.
    Sizes {
        min: u64,
        max: u64,
    },
    /// A number in `min..=max`.
    Float {
        min: f64,
        max: f64,
    },
    Bool,
    /// One of these words.
    Choice(&'static [&'static str]),
    /// Any text.
    Text,
    /// Where buffers live: `host`, `cuda` or `cuda:S,R` ([`crate::Memory`]).
    Memory,
    /// A cpu list ([`crate::CpuSet`]).
    Cpus,
    /// `KEY=VALUE` settings.
    Settings,
    /// Interface names or addresses.
    Names,
}

impl KnobKind {
    /// Whether a whole number or byte count lies in this kind's range; a kind without a range
    /// of whole numbers admits every one. The command line, plans and experiments that arrive
    /// as JSON all ask this, so a knob's range is the table's alone.
    pub fn admits(&self, v: i128) -> bool {
        match *self {
            KnobKind::Int { min, max } | KnobKind::OptInt { min, max } => {
                (i128::from(min)..=i128::from(max)).contains(&v)
            }
            KnobKind::Size { min, max }
            | KnobKind::OptSize { min, max }
            | KnobKind::Sizes { min, max } => (i128::from(min)..=i128::from(max)).contains(&v),
            _ => true,
        }
    }

    /// Whether a number lies in a `Float` kind's range (NaN never does); other kinds admit
    /// every number.
    pub fn admits_float(&self, v: f64) -> bool {
        match *self {
            KnobKind::Float { min, max } => v >= min && v <= max,
            _ => true,
        }
    }

    /// The range as a user writes it (`1..=64`, sizes `4K..=1G`, `0.1..=86400`); `None` for a
    /// kind without one.
    pub fn range_text(&self) -> Option<String> {
        match *self {
            KnobKind::Int { min, max } | KnobKind::OptInt { min, max } => {
                Some(format!("{min}..={max}"))
            }
            KnobKind::Size { min, max }
            | KnobKind::OptSize { min, max }
            | KnobKind::Sizes { min, max } => Some(format!(
                "{}..={}",
                crate::format_size(min),
                crate::format_size(max)
            )),
            KnobKind::Float { min, max } => Some(format!("{min}..={max}")),
            _ => None,
        }
    }

    /// Whether values of this kind are numbers with a range.
    pub fn has_range(&self) -> bool {
        self.range_text().is_some()
    }
}

macro_rules! knobs {
    ($($(#[$doc:meta])* $v:ident = $name:literal,)*) => {
        /// One knob of an experiment. The serde form and `Display` are the knob's plan name;
        /// knobs order by that name (see the `Ord` impl).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum Knob {
            $($(#[$doc])* #[serde(rename = $name)] $v,)*
        }

        impl Knob {
            /// Every knob, in the order reports list them.
            pub const ALL: &'static [Knob] = &[$(Knob::$v,)*];

            /// The name plans, reports and JSON use.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Knob::$v => $name,)*
                }
            }
        }
    };
}

knobs! {
    Name = "name",
    Label = "label",
    Transport = "transport",
    Memory = "memory",
    Sizes = "sizes",
    /// One size; sets `sizes` to `[size]`.
    Size = "size",
    Iters = "iters",
    Warmup = "warmup",
    Flows = "flows",
    Channels = "channels",
    SocksPerChannel = "socks_per_channel",
    Chunk = "chunk",
    Window = "window",
    PluginChunk = "plugin_chunk",
    Verify = "verify",
    SockBuf = "sock_buf",
    ZeroCopyMin = "zero_copy_min",
    Barrier = "barrier",
    StagingRing = "staging_ring",
    WorkerCpus = "worker_cpus",
    TimeoutS = "timeout_s",
    Nics = "nics",
    NicPolicy = "nic_policy",
    IrqPolicy = "irq_policy",
    ThreadBinding = "thread_binding",
    ProcessMode = "process_mode",
    Sample = "sample",
    Repeat = "repeat",
    SendCpus = "send_cpus",
    RecvCpus = "recv_cpus",
    SampleMs = "sample_ms",
    Env = "env",
}

impl Knob {
    /// This knob's entry in [`KNOBS`].
    pub const fn spec(self) -> &'static KnobSpec {
        let mut i = 0;
        while i < KNOBS.len() {
            if KNOBS[i].knob as usize == self as usize {
                return &KNOBS[i];
            }
            i += 1;
        }
        // Every knob has exactly one entry (tested), so this is never reached.
        &KNOBS[0]
    }

    /// The environment variable `tcpx-run bench` reads for this knob's flag; empty for a knob
    /// without one (tested: every knob the command line reads from the environment has one).
    pub const fn env_var(self) -> &'static str {
        match self.spec().env {
            Some(e) => e,
            None => "",
        }
    }

    /// The default as the command line writes it.
    pub const fn default_text(self) -> &'static str {
        self.spec().default
    }

    /// The knob a plan names `name`, if any.
    pub fn from_name(name: &str) -> Option<Knob> {
        Knob::ALL.iter().copied().find(|k| k.name() == name)
    }
}

crate::display_as_word!(Knob, name);

/// Knobs order by name, not by declaration: a map keyed by knob (a run record's knobs, the
/// knobs not applied) then iterates, serializes and makes CSV columns in the order a map keyed
/// by the name did, so records on disk keep their bytes.
impl Ord for Knob {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name().cmp(other.name())
    }
}

impl PartialOrd for Knob {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl FromStr for Knob {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Knob::from_name(s).ok_or_else(|| format!("unknown knob `{s}`"))
    }
}

/// One row of the knob table.
#[derive(Debug, Clone, Copy)]
pub struct KnobSpec {
    pub knob: Knob,
    /// The knob's name ([`Knob::name`]), as plans write it.
    pub name: &'static str,
    /// Values a plan may give it.
    pub kind: KnobKind,
    /// The default as a user would write it; empty when there is none (or the target set's).
    pub default: &'static str,
    /// Whether a plan script may set it (`experiment(#{..})`, `.with`).
    pub in_plan: bool,
    /// `tcpx-run bench`'s flag (without `--`), when it has one.
    pub flag: Option<&'static str>,
    /// The environment variable `tcpx-run bench` falls back to for the flag, and tuned.env
    /// writes to reproduce the configuration.
    pub env: Option<&'static str>,
    /// The column of `tcpx-run bench`'s CSV file that shows it.
    pub csv: Option<&'static str>,
    /// What it does, one line.
    pub doc: &'static str,
    /// The flag's help in `tcpx-run bench --help`, when it says more than `doc` (`{choices}`
    /// stands for the words of a `Choice` knob).
    pub help: &'static str,
    /// Another name the flag answers to, shown in `--help`.
    pub alias: Option<&'static str>,
    /// The flag's value placeholder in `--help`; default: the flag in capitals.
    pub value_name: Option<&'static str>,
    /// What the flag's values are when they differ from a plan's (`nics`: a plan gives a count,
    /// the command line this side's NIC names).
    pub flag_kind: Option<KnobKind>,
    /// The flag is a switch, which sets the knob to this value when given.
    pub switch: Option<&'static str>,
}

impl KnobSpec {
    /// The flag's help text: `help` (with `{choices}` filled in), else `doc`.
    pub fn flag_help(&self) -> String {
        if self.help.is_empty() {
            return self.doc.to_string();
        }
        match self.kind {
            KnobKind::Choice(words) => self.help.replace("{choices}", &words.join(", ")),
            _ => self.help.to_string(),
        }
    }

    /// What the flag's values are.
    pub fn flag_kind(&self) -> KnobKind {
        self.flag_kind.unwrap_or(self.kind)
    }

    /// The flag's value placeholder (`--window <WINDOW>`).
    pub fn value_name(&self) -> String {
        match (self.value_name, self.flag) {
            (Some(v), _) => v.to_string(),
            (None, Some(f)) => f.replace('-', "_").to_uppercase(),
            (None, None) => self.name.to_uppercase(),
        }
    }

    /// Whether a value of this kind is a number, which may be negative on the command line (so
    /// that `--window -2` reaches the range check instead of being taken for a flag).
    pub fn numeric(&self) -> bool {
        matches!(
            self.flag_kind(),
            KnobKind::Int { .. }
                | KnobKind::OptInt { .. }
                | KnobKind::Size { .. }
                | KnobKind::OptSize { .. }
                | KnobKind::Sizes { .. }
                | KnobKind::Float { .. }
        )
    }
}

const G: u64 = 1 << 30;

/// A row for `knob` with nothing but its name: entries fill in the rest.
const fn row(knob: Knob) -> KnobSpec {
    KnobSpec {
        knob,
        name: knob.name(),
        ..ROW
    }
}

const ROW: KnobSpec = KnobSpec {
    knob: Knob::Name,
    name: "name",
    kind: KnobKind::Text,
    default: "",
    in_plan: true,
    flag: None,
    env: None,
    csv: None,
    doc: "",
    help: "",
    alias: None,
    value_name: None,
    flag_kind: None,
    switch: None,
};

/// Every knob, in the order reports list them.
pub const KNOBS: &[KnobSpec] = &[
    KnobSpec {
        kind: KnobKind::Text,
        default: "bench",
        flag: Some("name"),
        csv: Some("name"),
        doc: "experiment name (unique in a run; derived when varied)",
        help: "Experiment name for tables and CSV",
        ..row(Knob::Name)
    },
    KnobSpec {
        kind: KnobKind::Text,
        doc: "configuration label in tables and bar charts (derived when varied)",
        ..row(Knob::Label)
    },
    KnobSpec {
        kind: KnobKind::Choice(&crate::Backend::NAMES),
        default: "socket",
        flag: Some("transport"),
        env: Some("TCPX_TRANSPORT"),
        csv: Some("transport"),
        doc: "backend moving the bytes (cudap2p: GPU to GPU inside one node)",
        help: "Backend moving the bytes: {choices} (`tcpx-run doctor` says which can open here)",
        ..row(Knob::Transport)
    },
    KnobSpec {
        kind: KnobKind::Memory,
        default: "host",
        flag: Some("memory"),
        env: Some("TCPX_MEMORY"),
        csv: Some("memory"),
        doc: "where buffers live: host, cuda (flow f on GPU f on both sides) or cuda:S,R \
              (sender's flows from GPU S, receiver's from GPU R)",
        help: "Where buffers live: host, cuda (flow f on GPU f on both sides) or cuda:S,R \
               (sender's flows from GPU S, receiver's from GPU R)",
        ..row(Knob::Memory)
    },
    KnobSpec {
        kind: KnobKind::Sizes {
            min: 1,
            max: 64 * G,
        },
        default: "64M",
        flag: Some("size"),
        csv: Some("size"),
        doc: "message sizes, run in order",
        help:
            "Message sizes: 64M, a list 1M,4M or a doubling range 1M..1G (K, M, G = powers of 1024)",
        ..row(Knob::Sizes)
    },
    KnobSpec {
        kind: KnobKind::Size {
            min: 1,
            max: 64 * G,
        },
        doc: "one message size (sets sizes to [size])",
        ..row(Knob::Size)
    },
    KnobSpec {
        kind: KnobKind::Int {
            min: 1,
            max: crate::MAX_ITERS as i64,
        },
        default: "20",
        flag: Some("iters"),
        csv: Some("iters"),
        doc: "timed iterations per size",
        help: "Timed iterations per size",
        ..row(Knob::Iters)
    },
    KnobSpec {
        kind: KnobKind::Int {
            min: 0,
            max: crate::MAX_WARMUP as i64,
        },
        default: "5",
        flag: Some("warmup"),
        csv: Some("warmup"),
        doc: "untimed iterations before them",
        help: "Warm-up iterations per size (not timed)",
        ..row(Knob::Warmup)
    },
    KnobSpec {
        kind: KnobKind::Int { min: 1, max: 64 },
        default: "1",
        flag: Some("flows"),
        env: Some("TCPX_FLOWS"),
        csv: Some("flows"),
        doc: "independent flows at once (one per GPU)",
        help: "Independent flows run at once (one per GPU on GPU runs)",
        alias: Some("gpus"),
        ..row(Knob::Flows)
    },
    KnobSpec {
        kind: KnobKind::Int { min: 1, max: 64 },
        default: "2",
        flag: Some("channels"),
        env: Some("TCPX_CHANNELS"),
        csv: Some("channels"),
        doc: "channels (comms) per flow",
        help: "Channels (comms) per flow",
        ..row(Knob::Channels)
    },
    KnobSpec {
        kind: KnobKind::Int { min: 1, max: 64 },
        default: "4",
        flag: Some("socks-per-channel"),
        env: Some("TCPX_SOCKS_PER_CHANNEL"),
        csv: Some("socks_per_channel"),
        doc: "sockets per channel (socket backend)",
        help: "Sockets per channel",
        ..row(Knob::SocksPerChannel)
    },
    KnobSpec {
        kind: KnobKind::OptSize { min: 1, max: G },
        default: "auto",
        flag: Some("chunk"),
        env: Some("TCPX_CHUNK"),
        csv: Some("chunk"),
        doc: "bytes per request; \"auto\" = the automatic rule's, from sockets, channels, message \
              size, memory and backend (docs/PERFORMANCE.md, \"Chunk and window\")",
        help: "Bytes per request; default auto (the rule in docs/PERFORMANCE.md, \"Chunk and window\"; the bench header says what it chose)",
        ..row(Knob::Chunk)
    },
    KnobSpec {
        kind: KnobKind::OptInt { min: 1, max: 4096 },
        default: "auto",
        flag: Some("window"),
        env: Some("TCPX_WINDOW"),
        csv: Some("window"),
        doc: "requests in flight per channel (the backend may allow fewer); \"auto\" = the \
              automatic rule's, as chunk's",
        help: "Requests in flight per channel; default auto (as --chunk)",
        ..row(Knob::Window)
    },
    KnobSpec {
        kind: KnobKind::OptSize { min: 1, max: G },
        default: "auto",
        doc: "GPUDirect-TCPX's NCCL_DYNAMIC_CHUNK_SIZE, what the plugin splits every send by \
              (netplugin only; \"auto\" = the leader's NCCL_DYNAMIC_CHUNK_SIZE, else 524288, \
              Google's A3 value; the plugin's own 0 stalls)",
        ..row(Knob::PluginChunk)
    },
    KnobSpec {
        kind: KnobKind::Bool,
        default: "true",
        flag: Some("verify"),
        csv: Some("verify"),
        doc: "check every received byte",
        help: "Check every received byte",
        ..row(Knob::Verify)
    },
    KnobSpec {
        // Above `MAX_SOCK_BUF` the kernel would cut or wrap the value instead of granting it.
        kind: KnobKind::OptSize {
            min: 4096,
            max: crate::MAX_SOCK_BUF,
        },
        default: "auto",
        flag: Some("sock-buf"),
        env: Some("TCPX_SOCK_BUF"),
        csv: Some("sock_buf"),
        doc: "SO_SNDBUF/SO_RCVBUF; \"auto\" = Linux autotuning",
        help: "SO_SNDBUF/SO_RCVBUF to ask for (default: Linux autotuning)",
        ..row(Knob::SockBuf)
    },
    KnobSpec {
        kind: KnobKind::OptSize {
            min: crate::MIN_ZERO_COPY,
            max: crate::MAX_ZERO_COPY,
        },
        default: "off",
        flag: Some("zero-copy-min"),
        env: Some("TCPX_ZERO_COPY_MIN"),
        csv: Some("zero_copy_min"),
        doc: "send pieces of at least this many bytes with MSG_ZEROCOPY (socket backend; the \
              netplugin backend gets NCCL_MIN_ZCOPY_SIZE); \"off\" = copy every send",
        help: "Send pieces of at least this many bytes with MSG_ZEROCOPY (socket backend; \
               netplugin: NCCL_MIN_ZCOPY_SIZE); default: copy every send",
        ..row(Knob::ZeroCopyMin)
    },
    KnobSpec {
        kind: KnobKind::Choice(crate::Barrier::NAMES),
        default: "iteration",
        flag: Some("barrier"),
        env: Some("TCPX_BARRIER"),
        csv: Some("barrier"),
        doc: "where a size's start barrier falls: before every iteration, or once before the \
              timed iterations, which then run back to back as one transfer (how nccl-tests times)",
        help: "Where a size's start barrier falls ({choices}): before every iteration, or once \
               before the timed iterations, which then run back to back, the next posted while \
               this one drains (how nccl-tests times); each iteration's time is then the gap \
               between consecutive iteration ends",
        ..row(Knob::Barrier)
    },
    KnobSpec {
        kind: KnobKind::OptSize {
            min: crate::MIN_STAGING_RING,
            max: crate::MAX_STAGING_RING,
        },
        default: "auto",
        flag: Some("staging-ring"),
        env: Some("TCPX_STAGING_RING"),
        csv: Some("staging_ring"),
        doc: "GPU memory over a host-memory backend: bytes of the pinned ring each channel \
              stages through (a ring in the CPU's cache spares DRAM); a chunk must fit it; \
              \"auto\" = 4 chunks, at least 32M, at most the largest message",
        help: "Bytes of the pinned ring each channel stages GPU memory through over a \
               host-memory backend (a chunk must fit; default: 4 chunks, at least 32M, at most \
               the largest message)",
        ..row(Knob::StagingRing)
    },
    KnobSpec {
        kind: KnobKind::Choice(crate::WorkerCpus::NAMES),
        default: "auto",
        flag: Some("worker-cpus"),
        env: Some("TCPX_WORKER_CPUS"),
        csv: Some("worker_cpus"),
        doc: "socket backend: where its worker threads run: own (a CPU each, of those the side \
              may use), shared (the kernel places them), auto (own on 16 or more CPUs of one \
              NUMA node when a comm's workers are at least half of them)",
        help: "Where the socket backend's worker threads run ({choices}): `own` gives each a \
               CPU of its own among those its side may use, `shared` lets the kernel place \
               them; default `auto`: own where the side has 16 or more CPUs, all in one NUMA \
               node, and a comm's workers are at least half of them",
        ..row(Knob::WorkerCpus)
    },
    KnobSpec {
        kind: KnobKind::Float {
            min: 0.1,
            max: crate::MAX_TIMEOUT_S,
        },
        default: "30",
        flag: Some("timeout"),
        doc: "longest wait for progress, seconds",
        help: "Longest wait for any progress or for the peer, seconds",
        ..row(Knob::TimeoutS)
    },
    KnobSpec {
        kind: KnobKind::Int { min: 1, max: 8 },
        default: "1",
        flag: Some("nics"),
        doc: "NICs the channels are spread over (each side its own; loopback: 127.0.0.2, .3, ...)",
        help: "This side's NICs, comma-separated interface names (eth1,eth2) or local addresses \
               (127.0.0.2,127.0.0.3 emulate two NICs on loopback); channels bind to them per \
               --nic-policy",
        flag_kind: Some(KnobKind::Names),
        ..row(Knob::Nics)
    },
    KnobSpec {
        kind: KnobKind::Choice(&["round-robin", "numa-local", "closest-pci"]),
        default: "round-robin",
        flag: Some("nic-policy"),
        doc: "how channels are given to the NICs",
        help: "How channels are given to --nics: round-robin, numa-local, closest-pci, explicit",
        ..row(Knob::NicPolicy)
    },
    KnobSpec {
        kind: KnobKind::Choice(crate::IrqPolicy::NAMES),
        default: "default",
        doc: "NIC queue IRQ affinity during the experiment (root)",
        ..row(Knob::IrqPolicy)
    },
    KnobSpec {
        kind: KnobKind::Choice(crate::ThreadBinding::NAMES),
        default: "none",
        doc: "CPU affinity of the transfer threads",
        ..row(Knob::ThreadBinding)
    },
    KnobSpec {
        kind: KnobKind::Choice(&["single-process", "multi-process"]),
        default: "single-process",
        flag: Some("multi-process"),
        doc: "all flows in one process, or one process per flow (per GPU) on each side",
        help: "One process per flow (a `tcpx-run bench` child per GPU, flow i on control port \
               PORT+i), supervised by this one, instead of all flows in this process",
        switch: Some("multi-process"),
        ..row(Knob::ProcessMode)
    },
    KnobSpec {
        kind: KnobKind::Bool,
        default: "true",
        doc: "sample CPU, IRQ and NIC counters during the experiment",
        ..row(Knob::Sample)
    },
    KnobSpec {
        kind: KnobKind::Int { min: 1, max: 1000 },
        default: "1",
        doc: "repetitions of the experiment (default from the target set); configurations \
              compared together run their repetitions in rotating order",
        ..row(Knob::Repeat)
    },
    KnobSpec {
        kind: KnobKind::Cpus,
        in_plan: false,
        flag: Some("send-cpus"),
        doc: "CPUs the sending side's threads run on (cpu list such as 0-3,8)",
        help: "CPUs for the sending side's threads (cpu list such as 0-3,8); socket workers \
               inherit it",
        ..row(Knob::SendCpus)
    },
    KnobSpec {
        kind: KnobKind::Cpus,
        in_plan: false,
        flag: Some("recv-cpus"),
        doc: "CPUs the receiving side's threads run on",
        help: "CPUs for the receiving side's threads",
        ..row(Knob::RecvCpus)
    },
    KnobSpec {
        kind: KnobKind::Int {
            min: 1,
            max: u32::MAX as i64,
        },
        in_plan: false,
        flag: Some("sample-ms"),
        doc: "sample CPU/IRQ/NIC/TCP counters every this many ms during timed iterations",
        help: "Sample CPU/IRQ/NIC/TCP counters every MS milliseconds during timed iterations",
        value_name: Some("MS"),
        ..row(Knob::SampleMs)
    },
    KnobSpec {
        kind: KnobKind::Settings,
        in_plan: false,
        flag: Some("env"),
        doc: "backend settings KEY=VALUE (NCCL_* and plugin variables)",
        help: "Backend setting KEY=VALUE (NCCL_* and plugin variables), repeatable",
        value_name: Some("KEY=VALUE"),
        ..row(Knob::Env)
    },
];

/// How many entries of [`KNOBS`], from the first, a plan script may set (tested: exactly the
/// `in_plan` ones, which come first).
const PLAN_KNOB_COUNT: usize = 28;

/// The knobs a plan script may set, in table order.
pub const PLAN_KNOBS: &[KnobSpec] = KNOBS.split_at(PLAN_KNOB_COUNT).0;

/// The entries that have an environment variable, in table order.
pub fn with_env() -> impl Iterator<Item = &'static KnobSpec> {
    KNOBS.iter().filter(|s| s.env.is_some())
}

/// The entry whose environment variable is `env`.
pub fn by_env(env: &str) -> Option<&'static KnobSpec> {
    KNOBS.iter().find(|s| s.env == Some(env))
}

/// The knobs whose command-line flag takes its default from an environment variable.
pub fn flag_vars() -> impl Iterator<Item = &'static KnobSpec> {
    with_env().filter(|s| s.flag.is_some())
}

/// A flag's error (`--window ...`) when the value came from the flag's variable rather than the
/// command line: says so, naming the variable the user set.
pub fn error_from_env(
    e: String,
    var: impl Fn(&str) -> Option<String>,
    args: impl Iterator<Item = String>,
) -> String {
    let args: Vec<String> = args.collect();
    for spec in flag_vars() {
        let (Some(flag), Some(name)) = (spec.flag, spec.env) else {
            continue;
        };
        let long = format!("--{flag}");
        let starts = e.starts_with(&long) && e[long.len()..].starts_with([' ', ':']);
        let on_command_line = args.iter().any(|a| {
            std::iter::once(flag)
                .chain(spec.alias)
                .any(|f| a == &format!("--{f}") || a.starts_with(&format!("--{f}=")))
        });
        if starts && !on_command_line {
            if let Some(v) = var(name) {
                return format!(
                    "{name}={} (from the environment; it sets {long}): {}",
                    v.escape_debug(),
                    e[long.len()..].trim_start_matches([':', ' '])
                );
            }
        }
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_errors_name_the_variable_that_set_the_value() {
        let env = |k: &str| (k == "TCPX_WINDOW").then(|| "abc".to_string());
        let args = || ["tcpx-run", "bench"].map(String::from).into_iter();
        assert_eq!(
            error_from_env("--window `abc` is not a whole number".into(), env, args()),
            "TCPX_WINDOW=abc (from the environment; it sets --window): `abc` is not a whole number"
        );
        // Given on the command line: the flag's own error.
        let given = ["tcpx-run", "bench", "--window", "abc"]
            .map(String::from)
            .into_iter();
        assert_eq!(
            error_from_env("--window `abc` is not a whole number".into(), env, given),
            "--window `abc` is not a whole number"
        );
        // Another flag's error, or no variable set: unchanged.
        assert_eq!(
            error_from_env("--windows x".into(), env, args()),
            "--windows x"
        );
        assert_eq!(
            error_from_env("--chunk: bad".into(), env, args()),
            "--chunk: bad"
        );
    }

    #[test]
    fn every_knob_has_exactly_one_entry_in_enum_order() {
        let order: Vec<Knob> = KNOBS.iter().map(|s| s.knob).collect();
        assert_eq!(
            order,
            Knob::ALL,
            "the table lists every knob once, in enum order"
        );
        for k in Knob::ALL {
            assert_eq!(k.spec().knob, *k);
            assert_eq!(k.spec().name, k.name());
            assert_eq!(Knob::from_name(k.name()), Some(*k));
            assert_eq!(
                serde_json::to_string(k).unwrap(),
                format!("\"{}\"", k.name())
            );
        }
    }

    #[test]
    fn knobs_order_and_serialize_as_their_names() {
        let mut by_name: Vec<&str> = Knob::ALL.iter().map(|k| k.name()).collect();
        by_name.sort();
        let mut knobs = Knob::ALL.to_vec();
        knobs.sort();
        assert_eq!(knobs.iter().map(|k| k.name()).collect::<Vec<_>>(), by_name);
        // A map keyed by knob is the JSON of the same map keyed by name, key order included.
        let typed: std::collections::BTreeMap<Knob, usize> =
            Knob::ALL.iter().enumerate().map(|(i, k)| (*k, i)).collect();
        let named: std::collections::BTreeMap<&str, usize> = Knob::ALL
            .iter()
            .enumerate()
            .map(|(i, k)| (k.name(), i))
            .collect();
        let text = serde_json::to_string(&typed).unwrap();
        assert_eq!(text, serde_json::to_string(&named).unwrap());
        let back: std::collections::BTreeMap<Knob, usize> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, typed);
        let e = serde_json::from_str::<std::collections::BTreeMap<Knob, usize>>(
            r#"{"window": 1, "socket_threads": 2}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown variant `socket_threads`"), "{e}");
    }

    #[test]
    fn plan_knobs_are_the_first_entries() {
        assert!(PLAN_KNOBS.iter().all(|s| s.in_plan));
        assert!(KNOBS[PLAN_KNOBS.len()..].iter().all(|s| !s.in_plan));
    }

    #[test]
    fn flags_env_variables_and_columns_are_unique() {
        for (what, get) in [
            (
                "flag",
                (|s: &KnobSpec| s.flag) as fn(&KnobSpec) -> Option<&'static str>,
            ),
            ("env", |s| s.env),
            ("csv", |s| s.csv),
        ] {
            let mut seen: Vec<&str> = KNOBS.iter().filter_map(get).collect();
            let n = seen.len();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), n, "two knobs share a {what}");
        }
        for s in KNOBS {
            if let Some(e) = s.env {
                assert!(e.starts_with("TCPX_"), "{e}");
                assert_eq!(by_env(e).map(|b| b.knob), Some(s.knob));
            }
            assert!(!s.doc.is_empty(), "{} has no doc", s.name);
        }
    }
}
