//! The settings NCCL and the net plugins it loads read from their own environment, declared
//! once: what `tcpx-run tune` varies for the `nccl` backend and what tuned.env exports for it,
//! untranslated.
//!
//! Each row names the variable, the network transport that reads it ([`Reader`]), its type and
//! the limits the reader enforces, the reader's own default, where that was read (source file and
//! version), and the levels a default tune space tries. [`effective`] applies the readers' own
//! clamps (NCCL's sockets x threads cap, the plugin's, the network chunk against the buffer), so
//! a tuned file can be checked against what NCCL will really run, and two points that NCCL runs
//! identically are measured once.
//!
//! Read from NCCL 2.28.9 (`src/init.cc`, `src/graph/paths.cc`, `src/graph/connect.cc`,
//! `src/transport/net_socket.cc`, `src/misc/param.cc`) and from google/nccl-plugin-gpudirecttcpx
//! (`src/net_tcpx.cc`, `src/connect.cc`, `src/flags.cc`, `src/macro.h`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which network transport under NCCL carries the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// NCCL's own NET/Socket (no net plugin loaded).
    Socket,
    /// Google's GPUDirect-TCPX net plugin (`libnccl-net.so`, API v7).
    Tcpx,
}

impl Network {
    pub const ALL: [Network; 2] = [Network::Socket, Network::Tcpx];

    pub fn as_str(self) -> &'static str {
        match self {
            Network::Socket => "socket",
            Network::Tcpx => "tcpx",
        }
    }

    /// The name NCCL matches `NCCL_NET` against (case-insensitively, `src/plugin/net.cc`): the
    /// transport's `ncclNet_t::name`.
    pub fn nccl_net_name(self) -> &'static str {
        match self {
            Network::Socket => "Socket",
            Network::Tcpx => "GPUDirectTCPX_v7",
        }
    }

    /// Most sockets one connection may have (threads x sockets per thread); beyond it the reader
    /// lowers sockets per thread to `max / threads`.
    pub fn max_sockets(self) -> u64 {
        match self {
            // net_socket.cc: MAX_SOCKETS 64.
            Network::Socket => 64,
            // macro.h: MAX_SOCKETS 8 ("we really need no more than 8").
            Network::Tcpx => 8,
        }
    }

    /// Most helper threads per connection (both readers: MAX_THREADS 16).
    pub fn max_threads(self) -> u64 {
        16
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Network {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Network::ALL
            .into_iter()
            .find(|n| n.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown network `{s}`: socket (NCCL's NET/Socket) or tcpx (GPUDirect-TCPX)"
                )
            })
    }
}

/// Who reads a setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Reader {
    /// NCCL itself, whatever the network.
    Nccl,
    /// Only this network transport.
    Only(Network),
}

impl Reader {
    pub fn reads_for(self, n: Network) -> bool {
        match self {
            Reader::Nccl => true,
            Reader::Only(m) => m == n,
        }
    }
}

/// What values a setting takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum SettingKind {
    /// A whole number in `min..=max`.
    Int { min: i64, max: i64 },
    /// A byte count in `min..=max`.
    Bytes { min: u64, max: u64 },
}

/// One row of [`SETTINGS`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SettingSpec {
    /// The environment variable.
    pub var: &'static str,
    pub reader: Reader,
    pub kind: SettingKind,
    /// The reader's own default, in words (several are decided at run time).
    pub default: &'static str,
    /// The value a tune space starts from when the default is decided at run time: what the
    /// reader picks on a machine that is not a GCP or AWS VM (loopback, the GPU machine).
    pub base: u64,
    /// Levels a default tune space tries, cheapest first; empty: not varied by default.
    pub levels: &'static [u64],
    /// What it does and why it matters to point-to-point speed.
    pub doc: &'static str,
    /// Where the default and the limits come from.
    pub source: &'static str,
}

const K: u64 = 1 << 10;
const M: u64 = 1 << 20;

