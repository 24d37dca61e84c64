//! GPU tests skip visibly where there is no GPU, and fail where one is required.
//!
//! On a machine without a GPU (CI, developers' machines) a GPU test prints
//! `SKIP: <test>: <reason>` straight to the process's stderr, past the test harness's output
//! capture, so the skipped tests show in the CI log. On the device machine `cargo xtask gpu-test`
//! sets `TCPX_REQUIRE_GPU=1`, and the same missing GPU fails the test.

use std::io::Write;

use crate::{device_count, Device};

/// Environment variable that turns "no GPU" from a skip into a test failure.
pub const REQUIRE_GPU_ENV: &str = "TCPX_REQUIRE_GPU";

/// True when `TCPX_REQUIRE_GPU` is set to something other than `0` or empty.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Prints `SKIP: <test>: <reason>` to stderr, bypassing libtest's capture, or panics (failing the
/// test) when a GPU is required.
pub fn skip(test: &str, reason: &str) {
    if gpu_required() {
        panic!("{test}: {REQUIRE_GPU_ENV} is set but {reason}");
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "SKIP: {test}: {reason}");
}

/// Opens GPUs `0..min_gpus` for a test, or returns `None` after [`skip`] when there are fewer.
pub fn gpus_or_skip(test: &str, min_gpus: usize) -> Option<Vec<Device>> {
    let count = match device_count() {
        Ok(n) => n,
        Err(e) => {
            skip(test, &format!("no GPU: {e}"));
            return None;
        }
    };
    if count < min_gpus {
        skip(
            test,
            &format!("needs {min_gpus} GPU(s), this machine has {count}"),
        );
        return None;
    }
    match (0..min_gpus)
        .map(Device::open)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(v) => Some(v),
        Err(e) => panic!("{test}: {count} GPU(s) counted but opening failed: {e}"),
    }
}
