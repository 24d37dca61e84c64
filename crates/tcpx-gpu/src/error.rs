//! [`GpuError`]: what went wrong with the GPU, shared by the CUDA driver wrappers and the NVRTC
//! loader below them.

use std::time::Duration;

use cudarc::driver::result::DriverError;

/// What went wrong with the GPU, worded so the reader knows what to check next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error(
        "CUDA driver library libcuda.so.1 could not be loaded ({reason}): install the NVIDIA \
         driver, or add the folder holding libcuda.so.1 to LD_LIBRARY_PATH; `nvidia-smi` should \
         then list the GPUs"
    )]
    DriverMissing { reason: String },
    #[error(
        "the CUDA driver is present but sees no GPU ({detail}): check `nvidia-smi`, \
         CUDA_VISIBLE_DEVICES and /dev/nvidia*"
    )]
    NoDevice { detail: String },
    #[error("GPU index {index} is out of range: this machine has {count} GPU(s), numbered from 0")]
    IndexOutOfRange { index: usize, count: usize },
    #[error(
        "no GPU has PCI bus id {bus_id:?} ({detail}): list them with `nvidia-smi -q | grep Bus`"
    )]
    BusIdNotFound { bus_id: String, detail: String },
    #[error(
        "out of device memory on GPU {device}: asked for {requested} bytes, {free} of {total} \
         free; use smaller buffers or free GPU memory (`nvidia-smi` shows other users)"
    )]
    OutOfDeviceMemory {
        device: usize,
        requested: usize,
        free: usize,
        total: usize,
    },
    #[error(
        "could not pin {requested} bytes of host memory ({detail}): use smaller staging \
         buffers or raise the locked-memory limit (`ulimit -l`)"
    )]
    OutOfPinnedMemory { requested: usize, detail: String },
    #[error(
        "NVRTC (libnvrtc.so.13 or .12) could not be loaded; searched the loader path and {searched}: \
         install the CUDA toolkit's NVRTC, add its lib64 folder to LD_LIBRARY_PATH, or name the \
         library in TCPX_NVRTC_LIB"
    )]
    NvrtcMissing { searched: String },
    #[error("NVRTC could not compile the {what} kernels: {log}")]
    Compile { what: &'static str, log: String },
    #[error("CUDA call {call} failed on GPU {device}: {code} ({message})")]
    Driver {
        call: &'static str,
        device: usize,
        code: String,
        message: String,
    },
    #[error(
        "CUDA IPC call {call} failed on GPU {device}: {code} ({message}); check that both \
         processes run on the same node under the same driver, that the GPU is not in \
         exclusive-process compute mode (`nvidia-smi -q | grep 'Compute Mode'`), and in a \
         container that IPC is shared with the peer (docker --ipc=host, same /dev/nvidia* devices)"
    )]
    Ipc {
        call: &'static str,
        device: usize,
        code: String,
        message: String,
    },
    #[error("range {offset}+{len} is outside the {size}-byte buffer")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("a buffer of 0 bytes was asked for: give a size of at least 1 byte")]
    ZeroSize,
    #[error("GPU work ({what}) did not finish within {after:?}: the GPU or a peer may be hung")]
    Timeout { what: &'static str, after: Duration },
    #[error("{what}: objects of GPU {a} and GPU {b} cannot be mixed here")]
    WrongDevice {
        what: &'static str,
        a: usize,
        b: usize,
    },
}

impl GpuError {
    pub(crate) fn driver(call: &'static str, device: usize, e: DriverError) -> Self {
        let code = e.error_name().map(|s| s.to_string_lossy().into_owned());
        let message = e.error_string().map(|s| s.to_string_lossy().into_owned());
        GpuError::Driver {
            call,
            device,
            code: code.unwrap_or_else(|_| format!("CUresult {}", e.0 as i32)),
            message: message.unwrap_or_else(|_| "no description".into()),
        }
    }

    /// [`GpuError::Driver`]'s fields for an IPC call, with the IPC checklist in the message.
    pub(crate) fn ipc(call: &'static str, device: usize, e: DriverError) -> Self {
        match GpuError::driver(call, device, e) {
            GpuError::Driver {
                call,
                device,
                code,
                message,
            } => GpuError::Ipc {
                call,
                device,
                code,
                message,
            },
            other => other,
        }
    }
}
