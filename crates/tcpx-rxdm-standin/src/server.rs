//! The Unix-socket driver of [`Rxdm`]: one listener per [`Endpoint`] under a prefix directory,
//! one thread per connection reading frames and writing answers, every record also appended as a
//! JSON line to an optional file (so a run that is killed keeps what it saw).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::proto::{frame, FrameDecoder};
use crate::{Endpoint, Mode, Record, Rxdm};

/// How long a connection may stay silent before the stand-in drops it (the plugin sends its
/// request right after connecting and reads the answer at once).
pub const IDLE: Duration = Duration::from_secs(30);

struct Shared {
    rxdm: Mutex<Rxdm>,
    log: Option<Mutex<File>>,
    stop: AtomicBool,
}

/// A running stand-in; [`Server::stop`] (or drop) closes it and removes its socket files.
pub struct Server {
    prefix: PathBuf,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Binds `rx_rule_manager`, `rx_rule_uninstall` and `rxdm_application_registry` under
    /// `prefix` (which must exist; stale sockets of a dead stand-in are replaced) and serves them.
    /// With `record`, each record is also appended to that file as one JSON line.
    pub fn start(prefix: &Path, mode: Mode, record: Option<&Path>) -> io::Result<Server> {
        let log = match record {
            Some(p) => Some(Mutex::new(
                File::options()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| annotate(e, format!("opening the record file {}", p.display())))?,
            )),
            None => None,
        };
        let shared = Arc::new(Shared {
            rxdm: Mutex::new(Rxdm::new(mode)),
            log,
            stop: AtomicBool::new(false),
        });
        let mut server = Server {
            prefix: prefix.to_path_buf(),
            shared,
            threads: Vec::new(),
        };
        for endpoint in Endpoint::ALL {
            let path = prefix.join(endpoint.file_name());
            if std::fs::symlink_metadata(&path).is_ok() {
                // Only replace a socket: refuse to delete anything else.
                use std::os::unix::fs::FileTypeExt;
                let meta = std::fs::symlink_metadata(&path)?;
                if !meta.file_type().is_socket() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} exists and is not a socket", path.display()),
                    ));
                }
                std::fs::remove_file(&path)?;
            }
            let listener = UnixListener::bind(&path).map_err(|e| {
                annotate(
                    e,
                    format!(
                        "binding {} (does the directory exist and is it writable?)",
                        path.display()
                    ),
                )
            })?;
            let shared = Arc::clone(&server.shared);
            server.threads.push(std::thread::spawn(move || {
                serve(listener, endpoint, shared)
            }));
        }
        Ok(server)
    }

    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// Every request served so far, in arrival order.
    pub fn records(&self) -> Vec<Record> {
        lock(&self.shared.rxdm).records().to_vec()
    }

    /// Stops accepting, waits for the listener threads and removes the socket files. Connections
    /// in progress finish on their own threads (each ends within [`IDLE`]).
    pub fn stop(&mut self) {
        if self.shared.stop.swap(true, Ordering::SeqCst) {
            return;
        }
        for endpoint in Endpoint::ALL {
            // Wakes the blocking accept, which then sees the stop flag.
            let _ = UnixStream::connect(self.prefix.join(endpoint.file_name()));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for endpoint in Endpoint::ALL {
            let _ = std::fs::remove_file(self.prefix.join(endpoint.file_name()));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn annotate(e: io::Error, what: String) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn serve(listener: UnixListener, endpoint: Endpoint, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok(stream) => {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    if let Err(e) = connection(stream, endpoint, &shared) {
                        eprintln!(
                            "tcpx-rxdm-standin: {} connection: {e}",
                            endpoint.file_name()
                        );
                    }
                });
            }
            Err(e) => eprintln!("tcpx-rxdm-standin: accept on {}: {e}", endpoint.file_name()),
        }
    }
}

/// Serves one client until it closes: the rule clients send one request per connection, the
/// registry client two (register, later deregister) on one.
fn connection(mut stream: UnixStream, endpoint: Endpoint, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(IDLE))?;
    stream.set_write_timeout(Some(IDLE))?;
    let mut decoder = FrameDecoder::default();
    let mut buf = [0u8; 4096];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if shared.stop.load(Ordering::SeqCst) => {
                let _ = e;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        decoder.push(&buf[..n]);
        while let Some(message) = decoder.next_frame() {
            let (answer, record) = lock(&shared.rxdm).handle(endpoint, &message);
            if let Some(log) = &shared.log {
                let line = serde_json::to_string(&record).map_err(io::Error::other)?;
                writeln!(lock(log), "{line}")?;
            }
            let framed = frame(&answer).map_err(io::Error::other)?;
            stream.write_all(&framed)?;
        }
    }
}
