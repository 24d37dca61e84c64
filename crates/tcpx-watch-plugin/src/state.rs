//! The shim's process-wide state: the real plugin (loaded when the shim is loaded, so that the
//! shim's tables can carry the real plugin's name before NCCL reads it), what `init` set up,
//! the writer thread and the exit flush.

use std::ffi::{c_char, c_int, c_ulong, c_void, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tcpx_ffi::abi::*;

use crate::config::Config;
use crate::inner::{self, Inner};
use crate::output::{self, DeviceInfo, LinesFile, StartInfo};
use crate::recorder::{ConnEvent, Dir, ErrorEvent, Recorder, Tracked};

/// NCCL's `INIT | NET` log subsystems: the shim's lines show with NCCL's default
/// `NCCL_DEBUG_SUBSYS` (which has INIT, not NET) and with NET alone.
const NCCL_NET_FLAG: c_ulong = 0x01 | 0x10;
/// Devices described in the `start` line (a NIC table longer than this is cut).
const MAX_DEVICES: c_int = 64;
/// How long the exit flush waits for the writer thread's lock before giving up.
const EXIT_FLUSH_WAIT: Duration = Duration::from_secs(1);

/// The process's shim, set by the first successful `init`.
pub struct Shim {
    pub inner: &'static Inner,
    pub logger: NcclDebugLogger,
    pub recording: Option<Recording>,
}

/// Everything a recording shim has beyond the real plugin.
pub struct Recording {
    pub rec: Recorder,
    pub devices: Vec<DeviceInfo>,
    /// The real plugin has `irecvConsumed`: NCCL hands every receive back through it, so a
    /// receive's slot is held until then.
    pub hold_recv: bool,
    pub pid: u32,
    out: Mutex<Out>,
    finished: AtomicBool,
    wake: (Mutex<bool>, Condvar),
    interval: Duration,
}

struct Out {
    lines: Option<LinesFile>,
    prom: Option<PathBuf>,
    last_t: f64,
}

/// A comm as NCCL holds it while the shim records: the real plugin's comm and the shim's
/// counters for it.
pub struct ShimComm {
    magic: u64,
    pub inner: *mut c_void,
    pub id: u64,
    pub dev: c_int,
    pub link: u64,
    pub tracked: Option<Tracked>,
    pub hint: std::sync::atomic::AtomicU32,
}

/// A listen comm as NCCL holds it while the shim records.
pub struct ShimListen {
    magic: u64,
    pub inner: *mut c_void,
    pub dev: c_int,
    pub link: u64,
    /// Nanoseconds since init (+1) of the first `accept` call still waiting for its comm; 0: none.
    pub accept_start: std::sync::atomic::AtomicU64,
}

const COMM_MAGIC: u64 = 0x7463_7078_7761_7463; // "tcpxwatc"
const LISTEN_MAGIC: u64 = 0x7463_7078_6c69_7374; // "tcpxlist"

static SHIM: OnceLock<Shim> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

pub fn shim() -> Option<&'static Shim> {
    SHIM.get()
}

/// Sends one line to NCCL's logger (`NET/tcpxwatch : ...`).
pub fn log(logger: NcclDebugLogger, level: c_int, msg: &str) {
    let Some(logger) = logger else { return };
    let Ok(msg) = CString::new(format!("NET/tcpxwatch : {msg}").replace('\0', " ")) else {
        return;
    };
    // SAFETY: NCCL's logger with a "%s" format and one NUL-terminated string argument.
    unsafe {
        logger(
            level,
            NCCL_NET_FLAG,
            c"tcpx-watch-plugin".as_ptr(),
            line!() as c_int,
            c"%s".as_ptr(),
            msg.as_ptr(),
        )
    };
}

