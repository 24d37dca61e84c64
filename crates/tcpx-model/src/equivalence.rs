//! What a knob becomes for the other programs that read a tuned configuration: NCCL (and
//! Google's GPUDirect-TCPX plugin, which reads NCCL's variable names) and the UCCL seed
//! benchmark, declared once as typed rows.
//!
//! Each row of [`EQUIVALENCES`] says, for one knob and one [`Reader`], which variables it sets
//! and how the knob's value becomes theirs ([`How`]), or why nothing expresses it. tuned.env
//! iterates the rows in order (tcpx-report's `tuned::map_knobs`), and `tcpx-run bench`'s own
//! variables are the knob table's `env` column ([`crate::knob::with_env`]). A knob NCCL cannot
//! express gets a [`How::Nothing`] row with the reason, so it is listed, never invented.
//!
//! Sources: NCCL 2.28 (`src/graph/paths.cc` for channels per peer, `src/transport/net_socket.cc`
//! for threads and sockets, `src/include/device.h` for `NCCL_STEPS`) and
//! google/nccl-plugin-gpudirecttcpx (`src/flags.cc`).

use serde::{Deserialize, Serialize};

use crate::Knob;

/// Who reads a variable of a tuned file (also its section of tuned.env, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reader {
    /// NCCL itself or the GPUDirect-TCPX net plugin (which reads NCCL's variable names).
    Nccl,
    /// The seed benchmark (`UCCL_TCPX_*`).
    Seed,
    /// `tcpx-run bench`'s own fallbacks (`TCPX_*`), to reproduce the configuration here.
    TcpxRun,
}

impl Reader {
    /// The heading of this reader's section in tuned.env.
    pub fn heading(self) -> &'static str {
        match self {
            Reader::Nccl => "NCCL and the GPUDirect-TCPX plugin",
            Reader::Seed => "the seed benchmark (UCCL_TCPX_*), for jobs still on it",
            Reader::TcpxRun => "tcpx-run bench (TCPX_*): reproduces the chosen configuration",
        }
    }
}

/// NCCL keeps at most this many requests (steps) in flight per channel and peer.
pub const NCCL_STEPS: u64 = 8;
/// NCCL's socket transport accepts at most this many threads per connection.
pub const NCCL_MAX_SOCKET_THREADS: u64 = 16;
/// ... and at most this many sockets (threads x sockets per thread) per connection.
pub const NCCL_MAX_SOCKETS: u64 = 64;

/// `socks` sockets per connection as NCCL's (threads, sockets per thread): one socket per thread
/// as the socket backend runs them, as many threads as NCCL allows; `None` beyond
/// [`NCCL_MAX_SOCKETS`].
pub fn nccl_socket_split(socks: u64) -> Option<(u64, u64)> {
    if socks == 0 || socks > NCCL_MAX_SOCKETS {
        return None;
    }
    let threads = (1..=NCCL_MAX_SOCKET_THREADS.min(socks))
        .rev()
        .find(|t| socks % t == 0)?;
    Some((threads, socks / threads))
}

/// When a knob's value has no equivalent worth naming ([`How::Nothing`]): only a value other
/// than the default needs saying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unless {
    /// Unless the knob's text is this word (its default).
    Word(&'static str),
    /// Unless the knob's number is at most 1.
    AtMostOne,
    /// Unless the configuration uses at most one NIC (the `nics` knob).
    OneNic,
}

