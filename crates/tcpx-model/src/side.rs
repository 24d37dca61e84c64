//! Which end of a transfer something belongs to.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The sending or the receiving end of a transfer: a figure, a binding, a schedule, a CPU list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// The sender (the bench client).
    Send,
    /// The receiver (the bench server).
    Recv,
}

impl Side {
    /// Both, sender first.
    pub const BOTH: [Side; 2] = [Side::Send, Side::Recv];

    /// `send` or `recv`, as tables, CSV rows and JSON spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Send => "send",
            Side::Recv => "recv",
        }
    }

    /// The other end.
    pub fn peer(self) -> Side {
        match self {
            Side::Send => Side::Recv,
            Side::Recv => Side::Send,
        }
    }
}

crate::display_as_word!(Side, as_str);

impl FromStr for Side {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "send" => Ok(Side::Send),
            "recv" => Ok(Side::Recv),
            other => Err(format!("side `{other}`: use send or recv")),
        }
    }
}
