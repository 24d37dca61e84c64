//! IRQ affinity policies: plan (what would change), apply (backup first, write, read back and
//! verify, roll back on failure), reset (restore from the backup), and a guard that restores on
//! drop, on panic unwinding and on Ctrl-C / SIGTERM.
//!
//! All file access goes through a [`SysRoot`], so the same code runs on fixture trees.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use tcpx_topo::{BindingSpec, CpuSet, SysRoot};

use crate::interrupts::Interrupts;
use crate::irqmap::{map_queue_irqs, Direction, QueueIrq};

/// Where the backup lives, relative to the root (a fixture root keeps its own).
pub const DEFAULT_BACKUP: &str = "/run/tcpx-lab/irq-backup.json";

#[derive(Debug, thiserror::Error)]
pub enum IrqError {
    #[error("writing IRQ affinity needs root (euid 0); this process runs as uid {euid}. Re-run with sudo, or use `plan` to only look")]
    NotRoot { euid: u32 },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{path}: {why}")]
    Malformed { path: String, why: String },
    #[error("a backup already exists at {path} (pid {pid}); restore it first: {restore}")]
    BackupExists {
        path: String,
        pid: u32,
        restore: String,
    },
    #[error("no backup at {path}: nothing to restore (was the policy applied with this --root/--backup?)")]
    NoBackup { path: String },
    #[error("IRQ {irq}: writing {mask} to {path} failed: {error}; {rollback}")]
    WriteFailed {
        irq: u32,
        path: String,
        mask: String,
        error: String,
        rollback: String,
    },
    #[error("IRQ {irq}: read back {actual} after writing {expected}; {rollback}")]
    VerifyFailed {
        irq: u32,
        expected: String,
        actual: String,
        rollback: String,
    },
    #[error("restore incomplete: {failures:?}; the backup stays at {backup}")]
    RestoreIncomplete {
        failures: Vec<String>,
        backup: String,
    },
    #[error("the backup at {path} was written for {recorded}, not {here}: nothing was restored and the backup stays. Reset on that machine with that --root, or move the backup away if it is obsolete")]
    BackupMismatch {
        path: String,
        recorded: String,
        here: String,
    },
    #[error("{doing} {path}: {error}{hint}")]
    File {
        doing: &'static str,
        path: String,
        error: std::io::Error,
        hint: String,
    },
}

/// An IO error on `path` with what was being done and, for a permission error of a process
/// that is not root, the hint that writing IRQ state needs root.
fn file_error(doing: &'static str, path: &Path, error: std::io::Error) -> IrqError {
    let euid = nix::unistd::geteuid().as_raw();
    let hint = match error.kind() {
        std::io::ErrorKind::PermissionDenied if euid != 0 => format!(
            " (this process runs as uid {euid}: writing IRQ state and its backup needs root; re-run with sudo)"
        ),
        std::io::ErrorKind::StorageFull => {
            " (the file system is full: free space or give --backup elsewhere)".into()
        }
        _ => String::new(),
    };
    IrqError::File {
        doing,
        path: path.display().to_string(),
        error,
        hint,
    }
}

/// Backup files larger than this are refused (one holds a line per changed IRQ).
pub const MAX_BACKUP_BYTES: u64 = 16 << 20;

/// The name of the machine this runs on (`/proc/sys/kernel/hostname`), recorded in a backup.
fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `root` as a backup records it: canonical where it exists.
fn root_text(root: &SysRoot) -> String {
    std::fs::canonicalize(root.root())
        .unwrap_or_else(|_| root.root().to_path_buf())
        .display()
        .to_string()
}

/// How a NIC's IRQs spread over its cpu set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Spread {
    /// Queue q's IRQ goes to the q-th CPU of the set (wrapping): one CPU per queue, so a busy
    /// queue's softirq work cannot wander and queues do not pile onto one CPU.
    #[default]
    OnePerQueue,
    /// Every IRQ may go to any CPU of the set (the kernel picks the effective one).
    WholeSet,
}

/// Where each NIC's TX and RX queue IRQs should go. Combined (TxRx) vectors get the union of both
/// sets; control vectors are left alone; NICs absent from both specs are left alone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqPolicy {
    pub tx: BindingSpec,
    pub rx: BindingSpec,
    pub spread: Spread,
}

/// One IRQ in a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IrqChange {
    pub irq: u32,
    pub nic: String,
    pub queue: Option<u32>,
    pub direction: Direction,
    pub current: CpuSet,
    pub target: CpuSet,
}

