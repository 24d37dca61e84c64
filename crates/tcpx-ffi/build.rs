//! Compiles the C shim that turns NCCL's variadic logger calls into formatted lines for Rust.
fn main() {
    println!("cargo:rerun-if-changed=csrc/logger_shim.c");
    cc::Build::new()
        .file("csrc/logger_shim.c")
        .warnings(true)
        .compile("tcpx_ffi_logger_shim");
}
