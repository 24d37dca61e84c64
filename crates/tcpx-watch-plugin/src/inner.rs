//! The real plugin: opened the NCCL way, its newest table taken, and every call made in that
//! table's own types.
//!
//! The shim exports v7, v8 and v9 tables whatever the real plugin has, because NCCL chooses the
//! version by `dlsym` before any code of the shim runs. A caller on an older or newer version
//! than the real plugin is served the way NCCL's own compatibility layer serves that plugin:
//! v7/v8 properties widened with `regIsGlobal = 0`, `forceFlush = 0`, one physical device per
//! virtual device and NCCL's `MAX_NET_SIZE` / `MAX_COLLNET_SIZE` as the byte limits; a `size_t`
//! size that does not fit the real plugin's `int` answered with `ncclInternalError`, as NCCL does.
//! Between equal versions every argument and result passes unchanged.

use std::ffi::{c_char, c_int, c_void, CStr, CString};

use tcpx_ffi::abi::*;

type Comm = *mut c_void;

/// NCCL's `MAX_NET_SIZE`: the `maxP2pBytes` its compatibility layer gives a v7/v8 plugin.
pub const MAX_NET_SIZE: usize = 1 << 30;
/// NCCL's `MAX_COLLNET_SIZE`: the `maxCollBytes` it gives a v7/v8 plugin.
pub const MAX_COLLNET_SIZE: usize = 512 << 20;
/// Most receives one `irecv` may group when sizes must be converted between `int` and `size_t`
/// (NCCL groups at most `NCCL_PROXY_MAX_SUBS`, 32 or 64 by version).
pub const MAX_GROUPED: usize = 64;