impl IrqChange {
    pub fn changes(&self) -> bool {
        self.current != self.target
    }
}

/// What a policy would do on one root.
#[derive(Debug, Clone, Serialize)]
pub struct IrqPlan {
    #[serde(skip)]
    pub root: SysRoot,
    /// Width of the masks written (possible CPUs).
    pub nr_cpus: u32,
    pub changes: Vec<IrqChange>,
    /// NIC IRQs the policy does not touch, with the reason.
    pub untouched: Vec<String>,
}

/// The backup file: the exact text each `smp_affinity` held before we wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backup {
    pub tool: String,
    pub pid: u32,
    pub created_unix_s: u64,
    /// The root (`/` or a fixture tree) the IRQs were changed under, canonical.
    pub root: String,
    /// The machine they were changed on (empty in backups of earlier versions).
    #[serde(default)]
    pub host: String,
    pub entries: Vec<BackupEntry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupEntry {
    pub irq: u32,
    pub smp_affinity: String,
}

fn affinity_path(irq: u32) -> String {
    format!("/proc/irq/{irq}/smp_affinity")
}

fn read_mask(root: &SysRoot, irq: u32) -> Result<(String, CpuSet), IrqError> {
    let rel = affinity_path(irq);
    let text = root.read(&rel)?.trim().to_string();
    let set = CpuSet::parse_mask(&text).map_err(|e| IrqError::Malformed {
        path: root.path(&rel).display().to_string(),
        why: e.to_string(),
    })?;
    Ok((text, set))
}

fn write_mask(root: &SysRoot, irq: u32, text: &str) -> Result<(), String> {
    let path = root.path(affinity_path(irq));
    // One write(2) of the whole mask: /proc parses each write separately.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("open: {e}"))?;
    f.write_all(format!("{text}\n").as_bytes())
        .map_err(|e| format!("write: {e}"))
}

fn online_cpus(root: &SysRoot) -> Option<CpuSet> {
    root.read_opt("/sys/devices/system/cpu/online")
        .and_then(|s| CpuSet::parse_list(&s).ok())
}

fn nr_possible(root: &SysRoot) -> u32 {
    root.read_opt("/sys/devices/system/cpu/possible")
        .and_then(|s| CpuSet::parse_list(&s).ok())
        .and_then(|s| s.last())
        .map_or(1, |m| m + 1)
}

fn restore_command(root: &SysRoot, backup: &Path) -> String {
    if root.is_live() {
        format!("sudo tcpx-run irq reset --yes --backup {}", sh(backup))
    } else {
        format!(
            "tcpx-run irq reset --yes --root {} --backup {}",
            sh(root.root()),
            sh(backup)
        )
    }
}

/// A path as one shell word for a printed command ([`tcpx_topo::text::shell_arg`]).
fn sh(path: &Path) -> String {
    tcpx_topo::text::shell_arg(&path.display().to_string())
}

/// The default backup path under a root.
pub fn default_backup_path(root: &SysRoot) -> PathBuf {
    root.path(DEFAULT_BACKUP)
}

/// Refuse to write the live system's IRQ settings without root.
pub fn check_privilege(root: &SysRoot, euid: u32) -> Result<(), IrqError> {
    if root.is_live() && euid != 0 {
        return Err(IrqError::NotRoot { euid });
    }
    Ok(())
}

/// The NIC queue IRQs under a root.
pub fn queue_irqs(root: &SysRoot) -> Result<(Interrupts, Vec<QueueIrq>), IrqError> {
    let text = root.read("/proc/interrupts")?;
    let parsed = Interrupts::parse(&text).map_err(|e| IrqError::Malformed {
        path: root.path("/proc/interrupts").display().to_string(),
        why: e.to_string(),
    })?;
    let queues = map_queue_irqs(&parsed, root);
    Ok((parsed, queues))
}

