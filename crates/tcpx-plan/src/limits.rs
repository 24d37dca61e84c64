//! Limits on what the crate reads from files, shared by the plan engine and the target sets.

/// Plan files, the modules they import and target sets larger than this are refused
/// (docs/PLANS.md).
pub const MAX_PLAN_BYTES: u64 = 1 << 20;