/// The real plugin's table, of the newest version it exports.
#[derive(Clone, Copy)]
pub enum Table {
    V7(&'static NcclNetV7),
    V8(&'static NcclNetV8),
    V9(&'static NcclNetV9),
}

/// The loaded real plugin; never unloaded (NCCL never unloads a net plugin either).
pub struct Inner {
    pub table: Table,
    /// The file the table lives in (`dladdr`), or the name that opened.
    pub path: String,
    /// The table's `name`.
    pub name: String,
}

// SAFETY: the tables are immutable data of a library that stays loaded for the process; the
// functions they point to are called from any thread by NCCL itself.
unsafe impl Send for Inner {}
// SAFETY: as above; nothing here is mutated after `open`.
unsafe impl Sync for Inner {}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call on
    // this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown dlopen error".into();
    }
    // SAFETY: non-NULL, NUL-terminated (see above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn sym(handle: *mut c_void, name: &CStr) -> *const c_void {
    // SAFETY: `handle` is a live dlopen handle; `name` is NUL-terminated.
    unsafe { libc::dlsym(handle, name.as_ptr()) }.cast_const()
}

/// The file that holds `addr`, by `dladdr`.
fn file_of(addr: *const c_void) -> Option<String> {
    // SAFETY: an all-zero Dl_info is a valid value to be overwritten.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is valid storage; dladdr only reads `addr` as an address.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    Some(
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Opens the real plugin named `spec` the NCCL way (`X`, then `libnccl-net-X.so`; a path as is;
/// none: `libnccl-net.so`) and takes its newest table. `is_own` tells a table of the shim itself
/// (a `TCPX_WATCH_INNER` naming the shim would call itself forever). The error names every
/// candidate with the loader's own words.
pub fn open(spec: Option<&str>, is_own: impl Fn(*const c_void) -> bool) -> Result<Inner, String> {
    let mut reasons = Vec::new();
    for name in tcpx_ffi::candidate_names(spec) {
        let Ok(c_name) = CString::new(name.clone()) else {
            reasons.push(format!("{name:?}: contains a NUL byte"));
            continue;
        };
        // SAFETY: loading a library runs its initialisers; loading the real plugin is what the
        // user asked for with TCPX_WATCH_INNER.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            reasons.push(dlerror_text());
            continue;
        }
        let v9 = sym(handle, c"ncclNetPlugin_v9");
        let v8 = sym(handle, c"ncclNetPlugin_v8");
        let v7 = sym(handle, c"ncclNetPlugin_v7");
        let found = [v9, v8, v7].into_iter().find(|p| !p.is_null());
        let Some(table_ptr) = found else {
            return Err(format!(
                "{name} is not an NCCL net plugin: it exports none of ncclNetPlugin_v9, _v8, _v7"
            ));
        };
        if is_own(table_ptr) {
            return Err(format!(
                "{name} is this shim itself: point TCPX_WATCH_INNER at the real plugin"
            ));
        }
        // SAFETY: the symbol of that name is the plugin's table of that version, in a library
        // that is never closed, so a 'static reference to it is valid.
        let table = unsafe {
            if !v9.is_null() {
                Table::V9(&*v9.cast::<NcclNetV9>())
            } else if !v8.is_null() {
                Table::V8(&*v8.cast::<NcclNetV8>())
            } else {
                Table::V7(&*v7.cast::<NcclNetV7>())
            }
        };
        let name_ptr = match table {
            Table::V7(t) => t.name,
            Table::V8(t) => t.name,
            Table::V9(t) => t.name,
        };
        let table_name = if name_ptr.is_null() {
            String::new()
        } else {
            // SAFETY: a non-NULL table name is a NUL-terminated string of the plugin.
            unsafe { CStr::from_ptr(name_ptr) }
                .to_string_lossy()
                .into_owned()
        };
        return Ok(Inner {
            table,
            path: file_of(table_ptr).unwrap_or(name),
            name: table_name,
        });
    }
    Err(reasons.join("; "))
}

/// Calls the entry `$f` of whichever table the real plugin has, with the same arguments (the
/// entries whose types are equal in every version). A NULL entry answers `ncclInternalError`.
macro_rules! same {
    ($self:expr, $f:ident ( $($arg:expr),* )) => {
        match $self.table {
            Table::V7(t) => t.$f.map(|f| {
                // SAFETY: forwarding NCCL's own arguments to the same entry of the real plugin.
                unsafe { f($($arg),*) }
            }),
            Table::V8(t) => t.$f.map(|f| {
                // SAFETY: as above.
                unsafe { f($($arg),*) }
            }),
            Table::V9(t) => t.$f.map(|f| {
                // SAFETY: as above.
                unsafe { f($($arg),*) }
            }),
        }
        .unwrap_or(NCCL_INTERNAL_ERROR)
    };
}

/// Which optional entries the real plugin has (NULL ones are NULL in the shim's tables too, so
/// NCCL decides exactly as it would without the shim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Has {
    pub reg_mr_dma_buf: bool,
    pub iflush: bool,
    pub get_device_mr: bool,
    pub irecv_consumed: bool,
    pub make_v_device: bool,
    pub entries: [bool; 19],
}

impl Inner {
    pub fn version(&self) -> u32 {
        match self.table {
            Table::V7(_) => 7,
            Table::V8(_) => 8,
            Table::V9(_) => 9,
        }
    }

    /// Which entries are non-NULL, in table order (name excluded: 18 functions and a spare).
    pub fn has(&self) -> Has {
        macro_rules! entries {
            ($t:expr) => {
                [
                    $t.init.is_some(),
                    $t.devices.is_some(),
                    $t.get_properties.is_some(),
                    $t.listen.is_some(),
                    $t.connect.is_some(),
                    $t.accept.is_some(),
                    $t.reg_mr.is_some(),
                    $t.reg_mr_dma_buf.is_some(),
                    $t.dereg_mr.is_some(),
                    $t.isend.is_some(),
                    $t.irecv.is_some(),
                    $t.iflush.is_some(),
                    $t.test.is_some(),
                    $t.close_send.is_some(),
                    $t.close_recv.is_some(),
                    $t.close_listen.is_some(),
                    $t.get_device_mr.is_some(),
                    $t.irecv_consumed.is_some(),
                    true,
                ]
            };
        }
        let (entries, make_v_device) = match self.table {
            Table::V7(t) => (entries!(t), false),
            Table::V8(t) => (entries!(t), false),
            Table::V9(t) => (entries!(t), t.make_v_device.is_some()),
        };
        Has {
            reg_mr_dma_buf: entries[7],
            iflush: entries[11],
            get_device_mr: entries[16],
            irecv_consumed: entries[17],
            make_v_device,
            entries,
        }
    }