/// Every setting, NCCL's first.
pub const SETTINGS: &[SettingSpec] = &[
    SettingSpec {
        var: "NCCL_NCHANNELS_PER_NET_PEER",
        reader: Reader::Nccl,
        kind: SettingKind::Int { min: 1, max: 64 },
        default: "unset: 2 channels per remote peer (fewer at scale, more to drive several NICs)",
        base: 2,
        levels: &[1, 2, 4, 8, 16],
        doc: "channels NCCL uses for point-to-point to one remote peer: each channel is one \
              network connection with its own sockets and proxy steps",
        source: "NCCL 2.28.9 src/graph/paths.cc ncclTopoGetNchannels (remote peer: 2 by default); \
                 src/init.cc: 0 or less is ignored; MAXCHANNELS 64",
    },
    SettingSpec {
        var: "NCCL_P2P_NET_CHUNKSIZE",
        reader: Reader::Nccl,
        kind: SettingKind::Bytes {
            min: 4 * K,
            max: 64 * M,
        },
        default: "131072 (128 KiB)",
        base: 128 * K,
        levels: &[128 * K, 256 * K, 512 * K, M, 2 * M, 4 * M],
        doc: "bytes per network step of point-to-point between nodes; NCCL lowers it to \
              NCCL_BUFFSIZE / 8 (NCCL_STEPS) when the buffer cannot hold 8 steps",
        source: "NCCL 2.28.9 src/init.cc NCCL_PARAM(P2pNetChunkSize, 1 << 17) and \
                 computeBuffSizes (p2pChunkSize * NCCL_STEPS <= buffSizes[SIMPLE])",
    },
    SettingSpec {
        var: "NCCL_BUFFSIZE",
        reader: Reader::Nccl,
        kind: SettingKind::Bytes {
            min: 64 * K,
            max: 1 << 30,
        },
        default: "4194304 (4 MiB)",
        base: 4 * M,
        levels: &[4 * M, 8 * M, 16 * M, 32 * M],
        doc: "bytes of the SIMPLE protocol's buffer per channel and peer: 8 steps of it are in \
              flight, so it caps the network chunk at a eighth of it",
        source: "NCCL 2.28.9 src/init.cc DEFAULT_BUFFSIZE (1 << 22)",
    },
    SettingSpec {
        var: "NCCL_MIN_NCHANNELS",
        reader: Reader::Nccl,
        kind: SettingKind::Int { min: 1, max: 64 },
        default: "unset: from the topology search",
        base: 0,
        levels: &[],
        doc: "least channels of collectives; point-to-point between nodes follows \
              NCCL_NCHANNELS_PER_NET_PEER instead (not varied by default: it is not what moves \
              send/recv)",
        source: "NCCL 2.28.9 src/graph/connect.cc NCCL_PARAM(MinNchannels, -2); MAXCHANNELS 64",
    },
    SettingSpec {
        var: "NCCL_MAX_NCHANNELS",
        reader: Reader::Nccl,
        kind: SettingKind::Int { min: 1, max: 64 },
        default: "unset: from the topology search",
        base: 0,
        levels: &[],
        doc: "most channels of collectives (see NCCL_MIN_NCHANNELS)",
        source: "NCCL 2.28.9 src/graph/connect.cc NCCL_PARAM(MaxNchannels, -2); MAXCHANNELS 64",
    },
    SettingSpec {
        var: "NCCL_NSOCKS_PERTHREAD",
        reader: Reader::Only(Network::Socket),
        kind: SettingKind::Int { min: 1, max: 64 },
        default: "unset: 1 (8 on AWS VMs, 1 on GCP VMs)",
        base: 1,
        levels: &[1, 2, 4, 8, 16],
        doc: "sockets each NET/Socket helper thread drives, per connection",
        source: "NCCL 2.28.9 src/transport/net_socket.cc ncclNetSocketGetNsockNthread: \
                 threads x sockets capped at MAX_SOCKETS 64 by lowering sockets per thread",
    },
    SettingSpec {
        var: "NCCL_SOCKET_NTHREADS",
        reader: Reader::Only(Network::Socket),
        kind: SettingKind::Int { min: 0, max: 16 },
        default: "unset: 0 helper threads, the proxy thread sends itself (2 on AWS, 4 on GCP)",
        base: 0,
        levels: &[1, 2, 4, 8, 16],
        doc: "NET/Socket helper threads per connection (above 16 NCCL uses 16)",
        source: "NCCL 2.28.9 src/transport/net_socket.cc: MAX_THREADS 16; auto 0 off AWS/GCP",
    },
    SettingSpec {
        var: "NCCL_NSOCKS_PERTHREAD",
        reader: Reader::Only(Network::Tcpx),
        kind: SettingKind::Int { min: 1, max: 8 },
        default: "unset: 1",
        base: 1,
        levels: &[1, 2, 4, 8],
        doc: "sockets per GPUDirect-TCPX thread and connection; threads x sockets above 8 makes \
              the plugin lower it to 8 / threads, which is 0 sockets beyond 8 threads",
        source: "nccl-plugin-gpudirecttcpx src/net_tcpx.cc (accepted 1..=MAX_SOCKETS), \
                 src/connect.cc tcpxGetNsockNthread, src/macro.h MAX_SOCKETS 8",
    },
    SettingSpec {
        var: "NCCL_SOCKET_NTHREADS",
        reader: Reader::Only(Network::Tcpx),
        kind: SettingKind::Int { min: 1, max: 16 },
        default: "unset: 1 (6 on GCP VMs)",
        base: 1,
        levels: &[1, 2, 4, 8],
        doc: "GPUDirect-TCPX threads per connection",
        source: "nccl-plugin-gpudirecttcpx src/net_tcpx.cc (accepted 1..=MAX_THREADS 16), \
                 src/flags.cc kNThreads = 1",
    },
    SettingSpec {
        var: "NCCL_DYNAMIC_CHUNK_SIZE",
        reader: Reader::Only(Network::Tcpx),
        kind: SettingKind::Bytes {
            min: 4 * K,
            max: (i32::MAX as u64),
        },
        default:
            "131072 in the plugin's flags (0 from its parameter stalls; tcpx-lab supplies 524288)",
        base: 512 * K,
        levels: &[128 * K, 256 * K, 512 * K, M, 2 * M],
        doc: "bytes the plugin splits each send into across its sockets",
        source: "nccl-plugin-gpudirecttcpx src/flags.cc kDynamicChunkSize = 128 KiB, \
                 src/net_tcpx.cc DYNAMIC_CHUNK_SIZE",
    },
    SettingSpec {
        var: "NCCL_MIN_ZCOPY_SIZE",
        reader: Reader::Only(Network::Tcpx),
        kind: SettingKind::Bytes {
            min: 0,
            max: (i32::MAX as u64),
        },
        default: "0",
        base: 0,
        levels: &[],
        doc: "smallest send the plugin sends with MSG_ZEROCOPY (not varied by default: over \
              loopback zero-copy sends are copied anyway)",
        source: "nccl-plugin-gpudirecttcpx src/net_tcpx.cc MIN_ZCOPY_SIZE",
    },
];

