//! What the tcpx-watch net-plugin shim (`crates/tcpx-watch-plugin`) wrote, read back: the
//! record types of its JSON lines (`record`).
//!
//! For: `tcpx-run watch`, which summarises or follows a job that loaded the shim.
//! Not for: the shim itself (a C-boundary cdylib that only writes), or measuring anything.

pub mod record;