    pub fn init(&self, logger: NcclDebugLogger) -> NcclResult {
        same!(self, init(logger))
    }

    pub fn devices(&self, ndev: *mut c_int) -> NcclResult {
        same!(self, devices(ndev))
    }

    /// The properties of `dev` in the widest (v9) form, filled as NCCL's compatibility layer
    /// fills them for an older plugin.
    pub fn properties_v9(&self, dev: c_int) -> (NcclResult, NetPropertiesV9) {
        // SAFETY: all-zero is a valid value of these plain C structs (NULL strings, zero numbers).
        let mut out: NetPropertiesV9 = unsafe { std::mem::zeroed() };
        let code = match self.table {
            Table::V9(t) => match t.get_properties {
                // SAFETY: the plugin fills the v9 struct we own.
                Some(f) => unsafe { f(dev, &mut out) },
                None => NCCL_INTERNAL_ERROR,
            },
            Table::V8(t) => {
                // SAFETY: as above, all-zero is valid.
                let mut p: NetPropertiesV8 = unsafe { std::mem::zeroed() };
                let code = match t.get_properties {
                    // SAFETY: the plugin fills the v8 struct we own.
                    Some(f) => unsafe { f(dev, &mut p) },
                    None => NCCL_INTERNAL_ERROR,
                };
                out = widen(
                    dev,
                    Common::from_v8(&p),
                    p.reg_is_global,
                    p.net_device_type,
                    p.net_device_version,
                );
                code
            }
            Table::V7(t) => {
                // SAFETY: as above, all-zero is valid.
                let mut p: NetPropertiesV7 = unsafe { std::mem::zeroed() };
                let code = match t.get_properties {
                    // SAFETY: the plugin fills the v7 struct we own.
                    Some(f) => unsafe { f(dev, &mut p) },
                    None => NCCL_INTERNAL_ERROR,
                };
                out = widen(
                    dev,
                    Common::from_v7(&p),
                    0,
                    p.net_device_type,
                    p.net_device_version,
                );
                code
            }
        };
        (code, out)
    }

    /// `getProperties` for a v9 caller.
    pub fn get_properties_v9(&self, dev: c_int, props: *mut NetPropertiesV9) -> NcclResult {
        if let Table::V9(t) = self.table {
            return match t.get_properties {
                // SAFETY: same version: NCCL's pointer passed unchanged.
                Some(f) => unsafe { f(dev, props) },
                None => NCCL_INTERNAL_ERROR,
            };
        }
        let (code, p) = self.properties_v9(dev);
        if code == NCCL_SUCCESS && !props.is_null() {
            // SAFETY: NCCL passes storage for one v9 properties struct.
            unsafe { props.write(p) };
        }
        code
    }

    /// `getProperties` for a v8 caller.
    pub fn get_properties_v8(&self, dev: c_int, props: *mut NetPropertiesV8) -> NcclResult {
        if let Table::V8(t) = self.table {
            return match t.get_properties {
                // SAFETY: same version: NCCL's pointer passed unchanged.
                Some(f) => unsafe { f(dev, props) },
                None => NCCL_INTERNAL_ERROR,
            };
        }
        let (code, p) = self.properties_v9(dev);
        if code == NCCL_SUCCESS && !props.is_null() {
            // SAFETY: NCCL passes storage for one v8 properties struct.
            unsafe {
                props.write(NetPropertiesV8 {
                    name: p.name,
                    pci_path: p.pci_path,
                    guid: p.guid,
                    ptr_support: p.ptr_support,
                    reg_is_global: p.reg_is_global,
                    speed: p.speed,
                    port: p.port,
                    latency: p.latency,
                    max_comms: p.max_comms,
                    max_recvs: p.max_recvs,
                    net_device_type: p.net_device_type,
                    net_device_version: p.net_device_version,
                })
            };
        }
        code
    }