/// The settings `network` (and NCCL above it) reads, in table order.
pub fn for_network(network: Network) -> impl Iterator<Item = &'static SettingSpec> {
    SETTINGS.iter().filter(move |s| s.reader.reads_for(network))
}

/// The row of `var` that `network`'s NCCL reads.
pub fn spec(network: Network, var: &str) -> Option<&'static SettingSpec> {
    for_network(network).find(|s| s.var == var)
}

impl SettingSpec {
    /// `text` as this setting's value: a whole number (byte counts may be written `4M`), in
    /// range. The error names the variable and the range.
    pub fn parse(&self, text: &str) -> Result<u64, String> {
        let t = text.trim();
        let v: i128 = match self.kind {
            SettingKind::Int { .. } => t
                .parse::<i128>()
                .map_err(|_| format!("{}=`{text}`: a whole number is expected", self.var))?,
            SettingKind::Bytes { .. } => crate::parse_size(t)
                .map(|v| v as i128)
                .map_err(|e| format!("{}=`{text}`: {e}", self.var))?,
        };
        let (lo, hi) = self.range();
        if v < lo as i128 || v > hi as i128 {
            return Err(format!(
                "{}={text} is outside what {} accepts ({}..={})",
                self.var,
                self.reader_name(),
                self.text(lo),
                self.text(hi)
            ));
        }
        Ok(v as u64)
    }