impl IrqPolicy {
    /// Compute what would change; reads, never writes.
    pub fn plan(&self, root: &SysRoot) -> Result<IrqPlan, IrqError> {
        let (_, queues) = queue_irqs(root)?;
        let online = online_cpus(root);
        let mut changes = Vec::new();
        let mut untouched = Vec::new();
        for q in queues {
            let set = match q.direction {
                Direction::Control => {
                    untouched.push(format!(
                        "IRQ {} ({} {}): control vector",
                        q.irq, q.nic, q.name
                    ));
                    continue;
                }
                Direction::Tx => self.tx.get(&q.nic).cloned(),
                Direction::Rx => self.rx.get(&q.nic).cloned(),
                Direction::Combined => match (self.tx.get(&q.nic), self.rx.get(&q.nic)) {
                    (Some(a), Some(b)) => Some(a.union(b)),
                    (a, b) => a.or(b).cloned(),
                },
            };
            let Some(mut set) = set else {
                untouched.push(format!(
                    "IRQ {} ({} {}): NIC not in the policy",
                    q.irq, q.nic, q.direction
                ));
                continue;
            };
            if let Some(online) = &online {
                let usable = set.intersection(online);
                if usable.is_empty() {
                    untouched.push(format!(
                        "IRQ {} ({}): none of cpus {set} is online ({online})",
                        q.irq, q.nic
                    ));
                    continue;
                }
                set = usable;
            }
            let target = match (self.spread, q.queue) {
                (Spread::OnePerQueue, Some(n)) => {
                    let cpus: Vec<u32> = set.iter().collect();
                    [cpus[n as usize % cpus.len()]].into_iter().collect()
                }
                _ => set,
            };
            let (_, current) = read_mask(root, q.irq)?;
            changes.push(IrqChange {
                irq: q.irq,
                nic: q.nic,
                queue: q.queue,
                direction: q.direction,
                current,
                target,
            });
        }
        Ok(IrqPlan {
            root: root.clone(),
            nr_cpus: nr_possible(root),
            changes,
            untouched,
        })
    }
}

/// Outcome of a successful apply.
#[derive(Debug, Clone, Serialize)]
pub struct Applied {
    pub backup: PathBuf,
    pub written: Vec<u32>,
}

impl IrqPlan {
    /// IRQs whose mask would change.
    pub fn pending(&self) -> impl Iterator<Item = &IrqChange> {
        self.changes.iter().filter(|c| c.changes())
    }

