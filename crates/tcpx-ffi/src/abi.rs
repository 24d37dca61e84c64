//! `repr(C)` mirrors of the NCCL net plugin ABI (v7, v8, v9) and of GPUDirect-TCPX's receive-side
//! unpack structures. Field order and widths follow NCCL's `ext-net` headers; every type's size,
//! alignment and field offsets are pinned by the tests at the bottom of this file.

use std::ffi::{c_char, c_float, c_int, c_ulong, c_void};

/// `ncclResult_t`: a C enum, passed as `int` (the same codes in nccl.h and the net plugin ABI).
pub type NcclResult = c_int;

pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// Every `ncclResult_t`: its code, its C name (as NCCL's logs print it) and the words NCCL itself
/// uses for it (`ncclGetErrorString` minus punctuation).
const RESULTS: [(NcclResult, &str, &str); 8] = [
    (NCCL_SUCCESS, "ncclSuccess", "success"),
    (
        NCCL_UNHANDLED_CUDA_ERROR,
        "ncclUnhandledCudaError",
        "unhandled cuda error",
    ),
    (NCCL_SYSTEM_ERROR, "ncclSystemError", "system error"),
    (NCCL_INTERNAL_ERROR, "ncclInternalError", "internal error"),
    (
        NCCL_INVALID_ARGUMENT,
        "ncclInvalidArgument",
        "invalid argument",
    ),
    (NCCL_INVALID_USAGE, "ncclInvalidUsage", "invalid usage"),
    (NCCL_REMOTE_ERROR, "ncclRemoteError", "remote error"),
    (NCCL_IN_PROGRESS, "ncclInProgress", "in progress"),
];

/// The words NCCL itself uses for a result code (`ncclGetErrorString` minus punctuation).
pub fn result_name(code: NcclResult) -> &'static str {
    RESULTS
        .iter()
        .find(|r| r.0 == code)
        .map_or("unknown result", |r| r.2)
}

/// The C name of a result code, as NCCL's own logs print it.
pub fn result_c_name(code: NcclResult) -> &'static str {
    RESULTS
        .iter()
        .find(|r| r.0 == code)
        .map_or("unknown ncclResult_t", |r| r.1)
}

/// Size of the opaque handle `listen` fills and `connect` consumes (sent out of band).
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;

/// `regMr` pointer types.
pub const NCCL_PTR_HOST: c_int = 1;
pub const NCCL_PTR_CUDA: c_int = 2;
pub const NCCL_PTR_DMABUF: c_int = 4;

/// `netDeviceType` values.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
pub const NCCL_NET_DEVICE_UNPACK: c_int = 1;
/// `netDeviceVersion` GPUDirect-TCPX reports with an UNPACK device.
pub const NCCL_NET_DEVICE_UNPACK_VERSION: c_int = 0x7;

/// Logger levels (`ncclDebugLogLevel`).
pub const NCCL_LOG_NONE: c_int = 0;
pub const NCCL_LOG_VERSION: c_int = 1;
pub const NCCL_LOG_WARN: c_int = 2;
pub const NCCL_LOG_INFO: c_int = 3;
pub const NCCL_LOG_ABORT: c_int = 4;
pub const NCCL_LOG_TRACE: c_int = 5;

/// `ncclDebugLogger_t`: C-variadic, so only C can define one (see `csrc/logger_shim.c`).
pub type NcclDebugLogger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;

/// `ncclNetDeviceHandle_v7_t` (identical in v8 and v9).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetDeviceHandle {
    /// [`NCCL_NET_DEVICE_HOST`] or [`NCCL_NET_DEVICE_UNPACK`].
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    /// For UNPACK: address of an [`UnpackHandle`] (device memory with GPUDirect-TCPX).
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

impl NetDeviceHandle {
    pub const fn zeroed() -> Self {
        NetDeviceHandle {
            net_device_type: 0,
            net_device_version: 0,
            handle: std::ptr::null_mut(),
            size: 0,
            needs_proxy_progress: 0,
        }
    }
}

/// `ncclNetProperties_v7_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPropertiesV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    /// Mbps.
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8_t`: v7 with `regIsGlobal` after `ptrSupport`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPropertiesV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// Most physical devices a v9 virtual device may merge.
pub const NCCL_NET_MAX_DEVS_PER_NIC: usize = 4;

/// `ncclNetVDeviceProps_v9_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetVDeviceProps {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC],
}

