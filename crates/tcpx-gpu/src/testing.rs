//! GPU tests fit the machine: they skip visibly where it has fewer GPUs than they need, and fail
//! only where the run asked for that many.
//!
//! A GPU test that cannot run prints `SKIP: <test>: <reason>` straight to the process's stderr,
//! past the test harness's output capture, so skipped tests show in the CI log and in the GPU
//! bundle's summary. Two variables turn a skip into a failure:
//! - `TCPX_REQUIRE_GPUS=N`: the run needs N GPUs; a test needing at most N fails when they are not
//!   there (a test needing more than N still skips, naming its count).
//! - `TCPX_REQUIRE_GPU=1` (what `cargo xtask gpu-test`'s bundle sets): the same as
//!   `TCPX_REQUIRE_GPUS=1`, so a GPU machine without a usable GPU fails, while a 1-GPU machine
//!   skips the tests that need two.

use std::io::Write;

use crate::{device_count, Device};

/// Environment variable that asks for at least one GPU (`1`), so "no GPU" fails the test.
pub const REQUIRE_GPU_ENV: &str = "TCPX_REQUIRE_GPU";
/// Environment variable that asks for at least N GPUs.
pub const REQUIRE_GPUS_ENV: &str = "TCPX_REQUIRE_GPUS";

/// GPUs the run requires, from [`REQUIRE_GPUS_ENV`] and [`REQUIRE_GPU_ENV`] (the larger); 0 when
/// neither is set. An unreadable `TCPX_REQUIRE_GPUS` counts as 1: it was set to ask for GPUs.
pub fn gpus_required() -> usize {
    required_from(
        std::env::var(REQUIRE_GPU_ENV).ok().as_deref(),
        std::env::var(REQUIRE_GPUS_ENV).ok().as_deref(),
    )
}

fn required_from(require_gpu: Option<&str>, require_gpus: Option<&str>) -> usize {
    let one = usize::from(require_gpu.is_some_and(|v| !v.is_empty() && v != "0"));
    let n = match require_gpus.map(str::trim) {
        None | Some("") => 0,
        Some(v) => v.parse().unwrap_or(1),
    };
    one.max(n)
}

/// True when the run requires at least one GPU.
pub fn gpu_required() -> bool {
    gpus_required() > 0
}

/// Prints `SKIP: <test>: <reason>` to stderr, bypassing libtest's capture, or panics (failing the
/// test) when the run requires a GPU: for reasons other than a GPU count (libnccl missing, say).
pub fn skip(test: &str, reason: &str) {
    if gpu_required() {
        panic!(
            "{test}: {} is set but {reason}",
            if std::env::var_os(REQUIRE_GPUS_ENV).is_some() {
                REQUIRE_GPUS_ENV
            } else {
                REQUIRE_GPU_ENV
            }
        );
    }
    print_skip(test, reason);
}

fn print_skip(test: &str, reason: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "SKIP: {test}: {reason}");
}

/// What a test needing `need` GPUs does on a machine with `have`, when the run requires
/// `required`: run, skip (with the reason) or fail (with the reason).
#[derive(Debug, PartialEq, Eq)]
pub enum Fit {
    Run,
    Skip(String),
    Fail(String),
}

/// Decides [`Fit`]: a test fails for want of GPUs only when the run asked for at least as many
/// as the test needs.
pub fn fit(need: usize, have: usize, required: usize) -> Fit {
    if have >= need {
        return Fit::Run;
    }
    let reason = format!("needs {need} GPU(s), this machine has {have}");
    if required >= need {
        Fit::Fail(format!(
            "{reason}, and the run requires {required} ({REQUIRE_GPUS_ENV} / {REQUIRE_GPU_ENV})"
        ))
    } else {
        Fit::Skip(reason)
    }
}

/// Opens GPUs `0..min_gpus` for a test, or returns `None` after printing a skip when there are
/// fewer; panics (failing the test) when the run requires that many (see the module doc).
pub fn gpus_or_skip(test: &str, min_gpus: usize) -> Option<Vec<Device>> {
    let required = gpus_required();
    let count = match device_count() {
        Ok(n) => n,
        Err(e) => {
            match fit(min_gpus, 0, required) {
                Fit::Fail(r) => panic!("{test}: {r}; CUDA said: {e}"),
                _ => print_skip(test, &format!("no GPU: {e}")),
            }
            return None;
        }
    };
    match fit(min_gpus, count, required) {
        Fit::Run => {}
        Fit::Skip(r) => {
            print_skip(test, &r);
            return None;
        }
        Fit::Fail(r) => panic!("{test}: {r}"),
    }
    match (0..min_gpus)
        .map(Device::open)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(v) => Some(v),
        Err(e) => panic!("{test}: {count} GPU(s) counted but opening failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_count_comes_from_either_variable() {
        assert_eq!(required_from(None, None), 0);
        assert_eq!(required_from(Some("0"), None), 0);
        assert_eq!(required_from(Some("1"), None), 1);
        assert_eq!(required_from(Some("1"), Some("2")), 2);
        assert_eq!(required_from(None, Some("4")), 4);
        assert_eq!(required_from(None, Some("two")), 1);
        assert_eq!(required_from(Some(""), Some("")), 0);
    }

    #[test]
    fn tests_fail_only_when_the_run_asks_for_their_gpus() {
        assert_eq!(fit(1, 1, 1), Fit::Run);
        assert_eq!(fit(2, 8, 0), Fit::Run);
        // A 1-GPU machine with the bundle's TCPX_REQUIRE_GPU=1: 2-GPU tests skip.
        assert!(
            matches!(fit(2, 1, 1), Fit::Skip(r) if r.contains("needs 2 GPU(s), this machine has 1"))
        );
        // ... unless the run asked for two.
        assert!(matches!(fit(2, 1, 2), Fit::Fail(r) if r.contains("requires 2")));
        // No GPU at all on a machine that must have one.
        assert!(matches!(fit(1, 0, 1), Fit::Fail(_)));
        assert!(matches!(fit(1, 0, 0), Fit::Skip(_)));
    }
}