/// The real plugin, loaded once (at the shim's load when `TCPX_WATCH_INNER` is already set,
/// else at `init`); the error names what was tried and the loader's words.
pub fn load_inner(is_own: impl Fn(*const c_void) -> bool) -> Result<&'static Inner, String> {
    static INNER: OnceLock<&'static Inner> = OnceLock::new();
    static LOAD: Mutex<()> = Mutex::new(());
    if let Some(i) = INNER.get() {
        return Ok(i);
    }
    let _g = LOAD.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(i) = INNER.get() {
        return Ok(i);
    }
    let spec = std::env::var("TCPX_WATCH_INNER")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let opened = inner::open(spec.as_deref(), is_own).map_err(|why| {
        format!(
            "cannot load the real plugin TCPX_WATCH_INNER={}: {why}; check the path, \
             TCPX_WATCH_INNER and LD_LIBRARY_PATH",
            spec.as_deref().unwrap_or("(unset: libnccl-net.so)")
        )
    })?;
    let leaked: &'static Inner = Box::leak(Box::new(opened));
    let _ = INNER.set(leaked);
    Ok(leaked)
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast::<c_char>(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the plugin's property strings are NUL-terminated and live as long as the plugin.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// The real plugin's devices, asked once at init (as NCCL asks right after init).
fn devices(inner: &Inner) -> Vec<DeviceInfo> {
    let mut n: c_int = 0;
    if inner.devices(&mut n) != NCCL_SUCCESS {
        return Vec::new();
    }
    (0..n.clamp(0, MAX_DEVICES))
        .map(|dev| {
            let (code, p) = inner.properties_v9(dev);
            if code != NCCL_SUCCESS {
                return DeviceInfo {
                    dev,
                    name: String::new(),
                    pci_path: String::new(),
                    speed_mbps: 0,
                    max_comms: 0,
                    unpack: false,
                };
            }
            DeviceInfo {
                dev,
                name: cstr(p.name),
                pci_path: cstr(p.pci_path),
                speed_mbps: i64::from(p.speed),
                max_comms: i64::from(p.max_comms),
                unpack: p.net_device_type == NCCL_NET_DEVICE_UNPACK,
            }
        })
        .collect()
}

/// `init` of any version: loads the real plugin if the shim's load could not, calls its `init`
/// with NCCL's logger, mirrors its NULL entries into the shim's tables (`null_entries`) and
/// starts recording when `TCPX_WATCH_DIR` is set.
pub fn init(
    api: u32,
    logger: NcclDebugLogger,
    is_own: impl Fn(*const c_void) -> bool,
    null_entries: impl FnOnce(&inner::Has),
) -> NcclResult {
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = SHIM.get() {
        // A second init goes to the real plugin, as it would without the shim.
        return s.inner.init(logger);
    }
    let inner = match load_inner(is_own) {
        Ok(i) => i,
        Err(why) => {
            log(logger, NCCL_LOG_WARN, &why);
            return NCCL_SYSTEM_ERROR;
        }
    };
    let code = inner.init(logger);
    if code != NCCL_SUCCESS {
        return code;
    }
    null_entries(&inner.has());
    let (cfg, warnings) = Config::from_lookup(|k| std::env::var(k).ok());
    for w in &warnings {
        log(logger, NCCL_LOG_WARN, w);
    }
    let recording = if cfg.records() {
        start_recording(api, inner, &cfg, logger)
    } else {
        None
    };
    let what = match &recording {
        Some(r) => {
            let out = r.out.lock().unwrap_or_else(|p| p.into_inner());
            format!(
                "recording to {} every {} ms",
                out.lines
                    .as_ref()
                    .map_or(String::new(), |l| l.path().display().to_string()),
                cfg.interval_ms
            )
        }
        None => "passing calls through only (TCPX_WATCH_DIR unset or unusable)".into(),
    };
    log(
        logger,
        NCCL_LOG_INFO,
        &format!(
            "wrapping {} ({}, net API v{}) for a v{api} caller; {what}",
            inner.path,
            inner.name,
            inner.version()
        ),
    );
    let recording_now = recording.is_some();
    let _ = SHIM.set(Shim {
        inner,
        logger,
        recording,
    });
    if recording_now {
        start_writer(logger);
    }
    code
}

fn start_recording(
    api: u32,
    inner: &'static Inner,
    cfg: &Config,
    logger: NcclDebugLogger,
) -> Option<Recording> {
    let dir = cfg.dir.as_ref()?;
    let rec = Recorder::new();
    let devices = devices(inner);
    let unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let pid = std::process::id();
    let start = StartInfo {
        unix_s,
        host: host_name(),
        pid,
        inner: inner.path.clone(),
        inner_name: inner.name.clone(),
        inner_api: inner.version(),
        api,
        devices: devices.clone(),
    };
    let lines = match LinesFile::create(dir, &start, cfg.max_bytes) {
        Ok(l) => l,
        Err(why) => {
            log(
                logger,
                NCCL_LOG_WARN,
                &format!("{why}; the shim passes calls through without recording"),
            );
            return None;
        }
    };
    Some(Recording {
        rec,
        devices,
        hold_recv: inner.has().irecv_consumed,
        pid,
        out: Mutex::new(Out {
            lines: Some(lines),
            prom: cfg.prom.as_ref().map(|p| output::prom_path(p, pid)),
            last_t: 0.0,
        }),
        finished: AtomicBool::new(false),
        wake: (Mutex::new(false), Condvar::new()),
        interval: Duration::from_millis(cfg.interval_ms),
    })
}

fn start_writer(logger: NcclDebugLogger) {
    let spawned = std::thread::Builder::new()
        .name("tcpx-watch-writer".into())
        .spawn(|| {
            let Some(r) = SHIM.get().and_then(|s| s.recording.as_ref()) else {
                return;
            };
            loop {
                let (lock, cv) = &r.wake;
                let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                let (stop, _) = cv
                    .wait_timeout_while(guard, r.interval, |stop| !*stop)
                    .unwrap_or_else(|p| p.into_inner());
                if *stop || r.finished.load(Ordering::Acquire) {
                    return;
                }
                drop(stop);
                r.flush(false);
            }
        });
    if let Err(e) = spawned {
        log(
            logger,
            NCCL_LOG_WARN,
            &format!("cannot start the writer thread: {e}; only the exit flush writes"),
        );
    }
    // SAFETY: `at_exit` is an `extern "C" fn()` that lives as long as the process (this library
    // is never unloaded: NCCL does not close net plugins).
    if unsafe { libc::atexit(at_exit) } != 0 {
        log(
            logger,
            NCCL_LOG_WARN,
            "cannot register the exit flush: the last interval may be missing",
        );
    }
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(r) = SHIM.get().and_then(|s| s.recording.as_ref()) else {
            return;
        };
        // A forked child (a data loader worker) shares the file but is not the job's process.
        if std::process::id() != r.pid {
            return;
        }
        finish(r);
    });
}