    /// A human-readable table.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "{:>5}  {:<8} {:>5}  {:<4}  {:<24} {:<24} {}\n",
            "IRQ", "NIC", "queue", "dir", "current", "target", "change"
        );
        for c in &self.changes {
            out.push_str(&format!(
                "{:>5}  {:<8} {:>5}  {:<4}  {:<24} {:<24} {}\n",
                c.irq,
                c.nic,
                c.queue.map_or("-".into(), |q| q.to_string()),
                c.direction.to_string(),
                c.current.to_string(),
                c.target.to_string(),
                if c.changes() { "yes" } else { "no" }
            ));
        }
        out
    }

    /// IRQs whose mask on the system differs from the target (only online CPUs compared: the
    /// kernel may drop offline ones).
    pub fn verify(&self) -> Result<Vec<(u32, CpuSet, CpuSet)>, IrqError> {
        let online = online_cpus(&self.root);
        let norm = |s: &CpuSet| online.as_ref().map_or(s.clone(), |o| s.intersection(o));
        let mut bad = Vec::new();
        for c in &self.changes {
            let (_, actual) = read_mask(&self.root, c.irq)?;
            if norm(&actual) != norm(&c.target) {
                bad.push((c.irq, c.target.clone(), actual));
            }
        }
        Ok(bad)
    }

    /// Back up, write, read back. Any failure restores what was written and removes the backup
    /// (or, if even that fails, keeps the backup and says how to restore). The change stays in
    /// place after success: call [`reset`] (or use [`IrqPlan::apply_guarded`]) to undo it.
    pub fn apply(&self, backup_path: &Path) -> Result<Applied, IrqError> {
        check_privilege(&self.root, nix::unistd::geteuid().as_raw())?;
        if let Some(existing) = read_backup(backup_path)? {
            return Err(IrqError::BackupExists {
                path: backup_path.display().to_string(),
                pid: existing.pid,
                restore: restore_command(&self.root, backup_path),
            });
        }
        let pending: Vec<&IrqChange> = self.pending().collect();
        // Back up what is there now (not what the plan saw), so the backup is the truth.
        let mut entries = Vec::new();
        for c in &pending {
            let (text, _) = read_mask(&self.root, c.irq)?;
            entries.push(BackupEntry {
                irq: c.irq,
                smp_affinity: text,
            });
        }
        let backup = Backup {
            tool: format!("tcpx-affinity {}", env!("CARGO_PKG_VERSION")),
            pid: std::process::id(),
            created_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            root: root_text(&self.root),
            host: this_host(),
            entries,
        };
        write_backup(backup_path, &backup)?;
        tracing::info!(backup = %backup_path.display(), irqs = pending.len(), "IRQ affinity backup written");

        let rollback = |upto: usize| -> String {
            let mut failures = Vec::new();
            for e in backup.entries.iter().take(upto) {
                if let Err(err) = write_mask(&self.root, e.irq, &e.smp_affinity) {
                    failures.push(format!("IRQ {}: {err}", e.irq));
                }
            }
            if failures.is_empty() {
                let _ = std::fs::remove_file(backup_path);
                format!("rolled back the {upto} IRQ(s) already written; nothing is left changed")
            } else {
                format!(
                    "ROLLBACK INCOMPLETE ({failures:?}); restore with: {}",
                    restore_command(&self.root, backup_path)
                )
            }
        };

        for (i, c) in pending.iter().enumerate() {
            let mask = c.target.to_mask_string(self.nr_cpus);
            if let Err(error) = write_mask(&self.root, c.irq, &mask) {
                // A refused write to /proc changes nothing; on a plain file it may have truncated
                // it, so put the original back too, best effort.
                let _ = write_mask(&self.root, c.irq, &backup.entries[i].smp_affinity);
                return Err(IrqError::WriteFailed {
                    irq: c.irq,
                    path: self.root.path(affinity_path(c.irq)).display().to_string(),
                    mask,
                    error,
                    rollback: rollback(i),
                });
            }
            tracing::debug!(irq = c.irq, nic = %c.nic, target = %c.target, "IRQ affinity written");
        }
        let online = online_cpus(&self.root);
        let norm = |s: &CpuSet| online.as_ref().map_or(s.clone(), |o| s.intersection(o));
        for c in &pending {
            let actual = read_mask(&self.root, c.irq).map(|(_, s)| s);
            match actual {
                Ok(actual) if norm(&actual) == norm(&c.target) => {}
                Ok(actual) => {
                    return Err(IrqError::VerifyFailed {
                        irq: c.irq,
                        expected: c.target.to_string(),
                        actual: actual.to_string(),
                        rollback: rollback(pending.len()),
                    })
                }
                Err(e) => {
                    return Err(IrqError::VerifyFailed {
                        irq: c.irq,
                        expected: c.target.to_string(),
                        actual: format!("unreadable ({e})"),
                        rollback: rollback(pending.len()),
                    })
                }
            }
        }
        Ok(Applied {
            backup: backup_path.to_path_buf(),
            written: pending.iter().map(|c| c.irq).collect(),
        })
    }

    /// [`IrqPlan::apply`], returning a guard that restores the backup when dropped (normal exit,
    /// `?` error paths, panic unwinding) and, in a binary that asked for it with
    /// [`restore_on_interrupt`], on Ctrl-C / SIGTERM.
    pub fn apply_guarded(&self, backup_path: &Path) -> Result<IrqGuard, IrqError> {
        install_signal_restore();
        // Register before writing, so a signal arriving mid-apply also restores.
        register(&self.root, backup_path);
        match self.apply(backup_path) {
            Ok(applied) => Ok(IrqGuard {
                root: self.root.clone(),
                backup: applied.backup,
                done: false,
            }),
            Err(e) => {
                unregister(backup_path);
                Err(e)
            }
        }
    }
}

fn write_backup(path: &Path, backup: &Backup) -> Result<(), IrqError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| file_error("creating", dir, e))?;
    }
    let tmp = path.with_extension("json.tmp");
    let written = (|| {
        // Created exclusively: a link planted at the temporary name (this runs as root) is
        // removed, never written through; the rename then replaces the backup's own name.
        let create = || {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
        };
        let mut f = match create() {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_file(&tmp)?;
                create()?
            }
            r => r?,
        };
        f.write_all(
            serde_json::to_string_pretty(backup)
                .map_err(std::io::Error::other)?
                .as_bytes(),
        )?;
        f.sync_all()
    })();
    // A failed write leaves no temporary file behind.
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(file_error("writing", &tmp, e));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(file_error("renaming the backup to", path, e));
    }
    Ok(())
}