/// `ncclNetProperties_v9_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NetPropertiesV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: NetVDeviceProps,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

type Comm = *mut c_void;

/// Declares one version's `ncclNet_vN_t`. The slots are the same in v7, v8 and v9, in the same
/// order; what differs is the properties struct, the integer type of `regMr`'s size and of
/// `isend`/`irecv`'s sizes, and the slots a version appends at the end.
macro_rules! net_table {
    (
        $(#[$meta:meta])*
        $table:ident {
            properties: $props:ty,
            reg_mr_size: $reg_mr_size:ty,
            message_size: $message_size:ty,
            $(appended: { $($extra:ident: $extra_ty:ty,)* })?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $table {
            pub name: *const c_char,
            pub init: Option<unsafe extern "C" fn(logger: NcclDebugLogger) -> NcclResult>,
            pub devices: Option<unsafe extern "C" fn(ndev: *mut c_int) -> NcclResult>,
            pub get_properties:
                Option<unsafe extern "C" fn(dev: c_int, props: *mut $props) -> NcclResult>,
            pub listen: Option<
                unsafe extern "C" fn(
                    dev: c_int,
                    handle: *mut c_void,
                    listen_comm: *mut Comm,
                ) -> NcclResult,
            >,
            pub connect: Option<
                unsafe extern "C" fn(
                    dev: c_int,
                    handle: *mut c_void,
                    send_comm: *mut Comm,
                    send_dev_comm: *mut *mut NetDeviceHandle,
                ) -> NcclResult,
            >,
            pub accept: Option<
                unsafe extern "C" fn(
                    listen_comm: Comm,
                    recv_comm: *mut Comm,
                    recv_dev_comm: *mut *mut NetDeviceHandle,
                ) -> NcclResult,
            >,
            pub reg_mr: Option<
                unsafe extern "C" fn(
                    comm: Comm,
                    data: *mut c_void,
                    size: $reg_mr_size,
                    ptr_type: c_int,
                    mhandle: *mut *mut c_void,
                ) -> NcclResult,
            >,
            pub reg_mr_dma_buf: RegMrDmaBuf,
            pub dereg_mr:
                Option<unsafe extern "C" fn(comm: Comm, mhandle: *mut c_void) -> NcclResult>,
            pub isend: Option<
                unsafe extern "C" fn(
                    send_comm: Comm,
                    data: *mut c_void,
                    size: $message_size,
                    tag: c_int,
                    mhandle: *mut c_void,
                    request: *mut *mut c_void,
                ) -> NcclResult,
            >,
            pub irecv: Option<
                unsafe extern "C" fn(
                    recv_comm: Comm,
                    n: c_int,
                    data: *mut *mut c_void,
                    sizes: *mut $message_size,
                    tags: *mut c_int,
                    mhandles: *mut *mut c_void,
                    request: *mut *mut c_void,
                ) -> NcclResult,
            >,
            pub iflush: IFlush,
            pub test: Test,
            pub close_send: Close,
            pub close_recv: Close,
            pub close_listen: Close,
            pub get_device_mr: GetDeviceMr,
            pub irecv_consumed: IRecvConsumed,
            $($(pub $extra: $extra_ty,)*)?
        }
    };
}

net_table! {
    /// `ncclNet_v7_t`: the table a plugin exports as `ncclNetPlugin_v7`.
    NcclNetV7 {
        properties: NetPropertiesV7,
        reg_mr_size: c_int,
        message_size: c_int,
    }
}

net_table! {
    /// `ncclNet_v8_t`: v7 with `size_t` in `regMr` and v8 properties.
    NcclNetV8 {
        properties: NetPropertiesV8,
        reg_mr_size: usize,
        message_size: c_int,
    }
}

net_table! {
    /// `ncclNet_v9_t`: `size_t` sizes in `isend`/`irecv`, v9 properties, `makeVDevice` appended.
    NcclNetV9 {
        properties: NetPropertiesV9,
        reg_mr_size: usize,
        message_size: usize,
        appended: {
            make_v_device: MakeVDevice,
        }
    }
}

/// `regMrDmaBuf` (same in v7, v8, v9).
pub type RegMrDmaBuf = Option<
    unsafe extern "C" fn(
        comm: Comm,
        data: *mut c_void,
        size: usize,
        ptr_type: c_int,
        offset: u64,
        fd: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `iflush` (same in v7, v8, v9).
pub type IFlush = Option<
    unsafe extern "C" fn(
        recv_comm: Comm,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `test` (same in v7, v8, v9: sizes stay `int*`).
pub type Test = Option<
    unsafe extern "C" fn(request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult,
>;
/// `closeSend` / `closeRecv` / `closeListen`.
pub type Close = Option<unsafe extern "C" fn(comm: Comm) -> NcclResult>;
/// `getDeviceMr`.
pub type GetDeviceMr = Option<
    unsafe extern "C" fn(
        comm: Comm,
        mhandle: *mut c_void,
        dptr_mhandle: *mut *mut c_void,
    ) -> NcclResult,
>;
/// `irecvConsumed`.
pub type IRecvConsumed =
    Option<unsafe extern "C" fn(recv_comm: Comm, n: c_int, request: *mut c_void) -> NcclResult>;
/// `makeVDevice` (v9).
pub type MakeVDevice =
    Option<unsafe extern "C" fn(d: *mut c_int, props: *mut NetVDeviceProps) -> NcclResult>;

// ---- GPUDirect-TCPX receive-side unpack ------------------------------------------------------

/// Receive slots of one recv comm: request `i` uses slot `i % 16`.
pub const UNPACK_SLOTS: usize = 16;
/// Most bytes one irecv may carry with an UNPACK device (`NET_UNPACK_MAX_SLICE_SIZE`).
pub const UNPACK_MAX_RECV_BYTES: usize = 4 << 20;
/// Bounce buffer page size.
pub const UNPACK_PAGE: usize = 4096;
/// Fragments one slot can describe: the pages of 4 MiB, doubled as slack because fragments need
/// not start on a page boundary (`NET_UNPACK_MAX_SLICE_PAGES`).
pub const UNPACK_MAX_FRAGMENTS: usize = UNPACK_MAX_RECV_BYTES / UNPACK_PAGE * 2;

/// `loadMeta`: copy `len` bytes from `bounce_buf + src_off` to `destination + dst_off`.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadMeta {
    pub src_off: u32,
    pub len: u32,
    pub dst_off: u64,
}

/// `netUnpackMeta`: per-slot fragment lists and counts (host memory mapped to the device).
#[repr(C)]
pub struct NetUnpackMeta {
    pub mem: [[LoadMeta; UNPACK_MAX_FRAGMENTS]; UNPACK_SLOTS],
    /// Fragments of the receive in each slot, stored after its fragments (with a store fence).
    pub cnt: [u64; UNPACK_SLOTS],
}

/// What `NetDeviceHandle::handle` points to for an UNPACK device.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct UnpackHandle {
    pub meta: *mut NetUnpackMeta,
    pub bounce_buf: *mut c_void,
    /// Consumer position kept by the GPU side; starts at `u64::MAX`.
    pub head: u64,
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// Asserts a `#[repr(C)]` type's size, alignment and field offsets against the C header's.
    macro_rules! assert_layout {
        ($t:ty, size $size:expr, align $align:expr, { $($field:ident: $offset:expr),* $(,)? }) => {{
            assert_eq!(size_of::<$t>(), $size, "size of {}", stringify!($t));
            assert_eq!(align_of::<$t>(), $align, "align of {}", stringify!($t));
            $(assert_eq!(
                offset_of!($t, $field),
                $offset,
                "offset of {}.{}",
                stringify!($t),
                stringify!($field)
            );)*
        }};
    }

    #[test]
    fn device_handle_layout() {
        assert_layout!(NetDeviceHandle, size 32, align 8, {
            net_device_type: 0,
            net_device_version: 4,
            handle: 8,
            size: 16,
            needs_proxy_progress: 24,
        });
    }

    #[test]
    fn properties_v7_layout() {
        assert_layout!(NetPropertiesV7, size 56, align 8, {
            name: 0,
            pci_path: 8,
            guid: 16,
            ptr_support: 24,
            speed: 28,
            port: 32,
            latency: 36,
            max_comms: 40,
            max_recvs: 44,
            net_device_type: 48,
            net_device_version: 52,
        });
    }

    #[test]
    fn properties_v8_layout() {
        assert_layout!(NetPropertiesV8, size 64, align 8, {
            ptr_support: 24,
            reg_is_global: 28,
            speed: 32,
            port: 36,
            latency: 40,
            max_comms: 44,
            max_recvs: 48,
            net_device_type: 52,
            net_device_version: 56,
        });
    }

    #[test]
    fn properties_v9_layout() {
        assert_layout!(NetVDeviceProps, size 20, align 4, {
            devs: 4,
        });
        assert_layout!(NetPropertiesV9, size 104, align 8, {
            ptr_support: 24,
            reg_is_global: 28,
            force_flush: 32,
            speed: 36,
            port: 40,
            latency: 44,
            max_comms: 48,
            max_recvs: 52,
            net_device_type: 56,
            net_device_version: 60,
            v_props: 64,
            max_p2p_bytes: 88,
            max_coll_bytes: 96,
        });
    }

    /// Slot of each function pointer, in pointer-sized words from the start of the table.
    const P: usize = size_of::<*const ()>();

    /// Asserts that the slots every version shares sit one pointer apart, in NCCL's order.
    macro_rules! assert_shared_slots {
        ($table:ty) => {{
            let slots = [
                ("name", offset_of!($table, name)),
                ("init", offset_of!($table, init)),
                ("devices", offset_of!($table, devices)),
                ("get_properties", offset_of!($table, get_properties)),
                ("listen", offset_of!($table, listen)),
                ("connect", offset_of!($table, connect)),
                ("accept", offset_of!($table, accept)),
                ("reg_mr", offset_of!($table, reg_mr)),
                ("reg_mr_dma_buf", offset_of!($table, reg_mr_dma_buf)),
                ("dereg_mr", offset_of!($table, dereg_mr)),
                ("isend", offset_of!($table, isend)),
                ("irecv", offset_of!($table, irecv)),
                ("iflush", offset_of!($table, iflush)),
                ("test", offset_of!($table, test)),
                ("close_send", offset_of!($table, close_send)),
                ("close_recv", offset_of!($table, close_recv)),
                ("close_listen", offset_of!($table, close_listen)),
                ("get_device_mr", offset_of!($table, get_device_mr)),
                ("irecv_consumed", offset_of!($table, irecv_consumed)),
            ];
            for (index, (slot, offset)) in slots.into_iter().enumerate() {
                assert_eq!(offset, index * P, "{} slot {slot}", stringify!($table));
            }
        }};
    }

    #[test]
    fn table_v7_layout() {
        assert_layout!(NcclNetV7, size 19 * P, align 8, {});
        assert_shared_slots!(NcclNetV7);
    }

    #[test]
    fn table_v8_layout() {
        assert_layout!(NcclNetV8, size 19 * P, align 8, {});
        assert_shared_slots!(NcclNetV8);
    }

    #[test]
    fn table_v9_layout() {
        assert_layout!(NcclNetV9, size 20 * P, align 8, { make_v_device: 19 * P });
        assert_shared_slots!(NcclNetV9);
    }

    #[test]
    fn unpack_layouts() {
        assert_layout!(LoadMeta, size 16, align 16, {
            src_off: 0,
            len: 4,
            dst_off: 8,
        });

        assert_layout!(NetUnpackMeta, size 16 * 2048 * 16 + 16 * 8, align 16, {
            mem: 0,
            cnt: 16 * 2048 * 16,
        });

        assert_layout!(UnpackHandle, size 24, align 8, {
            meta: 0,
            bounce_buf: 8,
            head: 16,
        });
        assert_eq!(UNPACK_MAX_RECV_BYTES, 4 << 20);
        assert_eq!(UNPACK_MAX_FRAGMENTS, 2048);
    }

    #[test]
    fn result_names_match_nccl() {
        assert_eq!(result_name(NCCL_INTERNAL_ERROR), "internal error");
        assert_eq!(result_name(NCCL_REMOTE_ERROR), "remote error");
        assert_eq!(result_name(42), "unknown result");
    }
}