/// Writes the last interval and the `end` line once, and stops the writer thread.
pub fn finish(r: &Recording) {
    if r.finished.swap(true, Ordering::AcqRel) {
        return;
    }
    {
        let (lock, cv) = &r.wake;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }
    r.flush(true);
}

impl Recording {
    /// Writes the queued events and an interval line (and `end` when `last`), then the
    /// Prometheus textfile. At exit the lock is waited for at most [`EXIT_FLUSH_WAIT`].
    fn flush(&self, last: bool) {
        let mut out = if last {
            let deadline = Instant::now() + EXIT_FLUSH_WAIT;
            loop {
                match self.out.try_lock() {
                    Ok(g) => break g,
                    Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(std::sync::TryLockError::WouldBlock) => return,
                }
            }
        } else {
            self.out.lock().unwrap_or_else(|p| p.into_inner())
        };
        let t = self.rec.now_s();
        let dt = t - out.last_t;
        out.last_t = t;
        let (conns, errors) = self.rec.take_events();
        let mut problem = None;
        if let Some(lines) = out.lines.as_mut() {
            let budget = lines.line_budget();
            let mut write = |line: String| {
                if problem.is_none() {
                    if let Err(e) = lines.write_line(&line) {
                        problem = Some(e);
                    }
                }
            };
            for e in &conns {
                write(output::conn_line(e));
            }
            for e in &errors {
                write(output::error_line(e));
            }
            write(output::interval_line(&self.rec, t, dt, budget));
            if last {
                write(output::end_line(t));
            }
        }
        if let Some(why) = problem {
            out.lines = None;
            if let Some(s) = SHIM.get() {
                log(
                    s.logger,
                    NCCL_LOG_WARN,
                    &format!("{why}; no more JSON lines are written"),
                );
            }
        }
        if let Some(path) = out.prom.clone() {
            let text = output::prom_text(&self.rec, &self.devices, self.pid);
            if let Err(why) = output::write_replacing(&path, &text, self.pid) {
                out.prom = None;
                if let Some(s) = SHIM.get() {
                    log(
                        s.logger,
                        NCCL_LOG_WARN,
                        &format!("{why}; the Prometheus textfile is no longer written"),
                    );
                }
            }
        }
    }