    /// The inclusive range.
    pub fn range(&self) -> (u64, u64) {
        match self.kind {
            SettingKind::Int { min, max } => (min.max(0) as u64, max.max(0) as u64),
            SettingKind::Bytes { min, max } => (min, max),
        }
    }

    /// A value as a tuned file writes it: plain digits (NCCL parses numbers only).
    pub fn text(&self, v: u64) -> String {
        v.to_string()
    }

    /// A value as a person reads it: `2M` for byte counts.
    pub fn display(&self, v: u64) -> String {
        match self.kind {
            SettingKind::Int { .. } => v.to_string(),
            SettingKind::Bytes { .. } => crate::format_size(v),
        }
    }

    fn reader_name(&self) -> &'static str {
        match self.reader {
            Reader::Nccl => "NCCL",
            Reader::Only(Network::Socket) => "NCCL's NET/Socket",
            Reader::Only(Network::Tcpx) => "the GPUDirect-TCPX plugin",
        }
    }
}

/// What NCCL (and the network under it) will really run for a set of settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Effective {
    /// Every setting of the network, after the readers' clamps; unset ones at their base.
    pub values: BTreeMap<&'static str, u64>,
    /// One line per value a reader changes, naming the variable, what was asked and what runs.
    pub clamps: Vec<String>,
    /// A configuration the reader cannot run (no sockets at all), with the reason.
    pub unrunnable: Option<String>,
}

