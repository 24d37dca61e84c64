//! Errors of the plugin layer; each says which call failed where, and what to check next.

use std::fmt;
use std::time::Duration;

use crate::abi::{self, NcclResult};

/// Where a plugin call happened: the function, and the comm and channel when there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSite {
    /// Plugin function name as NCCL spells it (`isend`, `regMr`, ...).
    pub call: &'static str,
    /// Comm number given by this process (1, 2, ... per plugin), if the call is on a comm.
    pub comm: Option<u64>,
    /// Channel the caller tagged the comm with, if any.
    pub channel: Option<u32>,
}

impl fmt::Display for CallSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.call)?;
        if let Some(comm) = self.comm {
            write!(f, " on comm {comm}")?;
        }
        if let Some(channel) = self.channel {
            write!(f, ", channel {channel}")?;
        }
        Ok(())
    }
}

/// What to look at next for a plugin result code.
fn hint(code: NcclResult) -> &'static str {
    match code {
        abi::NCCL_SYSTEM_ERROR => {
            "a system call failed inside the plugin: see its warnings (tracing target `ncclnet`), \
             then the NIC, socket limits and the plugin's environment variables"
        }
        abi::NCCL_INTERNAL_ERROR => {
            "see the plugin's warnings logged just before (tracing target `ncclnet`); with \
             GPUDirect-TCPX also check that rxdm runs and its Unix sockets exist"
        }
        abi::NCCL_INVALID_ARGUMENT | abi::NCCL_INVALID_USAGE => {
            "the plugin refused the arguments: see its warnings (tracing target `ncclnet`)"
        }
        abi::NCCL_REMOTE_ERROR => "the peer failed or closed: look at the other side's log",
        abi::NCCL_UNHANDLED_CUDA_ERROR => {
            "CUDA failed inside the plugin: check the GPU is visible and its context is current"
        }
        _ => "see the plugin's log lines (tracing target `ncclnet`)",
    }
}

/// Everything that can go wrong while loading or driving a net plugin.
#[derive(Debug, thiserror::Error)]
pub enum FfiError {
    /// No candidate library could be opened.
    #[error("cannot open net plugin `{spec}`: {reasons}. Check the path, NCCL_NET_PLUGIN and LD_LIBRARY_PATH")]
    Open { spec: String, reasons: String },
    /// The library opened but exports no table this crate knows.
    #[error("`{library}` is not an NCCL net plugin: it exports none of ncclNetPlugin_v9, ncclNetPlugin_v8, ncclNetPlugin_v7. Check that it is a net plugin (not a collnet or tuner plugin) built for NCCL 2.19 or later")]
    NoKnownSymbol { library: String },
    /// The table has a NULL where this path needs a function.
    #[error("plugin `{plugin}` has no {function} function (NULL in {symbol}), which {needed_for} needs. Use a plugin build that implements it, or avoid that path")]
    MissingFunction {
        plugin: String,
        symbol: &'static str,
        function: &'static str,
        needed_for: &'static str,
    },
    /// The plugin answered a non-zero result.
    #[error("{} ({code}) from {site} (plugin `{plugin}`). Check: {}", abi::result_name(*.code), hint(*.code))]
    Plugin {
        code: NcclResult,
        site: CallSite,
        plugin: String,
    },
    /// Something did not finish before its deadline.
    #[error("{what} at {site} did not complete within {waited:?}. Check: {check}")]
    Timeout {
        what: String,
        site: CallSite,
        waited: Duration,
        check: &'static str,
    },
    /// The caller broke a rule of the plugin API (caught before calling the plugin).
    #[error("invalid use at {site}: {what}")]
    Usage { site: CallSite, what: String },
    /// The plugin broke the ABI contract (bad descriptor, size out of range, ...).
    #[error("plugin `{plugin}` misbehaved at {site}: {what}")]
    Contract {
        plugin: String,
        site: CallSite,
        what: String,
    },
    /// The GPU layer could not make its context current before a call that needs it.
    #[error("could not make the GPU context current before {site}: {reason}")]
    Context { site: CallSite, reason: String },
    /// The GPU unpack of a receive could not be queued or checked.
    #[error("GPU unpack at {site} failed: {reason}")]
    Gpu { site: CallSite, reason: String },
}

impl FfiError {
    /// The plugin's result code, when the error is one.
    pub fn code(&self) -> Option<NcclResult> {
        match self {
            FfiError::Plugin { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_error_reads_like_nccl() {
        let e = FfiError::Plugin {
            code: 3,
            site: CallSite {
                call: "isend",
                comm: Some(2),
                channel: Some(1),
            },
            plugin: "x".into(),
        };
        let s = e.to_string();
        assert!(
            s.starts_with("internal error (3) from isend on comm 2, channel 1"),
            "{s}"
        );
        assert!(s.contains("Check:"), "{s}");
    }
}