    /// `getProperties` for a v7 caller.
    pub fn get_properties_v7(&self, dev: c_int, props: *mut NetPropertiesV7) -> NcclResult {
        if let Table::V7(t) = self.table {
            return match t.get_properties {
                // SAFETY: same version: NCCL's pointer passed unchanged.
                Some(f) => unsafe { f(dev, props) },
                None => NCCL_INTERNAL_ERROR,
            };
        }
        let (code, p) = self.properties_v9(dev);
        if code == NCCL_SUCCESS && !props.is_null() {
            // SAFETY: NCCL passes storage for one v7 properties struct.
            unsafe {
                props.write(NetPropertiesV7 {
                    name: p.name,
                    pci_path: p.pci_path,
                    guid: p.guid,
                    ptr_support: p.ptr_support,
                    speed: p.speed,
                    port: p.port,
                    latency: p.latency,
                    max_comms: p.max_comms,
                    max_recvs: p.max_recvs,
                    net_device_type: p.net_device_type,
                    net_device_version: p.net_device_version,
                })
            };
        }
        code
    }

    pub fn listen(&self, dev: c_int, handle: *mut c_void, comm: *mut Comm) -> NcclResult {
        same!(self, listen(dev, handle, comm))
    }

    pub fn connect(
        &self,
        dev: c_int,
        handle: *mut c_void,
        comm: *mut Comm,
        dev_comm: *mut *mut NetDeviceHandle,
    ) -> NcclResult {
        same!(self, connect(dev, handle, comm, dev_comm))
    }

    pub fn accept(
        &self,
        listen: Comm,
        comm: *mut Comm,
        dev_comm: *mut *mut NetDeviceHandle,
    ) -> NcclResult {
        same!(self, accept(listen, comm, dev_comm))
    }

