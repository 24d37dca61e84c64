//! NVRTC, found before cudarc looks for it.
//!
//! cudarc opens NVRTC by name (libnvrtc.so.13, .12, ...) through the loader path and panics if that
//! fails. The CUDA toolkit often sits outside that path (/usr/local/cuda/lib64), so we first try
//! the usual folders by full path and keep the library loaded: the loader then answers cudarc's
//! later lookup by soname with the copy already in the process.

use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use crate::GpuError;

static NVRTC: OnceLock<Result<(), GpuError>> = OnceLock::new();
/// Libraries opened by full path, kept for the life of the process.
static KEPT: Mutex<Vec<libloading::Library>> = Mutex::new(Vec::new());

fn candidate_paths() -> Vec<String> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Ok(d) = std::env::var(var) {
            dirs.push(format!("{d}/lib64"));
            dirs.push(format!("{d}/lib"));
        }
    }
    dirs.extend(
        [
            "/usr/local/cuda/lib64",
            "/usr/local/cuda/targets/x86_64-linux/lib",
            "/usr/lib/x86_64-linux-gnu",
        ]
        .map(String::from),
    );
    let mut paths: Vec<String> = std::env::var("TCPX_NVRTC_LIB").into_iter().collect();
    for d in dirs {
        for name in ["libnvrtc.so.13", "libnvrtc.so.12"] {
            paths.push(format!("{d}/{name}"));
        }
    }
    paths
}

/// Makes sure NVRTC can be loaded (once per process).
pub fn ensure_loaded() -> Result<(), GpuError> {
    NVRTC
        .get_or_init(|| {
            // SAFETY: dlopen of NVRTC by cudarc's own candidate names; handles are closed again.
            if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                return Ok(());
            }
            let paths = candidate_paths();
            for p in &paths {
                if !std::path::Path::new(p).exists() {
                    continue;
                }
                // SAFETY: loading NVRTC runs only its own initialisers; the handle is kept in a
                // static for the rest of the process, so code cudarc calls into stays mapped.
                if let Ok(lib) = unsafe { libloading::Library::new(p) } {
                    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(lib);
                    // SAFETY: as above.
                    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                        return Ok(());
                    }
                }
            }
            Err(GpuError::NvrtcMissing {
                searched: paths.join(", "),
            })
        })
        .clone()
}

/// Compiles CUDA C++ `src` to PTX with one extra NVRTC option (e.g. `--gpu-architecture=compute_90`).
pub fn compile(what: &'static str, src: &str, arch_option: &str) -> Result<Ptx, GpuError> {
    ensure_loaded()?;
    let opts = CompileOptions {
        options: vec![arch_option.to_string()],
        ..Default::default()
    };
    compile_ptx_with_opts(src, opts).map_err(|e| {
        let log = match &e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => format!("{other:?}"),
        };
        GpuError::Compile { what, log }
    })
}