/// The backup at `path`, if there is one.
pub fn read_backup(path: &Path) -> Result<Option<Backup>, IrqError> {
    match tcpx_topo::read_bounded(path, MAX_BACKUP_BYTES) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| IrqError::Malformed {
                path: path.display().to_string(),
                why: format!("{e} (not a tcpx IRQ backup? move it away)"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(file_error("reading", path, e)),
    }
}

/// Outcome of a reset.
#[derive(Debug, Clone, Serialize)]
pub struct Restored {
    pub irqs: Vec<u32>,
}

/// Restore every IRQ in the backup, verify, and delete the backup. A backup written for
/// another root or host is refused before anything is written. The backup is deleted only when
/// every IRQ it lists was restored: an IRQ that has disappeared since (renumbered, device
/// removed) or any other failure keeps it, listing what was not restored.
pub fn reset(root: &SysRoot, backup_path: &Path) -> Result<Restored, IrqError> {
    let Some(backup) = read_backup(backup_path)? else {
        return Err(IrqError::NoBackup {
            path: backup_path.display().to_string(),
        });
    };
    let (here_root, here_host) = (root_text(root), this_host());
    let host_differs = !backup.host.is_empty() && backup.host != here_host;
    if backup.root != here_root || host_differs {
        return Err(IrqError::BackupMismatch {
            path: backup_path.display().to_string(),
            recorded: format!("root {} on host {}", backup.root, backup.host),
            here: format!("root {here_root} on host {here_host}"),
        });
    }
    check_privilege(root, nix::unistd::geteuid().as_raw())?;
    // Every mask is checked before anything is written: the kernel refuses an empty one, and a
    // mask that does not parse was not written by this tool.
    for e in &backup.entries {
        match CpuSet::parse_mask(&e.smp_affinity) {
            Ok(set) if !set.is_empty() => {}
            Ok(_) => {
                return Err(IrqError::Malformed {
                    path: backup_path.display().to_string(),
                    why: format!(
                        "IRQ {} has the empty CPU mask `{}`: an IRQ needs at least one CPU; nothing was restored and the backup stays (fix or remove that entry)",
                        e.irq,
                        tcpx_topo::text::comment(&e.smp_affinity)
                    ),
                })
            }
            Err(err) => {
                return Err(IrqError::Malformed {
                    path: backup_path.display().to_string(),
                    why: format!(
                        "IRQ {} has the CPU mask `{}`, which does not parse ({err}); nothing was restored and the backup stays",
                        e.irq,
                        tcpx_topo::text::comment(&e.smp_affinity)
                    ),
                })
            }
        }
    }
    let mut failures = Vec::new();
    let mut irqs = Vec::new();
    for e in &backup.entries {
        if !root.path(format!("/proc/irq/{}", e.irq)).exists() {
            failures.push(format!(
                "IRQ {}: {} is gone (renumbered or device removed?); its affinity was {}",
                e.irq,
                root.path(format!("/proc/irq/{}", e.irq)).display(),
                e.smp_affinity
            ));
            continue;
        }
        if let Err(err) = write_mask(root, e.irq, &e.smp_affinity) {
            failures.push(format!("IRQ {}: {err}", e.irq));
            continue;
        }
        match (read_mask(root, e.irq), CpuSet::parse_mask(&e.smp_affinity)) {
            (Ok((_, now)), Ok(want)) if now == want => irqs.push(e.irq),
            (Ok((_, now)), _) => failures.push(format!("IRQ {}: reads {now} after restore", e.irq)),
            (Err(err), _) => failures.push(format!("IRQ {}: {err}", e.irq)),
        }
    }
    if !failures.is_empty() {
        return Err(IrqError::RestoreIncomplete {
            failures,
            backup: backup_path.display().to_string(),
        });
    }
    std::fs::remove_file(backup_path).map_err(|e| file_error("removing", backup_path, e))?;
    tracing::info!(irqs = irqs.len(), backup = %backup_path.display(), "IRQ affinity restored");
    Ok(Restored { irqs })
}

/// A backup found at start: a previous run changed IRQs and did not restore them.
#[derive(Debug, Clone, Serialize)]
pub struct StaleBackup {
    pub path: PathBuf,
    pub pid: u32,
    /// True when the process that wrote it still runs (then it is not stale, just in use).
    pub pid_alive: bool,
    pub created_unix_s: u64,
    pub irqs: usize,
    pub restore_command: String,
}

impl std::fmt::Display for StaleBackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IRQ affinity backup at {} ({} IRQs, written by pid {}{}, unix time {}): the IRQs it lists are still changed. Restore with: {}",
            self.path.display(),
            self.irqs,
            self.pid,
            if self.pid_alive { ", still running" } else { ", no longer running" },
            self.created_unix_s,
            self.restore_command
        )
    }
}