    /// `regMr` with the caller's size as `size_t` (a v7 caller's `int` widened losslessly).
    pub fn reg_mr(
        &self,
        comm: Comm,
        data: *mut c_void,
        size: usize,
        ptr_type: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult {
        match self.table {
            Table::V7(t) => match (t.reg_mr, c_int::try_from(size)) {
                // SAFETY: forwarding NCCL's arguments; the size fits the plugin's int.
                (Some(f), Ok(size)) => unsafe { f(comm, data, size, ptr_type, mhandle) },
                _ => NCCL_INTERNAL_ERROR,
            },
            Table::V8(t) => match t.reg_mr {
                // SAFETY: forwarding NCCL's arguments unchanged.
                Some(f) => unsafe { f(comm, data, size, ptr_type, mhandle) },
                None => NCCL_INTERNAL_ERROR,
            },
            Table::V9(t) => match t.reg_mr {
                // SAFETY: forwarding NCCL's arguments unchanged.
                Some(f) => unsafe { f(comm, data, size, ptr_type, mhandle) },
                None => NCCL_INTERNAL_ERROR,
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn reg_mr_dma_buf(
        &self,
        comm: Comm,
        data: *mut c_void,
        size: usize,
        ptr_type: c_int,
        offset: u64,
        fd: c_int,
        mhandle: *mut *mut c_void,
    ) -> NcclResult {
        same!(
            self,
            reg_mr_dma_buf(comm, data, size, ptr_type, offset, fd, mhandle)
        )
    }

    pub fn dereg_mr(&self, comm: Comm, mhandle: *mut c_void) -> NcclResult {
        same!(self, dereg_mr(comm, mhandle))
    }

    /// `isend` with the size as `size_t`; one that does not fit a v7/v8 plugin's `int` is
    /// refused with `ncclInternalError`, as NCCL's compatibility layer refuses it.
    pub fn isend(
        &self,
        comm: Comm,
        data: *mut c_void,
        size: usize,
        tag: c_int,
        mhandle: *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        match self.table {
            Table::V7(t) => match (t.isend, c_int::try_from(size)) {
                // SAFETY: forwarding NCCL's arguments; the size fits the plugin's int.
                (Some(f), Ok(size)) => unsafe { f(comm, data, size, tag, mhandle, request) },
                _ => NCCL_INTERNAL_ERROR,
            },
            Table::V8(t) => match (t.isend, c_int::try_from(size)) {
                // SAFETY: as above.
                (Some(f), Ok(size)) => unsafe { f(comm, data, size, tag, mhandle, request) },
                _ => NCCL_INTERNAL_ERROR,
            },
            Table::V9(t) => match t.isend {
                // SAFETY: forwarding NCCL's arguments unchanged.
                Some(f) => unsafe { f(comm, data, size, tag, mhandle, request) },
                None => NCCL_INTERNAL_ERROR,
            },
        }
    }

    /// `irecv` from a v7/v8 caller (`int` sizes).
    #[allow(clippy::too_many_arguments)]
    pub fn irecv_int(
        &self,
        comm: Comm,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut c_int,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        match self.table {
            Table::V7(t) => match t.irecv {
                // SAFETY: same types: NCCL's arguments passed unchanged.
                Some(f) => unsafe { f(comm, n, data, sizes, tags, mhandles, request) },
                None => NCCL_INTERNAL_ERROR,
            },
            Table::V8(t) => match t.irecv {
                // SAFETY: as above.
                Some(f) => unsafe { f(comm, n, data, sizes, tags, mhandles, request) },
                None => NCCL_INTERNAL_ERROR,
            },
            Table::V9(t) => {
                let Some(f) = t.irecv else {
                    return NCCL_INTERNAL_ERROR;
                };
                let Some(count) = grouped(n, sizes.cast_const().cast()) else {
                    return NCCL_INVALID_ARGUMENT;
                };
                let mut wide = [0usize; MAX_GROUPED];
                for (i, w) in wide.iter_mut().enumerate().take(count) {
                    // SAFETY: NCCL passes `n` sizes; i < n.
                    *w = usize::try_from(unsafe { *sizes.add(i) }).unwrap_or(0);
                }
                // SAFETY: NCCL's arguments, sizes as the plugin's size_t copy of them.
                unsafe { f(comm, n, data, wide.as_mut_ptr(), tags, mhandles, request) }
            }
        }
    }

    /// `irecv` from a v9 caller (`size_t` sizes).
    #[allow(clippy::too_many_arguments)]
    pub fn irecv_usize(
        &self,
        comm: Comm,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut usize,
        tags: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        let narrow = |f: unsafe extern "C" fn(
            Comm,
            c_int,
            *mut *mut c_void,
            *mut c_int,
            *mut c_int,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> NcclResult| {
            let Some(count) = grouped(n, sizes.cast_const().cast()) else {
                return NCCL_INVALID_ARGUMENT;
            };
            let mut small = [0 as c_int; MAX_GROUPED];
            for (i, s) in small.iter_mut().enumerate().take(count) {
                // SAFETY: NCCL passes `n` sizes; i < n.
                match c_int::try_from(unsafe { *sizes.add(i) }) {
                    Ok(v) => *s = v,
                    Err(_) => return NCCL_INTERNAL_ERROR,
                }
            }
            // SAFETY: NCCL's arguments, sizes as the plugin's int copy of them.
            unsafe { f(comm, n, data, small.as_mut_ptr(), tags, mhandles, request) }
        };
        match self.table {
            Table::V7(t) => t.irecv.map_or(NCCL_INTERNAL_ERROR, narrow),
            Table::V8(t) => t.irecv.map_or(NCCL_INTERNAL_ERROR, narrow),
            Table::V9(t) => match t.irecv {
                // SAFETY: same types: NCCL's arguments passed unchanged.
                Some(f) => unsafe { f(comm, n, data, sizes, tags, mhandles, request) },
                None => NCCL_INTERNAL_ERROR,
            },
        }
    }

    pub fn iflush(
        &self,
        comm: Comm,
        n: c_int,
        data: *mut *mut c_void,
        sizes: *mut c_int,
        mhandles: *mut *mut c_void,
        request: *mut *mut c_void,
    ) -> NcclResult {
        same!(self, iflush(comm, n, data, sizes, mhandles, request))
    }

    pub fn test(&self, request: *mut c_void, done: *mut c_int, sizes: *mut c_int) -> NcclResult {
        same!(self, test(request, done, sizes))
    }

    pub fn close_send(&self, comm: Comm) -> NcclResult {
        same!(self, close_send(comm))
    }

    pub fn close_recv(&self, comm: Comm) -> NcclResult {
        same!(self, close_recv(comm))
    }

    pub fn close_listen(&self, comm: Comm) -> NcclResult {
        same!(self, close_listen(comm))
    }

    pub fn get_device_mr(
        &self,
        comm: Comm,
        mhandle: *mut c_void,
        dptr_mhandle: *mut *mut c_void,
    ) -> NcclResult {
        same!(self, get_device_mr(comm, mhandle, dptr_mhandle))
    }

    pub fn irecv_consumed(&self, comm: Comm, n: c_int, request: *mut c_void) -> NcclResult {
        same!(self, irecv_consumed(comm, n, request))
    }

    /// `makeVDevice` for a v9 caller: the real plugin's own where it has one; for an older
    /// plugin, a virtual device of one physical device is that device (what NCCL's compatibility
    /// layer amounts to: no merging), anything else is refused with `ncclInvalidUsage`.
    pub fn make_v_device(&self, d: *mut c_int, props: *mut NetVDeviceProps) -> NcclResult {
        if let Table::V9(t) = self.table {
            return match t.make_v_device {
                // SAFETY: same version: NCCL's arguments passed unchanged.
                Some(f) => unsafe { f(d, props) },
                None => NCCL_INTERNAL_ERROR,
            };
        }
        if d.is_null() || props.is_null() {
            return NCCL_INVALID_ARGUMENT;
        }
        // SAFETY: NCCL passes one virtual-device description and an int to fill.
        unsafe {
            let p = &*props;
            if p.ndevs != 1 {
                return NCCL_INVALID_USAGE;
            }
            *d = p.devs[0];
        }
        NCCL_SUCCESS
    }
}

/// The number of grouped receives, when `n` is one the shim can convert sizes for.
fn grouped(n: c_int, sizes: *const c_void) -> Option<usize> {
    let count = usize::try_from(n).ok()?;
    (count <= MAX_GROUPED && (count == 0 || !sizes.is_null())).then_some(count)
}

/// The fields v7, v8 and v9 properties share.
struct Common {
    name: *mut c_char,
    pci_path: *mut c_char,
    guid: u64,
    ptr_support: c_int,
    speed: c_int,
    port: c_int,
    latency: f32,
    max_comms: c_int,
    max_recvs: c_int,
}

impl Common {
    fn from_v7(p: &NetPropertiesV7) -> Common {
        Common {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
        }
    }

    fn from_v8(p: &NetPropertiesV8) -> Common {
        Common {
            name: p.name,
            pci_path: p.pci_path,
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed,
            port: p.port,
            latency: p.latency,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
        }
    }
}

/// v7/v8 properties as NCCL's compatibility layer presents them in v9 form.
fn widen(
    dev: c_int,
    c: Common,
    reg_is_global: c_int,
    net_device_type: c_int,
    net_device_version: c_int,
) -> NetPropertiesV9 {
    NetPropertiesV9 {
        name: c.name,
        pci_path: c.pci_path,
        guid: c.guid,
        ptr_support: c.ptr_support,
        reg_is_global,
        force_flush: 0,
        speed: c.speed,
        port: c.port,
        latency: c.latency,
        max_comms: c.max_comms,
        max_recvs: c.max_recvs,
        net_device_type,
        net_device_version,
        v_props: NetVDeviceProps {
            ndevs: 1,
            devs: [dev, 0, 0, 0],
        },
        max_p2p_bytes: MAX_NET_SIZE,
        max_coll_bytes: MAX_COLLNET_SIZE,
    }
}
