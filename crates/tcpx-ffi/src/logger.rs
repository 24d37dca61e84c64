//! The plugin logger: the C shim in `csrc/logger_shim.c` formats each line, this module turns it
//! into a `tracing` event (target `ncclnet`) with the plugin's level, subsystem flags, file and line.

use std::ffi::{c_char, c_int, c_ulong, CStr};
use std::sync::Once;

use crate::abi::{
    NcclDebugLogger, NCCL_LOG_ABORT, NCCL_LOG_INFO, NCCL_LOG_NONE, NCCL_LOG_TRACE,
    NCCL_LOG_VERSION, NCCL_LOG_WARN,
};

type Sink = unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char);

extern "C" {
    fn tcpx_ffi_set_log_sink(sink: Option<Sink>);
    fn tcpx_ffi_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

/// Turns a possibly-NULL C string from the plugin into text.
fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the shim passes NUL-terminated strings it formatted (or the plugin's `__FILE__`),
    // valid for the duration of this call; we copy before returning.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}

unsafe extern "C" fn sink(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    msg: *const c_char,
) {
    // A panic must not unwind into C.
    let _ = std::panic::catch_unwind(|| {
        let msg = text(msg);
        let file = text(file);
        let msg = msg.trim_end();
        match level {
            NCCL_LOG_NONE => {}
            NCCL_LOG_ABORT => {
                tracing::error!(target: "ncclnet", level, flags, %file, line, "{msg}")
            }
            NCCL_LOG_WARN => tracing::warn!(target: "ncclnet", level, flags, %file, line, "{msg}"),
            NCCL_LOG_VERSION | NCCL_LOG_INFO => {
                tracing::info!(target: "ncclnet", level, flags, %file, line, "{msg}")
            }
            NCCL_LOG_TRACE => {
                tracing::trace!(target: "ncclnet", level, flags, %file, line, "{msg}")
            }
            _ => tracing::debug!(target: "ncclnet", level, flags, %file, line, "{msg}"),
        }
    });
}

/// The logger to hand to a plugin's `init`, with the Rust sink installed.
pub(crate) fn plugin_logger() -> NcclDebugLogger {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: `sink` matches the C typedef `tcpx_ffi_log_sink_t`; it stays valid forever.
        unsafe { tcpx_ffi_set_log_sink(Some(sink)) }
    });
    Some(tcpx_ffi_logger)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tcpx_test_support::Capture;

    #[test]
    fn variadic_lines_are_formatted_in_c_and_reach_tracing() {
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let logger = plugin_logger().expect("logger");
        let long = "x".repeat(3000);
        let long_c = std::ffi::CString::new(long.clone()).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            // SAFETY: format strings and arguments match (%s/%d with C strings and ints).
            unsafe {
                logger(
                    NCCL_LOG_WARN,
                    4,
                    c"plugin.c".as_ptr(),
                    17,
                    c"NET/%s : %d sockets, %s".as_ptr(),
                    c"Test".as_ptr(),
                    8 as c_int,
                    c"ok\n".as_ptr(),
                );
                logger(
                    NCCL_LOG_INFO,
                    0,
                    std::ptr::null(),
                    0,
                    c"long %s".as_ptr(),
                    long_c.as_ptr(),
                );
                logger(NCCL_LOG_WARN, 0, std::ptr::null(), 0, std::ptr::null());
            }
        });
        let out = capture.text();
        assert!(out.contains("NET/Test : 8 sockets, ok"), "{out}");
        assert!(out.contains("WARN"), "{out}");
        assert!(out.contains("file=plugin.c"), "{out}");
        assert!(out.contains("line=17"), "{out}");
        assert!(
            out.contains(&format!("long {long}")),
            "long line cut: {out}"
        );
        assert!(out.contains("plugin logged a NULL format"), "{out}");
    }
}
