//! Compiles the C shim that turns NCCL's variadic logger calls into formatted lines for Rust, and
//! three tiny probe plugins (v7; v8 + v7; v9 + v8 + v7) that the loader's tests open.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=csrc/logger_shim.c");
    println!("cargo:rerun-if-changed=csrc/probe_plugin.c");
    cc::Build::new()
        .file("csrc/logger_shim.c")
        .warnings(true)
        .compile("tcpx_ffi_logger_shim");

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let compiler = cc::Build::new().get_compiler();
    for version in ["7", "8", "9"] {
        let lib = out.join(format!("libprobe_v{version}.so"));
        let status = compiler
            .to_command()
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(format!("-DPROBE_V{version}"))
            .arg("csrc/probe_plugin.c")
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!("building the probe plugin v{version} failed: {other:?}"),
        }
    }
    println!("cargo:rustc-env=TCPX_FFI_PROBE_PLUGINS={}", out.display());
}
