//! tcpx-model: the vocabulary every other crate speaks, with nothing underneath it.
//!
//! What an experiment is ([`Experiment`]) and the typed values it is made of ([`Backend`],
//! [`Memory`], [`NicPolicy`], [`CpuSet`], [`Bytes`]), which end of a transfer a thing belongs to
//! ([`Side`]), where the other machine is ([`Peer`]), how to wait politely until a deadline
//! ([`Backoff`]), what one side measured for one message size ([`SideFigures`]), and every knob
//! an experiment has, declared once in [`knob::KNOBS`]: its type, range, default, environment
//! variable, CSV column and doc. The command line, the CSV file, the plan API, tuned.env and
//! docs/PLANS.md are generated from that table or checked against it, so a knob cannot be
//! half-declared. What a knob becomes for NCCL, the GPUDirect-TCPX plugin and the UCCL seed
//! benchmark is typed rows beside it ([`equivalence::EQUIVALENCES`]), which tuned.env iterates.
//!
//! Every type keeps the text form users and older files already use (`socket`, `cuda:0,1`,
//! `round-robin`, `8-21,112-125`, `512K`), for `Display`, `FromStr` and serde alike, so reports,
//! link messages and report.json files written before these types existed still parse.
//!
//! Not for: running anything, reading the environment or the machine, or moving bytes. It depends
//! on serde and thiserror only, so that every crate (down to the transports) can use it without
//! pulling in CUDA, the FFI or the fabric.

#![forbid(unsafe_code)]

mod auto;
mod backend;
mod backend_caps;
mod backoff;
mod bytes;
mod cpus;
pub mod equivalence;
mod error_chain;
mod experiment;
mod figures;
pub mod knob;
mod median;
mod memory;
mod nic;
mod outside;
mod peer;
pub mod set_knob;
pub mod setting;
mod side;

pub use auto::{auto_transfer, describe_choice, AutoChoice, AutoInput, Measured, MEASURED};
pub use backend::{Backend, UnknownBackend};
pub use backend_caps::{
    Capabilities, DefaultChunk, GpuMemoryPath, NcclEquivalent, NicPlacement, OpenFileCost,
    WorkerThreads,
};
pub use backoff::{remaining, Backoff};
pub use bytes::{format_size, parse_size, parse_sizes, Bytes};
pub use cpus::{parse_cpu_list, CpuListError, CpuSet, MAX_CPU};
pub use error_chain::error_chain;
pub use experiment::*;
pub use figures::{check_gbs, check_time, SideFigures, FASTEST_BYTES_PER_S, LONGEST_SECONDS};
pub use knob::{Knob, KnobKind, KnobSpec, KNOBS, PLAN_KNOBS};
pub use median::{median, median_sorted};
pub use memory::{Memory, MemoryError};
pub use nic::{NicPolicy, UnknownNicPolicy};
pub use outside::{IrqPolicy, NotApplied, Outside, ThreadBinding};
pub use peer::{Peer, PeerError};
pub use side::Side;

/// Implements serde for a type through its `Display` and `FromStr`: the wire form is the text
/// form, so JSON written with plain strings keeps parsing.
macro_rules! serde_as_text {
    ($t:ty, $what:literal) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl serde::de::Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$t, E> {
                        v.parse().map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
        /// Equal when the text parses to this value.
        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                other.parse::<$t>().is_ok_and(|o| o == *self)
            }
        }
        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                *self == **other
            }
        }
    };
}
pub(crate) use serde_as_text;

/// Implements `Display` for a word type as the word its `$name` method returns (its text form).
macro_rules! display_as_word {
    ($t:ty, $name:ident) => {
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.$name())
            }
        }
    };
}
pub(crate) use display_as_word;