    /// Wraps a new comm of the real plugin.
    pub fn new_comm(&self, dir: Dir, dev: c_int, link: u64, inner: *mut c_void) -> *mut ShimComm {
        let (id, tracked) = self.rec.new_comm(dir, dev, link);
        Box::into_raw(Box::new(ShimComm {
            magic: COMM_MAGIC,
            inner,
            id,
            dev,
            link,
            tracked,
            hint: std::sync::atomic::AtomicU32::new(0),
        }))
    }

    /// Wraps a new listen comm of the real plugin.
    pub fn new_listen(&self, dev: c_int, link: u64, inner: *mut c_void) -> *mut ShimListen {
        Box::into_raw(Box::new(ShimListen {
            magic: LISTEN_MAGIC,
            inner,
            dev,
            link,
            accept_start: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// Records an error the real plugin returned from `call`.
    pub fn error(
        &self,
        comm: Option<&ShimComm>,
        dev: Option<c_int>,
        call: &'static str,
        code: NcclResult,
    ) {
        if let Some(t) = comm.and_then(|c| c.tracked.as_ref()) {
            t.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.rec.error_event(ErrorEvent {
            t: self.rec.now_s(),
            comm: comm.map(|c| c.id),
            dev: comm.map(|c| c.dev).or(dev),
            link: comm.map(|c| c.link),
            call,
            code,
        });
    }

    /// Records a set-up call that finished.
    #[allow(clippy::too_many_arguments)]
    pub fn conn(
        &self,
        call: &'static str,
        comm: Option<&ShimComm>,
        dir: Option<Dir>,
        dev: c_int,
        link: u64,
        took_ns: u64,
        code: NcclResult,
    ) {
        self.rec.conn_event(ConnEvent {
            t: self.rec.now_s(),
            comm: comm.map_or(0, |c| c.id),
            dir,
            dev,
            link,
            call,
            took_s: Recorder::secs(took_ns),
            ok: code == NCCL_SUCCESS,
            code,
        });
    }
}

/// The shim comm NCCL passed, `None` for NULL (passed on as NULL); a pointer that is not one
/// of the shim's is refused.
///
/// # Safety
/// `p` is NULL or a comm pointer this shim handed to NCCL and NCCL has not closed.
pub unsafe fn comm_of<'a>(p: *mut c_void) -> Result<Option<&'a ShimComm>, NcclResult> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: by the caller's contract `p` is a live ShimComm.
    let c = unsafe { &*p.cast::<ShimComm>() };
    if c.magic != COMM_MAGIC {
        return Err(NCCL_INVALID_ARGUMENT);
    }
    Ok(Some(c))
}

/// The shim listen comm NCCL passed (see [`comm_of`]).
///
/// # Safety
/// `p` is NULL or a listen comm pointer this shim handed to NCCL and NCCL has not closed.
pub unsafe fn listen_of<'a>(p: *mut c_void) -> Result<Option<&'a ShimListen>, NcclResult> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: by the caller's contract `p` is a live ShimListen.
    let l = unsafe { &*p.cast::<ShimListen>() };
    if l.magic != LISTEN_MAGIC {
        return Err(NCCL_INVALID_ARGUMENT);
    }
    Ok(Some(l))
}

/// Flushes now (for this crate's in-process tests, which cannot wait for the process's exit).
pub fn flush_now() {
    if let Some(r) = SHIM.get().and_then(|s| s.recording.as_ref()) {
        r.flush(false);
    }
}