/// How a knob's value becomes the row's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The net plugin the run recorded loading, for a backend NCCL runs through a plugin; a
    /// backend for which NCCL has only something close is listed with the backend's reason.
    RecordedPlugin {
        /// Said when the run recorded no plugin.
        unrecorded: &'static str,
    },
    /// The knob's number as it is, for backends that load a net plugin under NCCL when
    /// `plugin_only` (the plugin reads it); unset, `auto` is written when given (value, why).
    Number {
        plugin_only: bool,
        auto: Option<(u64, &'static str)>,
    },
    /// The backend's own settings (the `env` knob): those NCCL or a plugin reads
    /// ([`crate::setting::SETTINGS`] and `NCCL_NET`), untranslated.
    BackendSettings,
    /// Sockets per connection as NCCL's threads x sockets per thread ([`nccl_socket_split`]).
    SocketSplit { too_many: &'static str },
    /// The chunk the configuration ran with (`auto` resolved). Through a backend whose own
    /// calls NCCL cuts (`nccl_calls`: the reason), NCCL has no variable for it.
    Chunk { nccl_calls: Option<&'static str> },
    /// Window x chunk in bytes, the window at most [`NCCL_STEPS`] (`too_deep` otherwise); none
    /// through a backend whose own calls NCCL cuts.
    WindowTimesChunk { too_deep: &'static str },
    /// The run's recorded TX and RX bindings for the binding word `word`; `none` is nothing
    /// to say; other words and unrecorded bindings are listed with their reasons.
    RecordedBindings {
        word: &'static str,
        unrecorded: &'static str,
        other: &'static str,
    },
    /// No variable expresses it: listed with `why`, unless the value is the plain default.
    Nothing { unless: Unless, why: &'static str },
}

/// One knob's equivalent for one reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Equivalence {
    pub knob: Knob,
    pub reader: Reader,
    /// The variables it sets, in the order tuned.env writes them (empty for [`How::Nothing`]).
    pub vars: &'static [&'static str],
    pub how: How,
}

const fn rule(knob: Knob, reader: Reader, vars: &'static [&'static str], how: How) -> Equivalence {
    Equivalence {
        knob,
        reader,
        vars,
        how,
    }
}

/// Every knob's equivalents, in the order tuned.env writes them (within a reader) and lists
/// what has none.
pub const EQUIVALENCES: &[Equivalence] = &[
    rule(
        Knob::Transport,
        Reader::Nccl,
        &["NCCL_NET_PLUGIN"],
        How::RecordedPlugin {
            unrecorded: "the run did not record which plugin it loaded: set NCCL_NET_PLUGIN to it",
        },
    ),
    // GPUDirect-TCPX splits every send by it; unset, the plugin's 0 stalls (issue 29).
    rule(
        Knob::PluginChunk,
        Reader::Nccl,
        &["NCCL_DYNAMIC_CHUNK_SIZE"],
        How::Number {
            plugin_only: true,
            auto: Some((524_288, "Google's A3 value")),
        },
    ),
    // Google's plugin sends zero-copy above its NCCL_MIN_ZCOPY_SIZE (0, its default, is off).
    rule(
        Knob::ZeroCopyMin,
        Reader::Nccl,
        &["NCCL_MIN_ZCOPY_SIZE"],
        How::Number {
            plugin_only: true,
            auto: None,
        },
    ),
    rule(Knob::Env, Reader::Nccl, &[], How::BackendSettings),
    // A tcpx-lab channel is one comm with its own sockets; NCCL's point-to-point over the
    // network opens NCCL_NCHANNELS_PER_NET_PEER such connections per peer (NCCL 2.28
    // src/graph/paths.cc). NCCL_MIN/MAX_NCHANNELS set collectives' channels instead, and moved
    // send/recv by 1.03x where this moved it 1.6x (docs/PERFORMANCE.md, one H200).
    rule(
        Knob::Channels,
        Reader::Nccl,
        &["NCCL_NCHANNELS_PER_NET_PEER"],
        How::Number {
            plugin_only: false,
            auto: None,
        },
    ),
    rule(
        Knob::Channels,
        Reader::Seed,
        &["UCCL_TCPX_NUM_CHANNELS"],
        How::Number {
            plugin_only: false,
            auto: None,
        },
    ),
    rule(
        Knob::SocksPerChannel,
        Reader::Nccl,
        &["NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"],
        How::SocketSplit {
            too_many: "NCCL allows at most 64 sockets per connection",
        },
    ),
    rule(
        Knob::Chunk,
        Reader::Nccl,
        &["NCCL_P2P_NET_CHUNKSIZE"],
        How::Chunk {
            nccl_calls: Some(
                "through the nccl backend a chunk is one ncclSend/ncclRecv call; NCCL cuts it by its own NCCL_P2P_NET_CHUNKSIZE (set it in the experiment's env to tune it)",
            ),
        },
    ),
    rule(
        Knob::Chunk,
        Reader::Seed,
        &["UCCL_TCPX_CHUNK_BYTES"],
        How::Chunk { nccl_calls: None },
    ),
    rule(
        Knob::Window,
        Reader::Nccl,
        &["NCCL_BUFFSIZE"],
        How::WindowTimesChunk {
            too_deep: "NCCL keeps at most NCCL_STEPS = 8 requests in flight per channel, so a window above 8 has no NCCL_BUFFSIZE equivalent (8 x chunk is its most)",
        },
    ),
    rule(
        Knob::Window,
        Reader::Seed,
        &["UCCL_TCPX_WINDOW_SIZE"],
        How::Number {
            plugin_only: false,
            auto: None,
        },
    ),
    rule(
        Knob::ThreadBinding,
        Reader::Nccl,
        &[
            "NCCL_GPUDIRECTTCPX_TX_BINDINGS",
            "NCCL_GPUDIRECTTCPX_RX_BINDINGS",
        ],
        How::RecordedBindings {
            word: "nccl",
            unrecorded: "no TX/RX bindings derive on this machine (no GPU/NIC pairs): derive them on the target with `tcpx-run topo`",
            other: "NCCL has no variable for pinning its threads to a NUMA node: launch the job under numactl/taskset",
        },
    ),
    rule(
        Knob::Nics,
        Reader::Nccl,
        &[],
        How::Nothing {
            unless: Unless::OneNic,
            why: "NCCL takes interface names (NCCL_SOCKET_IFNAME / NCCL_GPUDIRECTTCPX_SOCKET_IFNAME), not a count: name that many NICs of the target machine",
        },
    ),
    rule(
        Knob::NicPolicy,
        Reader::Nccl,
        &[],
        How::Nothing {
            unless: Unless::OneNic,
            why: "NCCL assigns NICs to GPUs by PCI distance itself; no variable chooses the policy",
        },
    ),
    rule(
        Knob::SockBuf,
        Reader::Nccl,
        &[],
        How::Nothing {
            unless: Unless::Word("auto"),
            why: "NCCL leaves SO_SNDBUF/SO_RCVBUF to the kernel: raise net.ipv4.tcp_wmem/tcp_rmem instead",
        },
    ),
    rule(
        Knob::ProcessMode,
        Reader::Nccl,
        &[],
        How::Nothing {
            unless: Unless::Word("single-process"),
            why: "the launcher (torchrun, srun) decides processes per GPU, not NCCL",
        },
    ),
    rule(
        Knob::Flows,
        Reader::Nccl,
        &[],
        How::Nothing {
            unless: Unless::AtMostOne,
            why: "one flow is one GPU: the job's GPU count, not a setting",
        },
    ),
];

/// The rows of `knob`, in table order.
pub fn of(knob: Knob) -> impl Iterator<Item = &'static Equivalence> {
    EQUIVALENCES.iter().filter(move |e| e.knob == knob)
}

