//! The IRQ backup (issue 27, items 9 and 25): it records the root and host it was written for,
//! `reset` under another root refuses it and keeps it, a partial restore (IRQs renumbered)
//! keeps it, an endless backup file is refused with its limit; issue 43: a FIFO backup is
//! refused at once, an empty mask before anything is written. (A failed backup write is
//! tcpx-run's `cli::harden_files`: it needs a file-size limit on a process of its own.)

mod common;

use common::{a3_policy, writable_fixture};
use tcpx_affinity::{default_backup_path, read_backup, reset, IrqError};

#[test]
fn a_reset_under_another_root_restores_nothing_and_keeps_the_backup() {
    let (_a, root) = writable_fixture("a3-high");
    let (_b, other) = writable_fixture("a3-high");
    let plan = a3_policy(&root).plan(&root).unwrap();
    let backup = default_backup_path(&root);
    plan.apply(&backup).unwrap();
    let saved = read_backup(&backup).unwrap().unwrap();
    assert_eq!(
        saved.root,
        std::fs::canonicalize(root.root())
            .unwrap()
            .display()
            .to_string()
    );
    assert!(!saved.host.is_empty());
    // The same backup given to a reset of another tree (a wrong --root).
    let e = reset(&other, &backup).unwrap_err();
    assert!(matches!(e, IrqError::BackupMismatch { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("nothing was restored and the backup stays"),
        "{text}"
    );
    assert!(text.contains(&saved.root), "{text}");
    assert!(backup.exists());
    // A backup from another host is refused as well.
    let mut moved = saved.clone();
    moved.host = "another-host".into();
    std::fs::write(&backup, serde_json::to_string(&moved).unwrap()).unwrap();
    let e = reset(&root, &backup).unwrap_err().to_string();
    assert!(e.contains("on host another-host"), "{e}");
    assert!(backup.exists());
    // Under its own root and host it restores and is removed.
    std::fs::write(&backup, serde_json::to_string(&saved).unwrap()).unwrap();
    assert_eq!(reset(&root, &backup).unwrap().irqs.len(), 64);
    assert!(!backup.exists());
}

#[test]
fn a_partial_restore_keeps_the_backup_and_names_what_was_not_restored() {
    let (_a, root) = writable_fixture("a3-high");
    let plan = a3_policy(&root).plan(&root).unwrap();
    let backup = default_backup_path(&root);
    plan.apply(&backup).unwrap();
    // IRQs renumbered since: the first one of the backup is gone.
    let gone = read_backup(&backup).unwrap().unwrap().entries[0].irq;
    std::fs::remove_dir_all(root.path(format!("/proc/irq/{gone}"))).unwrap();
    let e = reset(&root, &backup).unwrap_err();
    assert!(matches!(e, IrqError::RestoreIncomplete { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains(&format!("IRQ {gone}:")) && text.contains("is gone"),
        "{text}"
    );
    assert!(backup.exists(), "a partial restore must keep the backup");
}

#[test]
fn an_endless_backup_file_is_refused_with_its_limit() {
    let (_a, root) = writable_fixture("a3-high");
    let e = reset(&root, std::path::Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/dev/zero") && e.contains("not a regular file"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let huge = dir.path().join("huge.json");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    let e = reset(&root, &huge).unwrap_err().to_string();
    assert!(
        e.contains("huge.json") && e.contains("larger than 16 MiB"),
        "{e}"
    );
}

/// Issue 43 item 3: a FIFO as the backup hung in open() forever; it is refused at once.
#[test]
fn a_fifo_as_the_backup_is_refused_naming_it() {
    let (_a, root) = writable_fixture("a3-high");
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("backup.json");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (tx, rx) = std::sync::mpsc::channel();
    let f = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(reset(&root, &f).map(|_| ()).map_err(|e| e.to_string()));
    });
    let e = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("reading a FIFO backup hung")
        .unwrap_err();
    assert!(
        e.contains(&fifo.display().to_string()) && e.contains("FIFO"),
        "{e}"
    );
}

/// Issue 43, minor: an empty CPU mask in a backup was written unchecked.
#[test]
fn a_backup_with_an_empty_mask_restores_nothing_and_stays() {
    let (_a, root) = writable_fixture("a3-high");
    let plan = a3_policy(&root).plan(&root).unwrap();
    let backup = default_backup_path(&root);
    plan.apply(&backup).unwrap();
    let mut saved = read_backup(&backup).unwrap().unwrap();
    let (first, irq) = (saved.entries[0].irq, saved.entries[1].irq);
    let mask = |i: u32| std::fs::read_to_string(root.path(format!("/proc/irq/{i}/smp_affinity")));
    let before = mask(first).unwrap();
    assert_ne!(before.trim(), saved.entries[0].smp_affinity.trim());
    saved.entries[1].smp_affinity = "00000000,00000000".into();
    std::fs::write(&backup, serde_json::to_string(&saved).unwrap()).unwrap();
    let e = reset(&root, &backup).unwrap_err().to_string();
    assert!(
        e.contains(&format!("IRQ {irq} has the empty CPU mask")),
        "{e}"
    );
    assert!(backup.exists());
    // Nothing was written: the first entry's IRQ still has the policy's mask.
    assert_eq!(mask(first).unwrap(), before);
}

#[test]
fn the_printed_restore_command_quotes_its_paths() {
    let (_a, root) = writable_fixture("a3-high");
    let plan = a3_policy(&root).plan(&root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("my backups").join("it's.json");
    plan.apply(&backup).unwrap();
    let stale = tcpx_affinity::find_stale_backup(&root, &backup)
        .unwrap()
        .unwrap();
    let want = format!(
        "--backup '{}/my backups/it'\\''s.json'",
        dir.path().display()
    );
    assert!(
        stale.restore_command.ends_with(&want),
        "{}",
        stale.restore_command
    );
    reset(&root, &backup).unwrap();
}

/// Issue 43 item 8: the backup is written as root; a link planted at its temporary name is not
/// written through.
#[test]
fn a_link_at_the_backups_temporary_name_is_not_followed() {
    let (_a, root) = writable_fixture("a3-high");
    let plan = a3_policy(&root).plan(&root).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "mine").unwrap();
    let backup = dir.path().join("irq.json");
    std::os::unix::fs::symlink(&victim, backup.with_extension("json.tmp")).unwrap();
    plan.apply(&backup).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
    assert!(read_backup(&backup).unwrap().is_some());
    assert!(!backup.with_extension("json.tmp").exists());
}