/// The settings `vars` give `network`, after the clamps its readers apply (unknown variables
/// and values out of range are errors, naming the variable).
pub fn effective(network: Network, vars: &BTreeMap<String, String>) -> Result<Effective, String> {
    let mut values: BTreeMap<&'static str, u64> = BTreeMap::new();
    for s in for_network(network) {
        values.insert(s.var, s.base);
    }
    for (k, v) in vars {
        if let Some(s) = spec(network, k) {
            values.insert(s.var, s.parse(v)?);
        }
    }
    let mut clamps = Vec::new();
    let mut unrunnable = None;
    let threads_var = "NCCL_SOCKET_NTHREADS";
    let socks_var = "NCCL_NSOCKS_PERTHREAD";
    let threads = values[threads_var].min(network.max_threads());
    let per_thread = values[socks_var];
    let max = network.max_sockets();
    // NCCL's NET/Socket with 0 helper threads sends from its proxy thread on one socket per
    // thread slot; the cap applies to threads x sockets only when there are threads.
    if threads > 0 && threads * per_thread > max {
        let lowered = max / threads;
        clamps.push(format!(
            "{socks_var}={per_thread} with {threads_var}={threads}: {} sockets is above {}'s \
             {max}, so it runs {socks_var}={lowered}",
            threads * per_thread,
            network.nccl_net_name()
        ));
        values.insert(socks_var, lowered);
        if lowered == 0 {
            unrunnable = Some(format!(
                "{threads_var}={threads} leaves no socket per thread ({max} / {threads} = 0): \
                 the connection has no sockets"
            ));
        }
    }
    if network == Network::Socket && threads == 0 && per_thread != 0 {
        // net_socket.cc: sockets = sockets per thread x threads; with no helper thread the
        // proxy thread sends on the control connection, so sockets per thread change nothing.
        if vars.contains_key(socks_var) {
            clamps.push(format!(
                "{socks_var}={per_thread} has no effect with {threads_var}=0 (NCCL's proxy \
                 thread sends on one connection)"
            ));
        }
        values.insert(socks_var, 0);
    }
    let chunk = values["NCCL_P2P_NET_CHUNKSIZE"];
    let buff = values["NCCL_BUFFSIZE"];
    if chunk * 8 > buff {
        let lowered = buff / 8;
        clamps.push(format!(
            "NCCL_P2P_NET_CHUNKSIZE={chunk} is more than NCCL_BUFFSIZE/8 ({buff}/8), so NCCL \
             runs {lowered}"
        ));
        values.insert("NCCL_P2P_NET_CHUNKSIZE", lowered);
    }
    Ok(Effective {
        values,
        clamps,
        unrunnable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_row_is_well_formed_and_each_variable_is_read_once_per_network() {
        for n in Network::ALL {
            let rows: Vec<_> = for_network(n).collect();
            for (i, r) in rows.iter().enumerate() {
                assert!(r.var.starts_with("NCCL_"), "{}", r.var);
                assert!(
                    !rows[..i].iter().any(|o| o.var == r.var),
                    "{} twice for {n}",
                    r.var
                );
                let (lo, hi) = r.range();
                assert!(lo <= hi);
                for &l in r.levels {
                    assert!(l >= lo && l <= hi, "{}: level {l} out of range", r.var);
                }
                assert!(
                    r.levels.windows(2).all(|w| w[0] < w[1]),
                    "{}: levels ascend",
                    r.var
                );
                assert!(!r.doc.is_empty() && !r.source.is_empty());
            }
        }
    }

    #[test]
    fn nccl_caps_sockets_at_64_and_the_plugin_at_8_as_their_sources_do() {
        let e = effective(
            Network::Socket,
            &vars(&[
                ("NCCL_SOCKET_NTHREADS", "16"),
                ("NCCL_NSOCKS_PERTHREAD", "16"),
            ]),
        )
        .unwrap();
        assert_eq!(e.values["NCCL_NSOCKS_PERTHREAD"], 4);
        assert_eq!(e.clamps.len(), 1);
        assert!(e.unrunnable.is_none());
        let e = effective(
            Network::Tcpx,
            &vars(&[
                ("NCCL_SOCKET_NTHREADS", "16"),
                ("NCCL_NSOCKS_PERTHREAD", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(e.values["NCCL_NSOCKS_PERTHREAD"], 0);
        assert!(e.unrunnable.unwrap().contains("no socket"));
        let e = effective(
            Network::Tcpx,
            &vars(&[
                ("NCCL_SOCKET_NTHREADS", "2"),
                ("NCCL_NSOCKS_PERTHREAD", "4"),
            ]),
        )
        .unwrap();
        assert!(e.clamps.is_empty());
        // Without helper threads NET/Socket's sockets per thread change nothing.
        let a = effective(Network::Socket, &vars(&[("NCCL_NSOCKS_PERTHREAD", "8")])).unwrap();
        let b = effective(Network::Socket, &vars(&[])).unwrap();
        assert_eq!(a.values, b.values);
        assert_eq!(a.clamps.len(), 1);
    }

    #[test]
    fn the_network_chunk_is_lowered_to_an_eighth_of_the_buffer() {
        let e = effective(
            Network::Socket,
            &vars(&[
                ("NCCL_P2P_NET_CHUNKSIZE", "2M"),
                ("NCCL_BUFFSIZE", "4194304"),
            ]),
        )
        .unwrap();
        assert_eq!(e.values["NCCL_P2P_NET_CHUNKSIZE"], 512 * K);
        assert!(e.clamps[0].contains("NCCL_BUFFSIZE/8"), "{:?}", e.clamps);
        let e = effective(
            Network::Socket,
            &vars(&[("NCCL_P2P_NET_CHUNKSIZE", "2M"), ("NCCL_BUFFSIZE", "16M")]),
        )
        .unwrap();
        assert!(e.clamps.is_empty());
    }

    #[test]
    fn values_outside_what_the_reader_accepts_are_refused_by_name() {
        let err = effective(Network::Tcpx, &vars(&[("NCCL_NSOCKS_PERTHREAD", "16")])).unwrap_err();
        assert!(
            err.contains("NCCL_NSOCKS_PERTHREAD") && err.contains("GPUDirect-TCPX"),
            "{err}"
        );
        assert!(effective(Network::Socket, &vars(&[("NCCL_NSOCKS_PERTHREAD", "16")])).is_ok());
        assert!(effective(Network::Socket, &vars(&[("NCCL_BUFFSIZE", "lots")])).is_err());
        assert!(effective(
            Network::Socket,
            &vars(&[("NCCL_NCHANNELS_PER_NET_PEER", "0")])
        )
        .is_err());
    }

    #[test]
    fn net_names_are_what_the_transports_call_themselves() {
        assert_eq!(Network::Socket.nccl_net_name(), "Socket");
        assert_eq!(Network::Tcpx.nccl_net_name(), "GPUDirectTCPX_v7");
        assert_eq!("tcpx".parse::<Network>(), Ok(Network::Tcpx));
        assert!("ib".parse::<Network>().is_err());
    }
}