/// Look for a leftover backup; call at start-up and report what it returns.
pub fn find_stale_backup(
    root: &SysRoot,
    backup_path: &Path,
) -> Result<Option<StaleBackup>, IrqError> {
    let Some(b) = read_backup(backup_path)? else {
        return Ok(None);
    };
    let pid_alive = b.pid == std::process::id()
        || (root.is_live()
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(b.pid as i32), None).is_ok());
    Ok(Some(StaleBackup {
        path: backup_path.to_path_buf(),
        pid: b.pid,
        pid_alive,
        created_unix_s: b.created_unix_s,
        irqs: b.entries.len(),
        restore_command: restore_command(root, backup_path),
    }))
}

// ---- restore on drop / signal ----

fn active() -> &'static Mutex<Vec<(SysRoot, PathBuf)>> {
    static ACTIVE: OnceLock<Mutex<Vec<(SysRoot, PathBuf)>>> = OnceLock::new();
    ACTIVE.get_or_init(|| Mutex::new(Vec::new()))
}

fn register(root: &SysRoot, backup: &Path) {
    let mut a = active().lock().unwrap_or_else(|p| p.into_inner());
    a.push((root.clone(), backup.to_path_buf()));
}

fn unregister(backup: &Path) -> bool {
    let mut a = active().lock().unwrap_or_else(|p| p.into_inner());
    let before = a.len();
    a.retain(|(_, b)| b != backup);
    a.len() != before
}

/// Restore every policy applied through [`IrqPlan::apply_guarded`] that is still in place.
/// Returns the number restored. Used by the signal handler; callable by a caller's own handler.
pub fn restore_all_active() -> usize {
    let entries: Vec<(SysRoot, PathBuf)> = {
        let mut a = active().lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *a)
    };
    let mut n = 0;
    for (root, backup) in entries {
        match reset(&root, &backup) {
            Ok(_) => n += 1,
            Err(IrqError::NoBackup { .. }) => {}
            Err(e) => eprintln!("tcpx-affinity: restoring IRQ affinity failed: {e}"),
        }
    }
    n
}

/// What the process does once its Ctrl-C / SIGTERM handler restored the guarded policies, given
/// by the binary through [`restore_on_interrupt`].
static ON_INTERRUPT: OnceLock<fn(usize)> = OnceLock::new();

/// Makes every later [`IrqPlan::apply_guarded`] install (once per process) a Ctrl-C / SIGTERM
/// handler that restores every guarded policy still in place and then calls `then` with how many
/// it restored; `then` is the binary's, and ends the process with the status the binary chooses.
/// Without it a library user's signals stay as they are and guards restore on drop only. The
/// first call wins. `ctrlc` allows one handler per process, so if one is already set the
/// handler is not installed.
pub fn restore_on_interrupt(then: fn(usize)) {
    let _ = ON_INTERRUPT.set(then);
}

/// Installs the handler [`restore_on_interrupt`] asked for now, rather than at the next
/// [`IrqPlan::apply_guarded`]; does nothing when the binary did not ask for one.
pub fn install_signal_restore() {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    let Some(&then) = ON_INTERRUPT.get() else {
        return;
    };
    INSTALLED.get_or_init(|| ctrlc::set_handler(move || then(restore_all_active())).is_ok());
}

/// Restores the IRQ affinity backup when dropped (or on [`IrqGuard::restore`]).
#[derive(Debug)]
pub struct IrqGuard {
    root: SysRoot,
    backup: PathBuf,
    done: bool,
}

impl IrqGuard {
    pub fn backup_path(&self) -> &Path {
        &self.backup
    }

    /// Restore now and report the outcome (drop would only log it).
    pub fn restore(mut self) -> Result<Restored, IrqError> {
        self.done = true;
        unregister(&self.backup);
        reset(&self.root, &self.backup)
    }
}

impl Drop for IrqGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // If the signal handler got there first, the entry is gone and so is the backup.
        if unregister(&self.backup) {
            if let Err(e) = reset(&self.root, &self.backup) {
                tracing::error!("restoring IRQ affinity on drop failed: {e}");
                eprintln!("tcpx-affinity: restoring IRQ affinity failed: {e}");
            }
        }
    }
}
