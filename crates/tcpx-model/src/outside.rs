//! The knobs of a plan experiment that act outside the bench: how many NICs each side uses, the
//! NIC queue IRQ policy, the threads' CPU binding and sampling. They travel typed with the
//! experiment from the leader to the follower, and what could not act comes back keyed by
//! [`Knob`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Knob;

macro_rules! word_enum {
    ($(#[$doc:meta])* $t:ident, $what:literal, $($v:ident = $name:literal),*) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub enum $t {
            #[default]
            $($v,)*
        }

        impl $t {
            /// Every word, in the order users are shown them.
            pub const NAMES: &'static [&'static str] = &[$($name,)*];

            pub fn name(self) -> &'static str {
                match self {
                    $($t::$v => $name,)*
                }
            }
        }

        crate::display_as_word!($t, name);

        impl std::str::FromStr for $t {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($t::$v),)*
                    other => Err(format!(
                        "{} `{other}`: use one of {}",
                        $what,
                        Self::NAMES.join(", ")
                    )),
                }
            }
        }

        crate::serde_as_text!($t, $what);
    };
}

pub(crate) use word_enum;

word_enum!(
    /// NIC queue IRQ affinity during an experiment (`tcpx_affinity::choice`).
    IrqPolicy, "irq_policy",
    Default = "default",
    Nccl = "nccl",
    NumaLocal = "numa-local"
);

word_enum!(
    /// CPU affinity of the transfer threads.
    ThreadBinding, "thread_binding",
    None = "none",
    Nccl = "nccl",
    NumaLocal = "numa-local"
);

/// The knobs a plan experiment has beyond its [`crate::Experiment`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outside {
    /// NICs each side spreads its channels over (each side picks its own).
    #[serde(default = "one")]
    pub nics: u32,
    #[serde(default)]
    pub irq_policy: IrqPolicy,
    #[serde(default)]
    pub thread_binding: ThreadBinding,
    /// Sample CPU, IRQ and NIC counters during the experiment.
    #[serde(default)]
    pub sample: bool,
}

fn one() -> u32 {
    1
}

impl Default for Outside {
    /// One NIC, no IRQ policy, no binding, sampling on: a plan experiment's defaults.
    fn default() -> Self {
        Outside {
            nics: 1,
            irq_policy: IrqPolicy::Default,
            thread_binding: ThreadBinding::None,
            sample: true,
        }
    }
}

/// Knobs that could not act for an experiment, with the reason for each.
pub type NotApplied = BTreeMap<Knob, String>;