/// The one variable `knob` becomes for `reader`, when a single one does.
pub fn var(knob: Knob, reader: Reader) -> Option<&'static str> {
    of(knob)
        .find(|e| e.reader == reader)
        .and_then(|e| match e.vars {
            [one] => Some(*one),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_well_formed() {
        for e in EQUIVALENCES {
            // The tool's own variables come from the knob table, not from here.
            assert_ne!(e.reader, Reader::TcpxRun, "{:?}", e.knob);
            let nothing = matches!(e.how, How::Nothing { .. } | How::BackendSettings);
            assert_eq!(
                e.vars.is_empty(),
                nothing,
                "{:?}: vars {:?}",
                e.knob,
                e.vars
            );
            let prefix = match e.reader {
                Reader::Nccl => "NCCL_",
                Reader::Seed => "UCCL_TCPX_",
                Reader::TcpxRun => "TCPX_",
            };
            for v in e.vars {
                assert!(v.starts_with(prefix), "{v} is read by {:?}", e.reader);
            }
            // One row per knob and reader, so a knob's variables are found in one place.
            assert_eq!(
                of(e.knob).filter(|o| o.reader == e.reader).count(),
                1,
                "{:?} for {:?}",
                e.knob,
                e.reader
            );
        }
        // Readers in file order within each knob's rows: NCCL's before the seed's.
        for k in Knob::ALL {
            let readers: Vec<Reader> = of(*k).map(|e| e.reader).collect();
            let mut sorted = readers.clone();
            sorted.sort();
            assert_eq!(readers, sorted, "{k:?}");
        }
    }

    #[test]
    fn single_variables_are_found_by_knob_and_reader() {
        assert_eq!(
            var(Knob::ZeroCopyMin, Reader::Nccl),
            Some("NCCL_MIN_ZCOPY_SIZE")
        );
        assert_eq!(
            var(Knob::Channels, Reader::Seed),
            Some("UCCL_TCPX_NUM_CHANNELS")
        );
        assert_eq!(var(Knob::SocksPerChannel, Reader::Nccl), None);
        assert_eq!(var(Knob::Iters, Reader::Nccl), None);
    }

    #[test]
    fn sockets_split_into_nccls_threads_and_sockets_per_thread() {
        assert_eq!(nccl_socket_split(1), Some((1, 1)));
        assert_eq!(nccl_socket_split(4), Some((4, 1)));
        assert_eq!(nccl_socket_split(32), Some((16, 2)));
        assert_eq!(nccl_socket_split(17), Some((1, 17)));
        assert_eq!(nccl_socket_split(64), Some((16, 4)));
        assert_eq!(nccl_socket_split(65), None);
        assert_eq!(nccl_socket_split(0), None);
    }
}
