//! IRQ mapping, plan, apply/verify/reset, rollback and restore-on-drop on fixture trees.

mod common;

use common::{a3_policy, fixture, writable_fixture};
use tcpx_affinity::{
    check_privilege, default_backup_path, find_stale_backup, queue_irqs, read_backup, reset,
    Direction, IrqError, IrqPolicy, Spread,
};
use tcpx_topo::{BindingSpec, CpuSet, SysRoot};

fn set(s: &str) -> CpuSet {
    CpuSet::parse_list(s).unwrap()
}

fn mask_of(root: &SysRoot, irq: u32) -> String {
    root.read(format!("/proc/irq/{irq}/smp_affinity"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn gve_queue_irqs_map_to_nic_queue_and_direction() {
    let (_, queues) = queue_irqs(&fixture("a3-high")).unwrap();
    // 5 NICs: eth0 4+4 blocks, eth1-4 8+8 blocks, one management vector each.
    assert_eq!(queues.len(), (1 + 8) + 4 * (1 + 16));
    let eth2: Vec<_> = queues.iter().filter(|q| q.nic == "eth2").collect();
    assert_eq!(
        eth2.iter().filter(|q| q.direction == Direction::Tx).count(),
        8
    );
    assert_eq!(
        eth2.iter().filter(|q| q.direction == Direction::Rx).count(),
        8
    );
    assert_eq!(
        eth2.iter()
            .filter(|q| q.direction == Direction::Control)
            .count(),
        1
    );
    // Block 8 of a 16-block NIC is RX queue 0; block 7 is TX queue 7.
    let blk = |n: u32| {
        eth2.iter()
            .find(|q| q.name.starts_with(&format!("gve-ntfy-blk{n}@")))
            .unwrap()
    };
    assert_eq!((blk(8).direction, blk(8).queue), (Direction::Rx, Some(0)));
    assert_eq!((blk(7).direction, blk(7).queue), (Direction::Tx, Some(7)));
    // eth0 has 8 blocks: block 4 is RX queue 0.
    let eth0_blk4 = queues
        .iter()
        .find(|q| q.name.starts_with("gve-ntfy-blk4@pci:0000:00:04.0"))
        .unwrap();
    assert_eq!(
        (eth0_blk4.nic.as_str(), eth0_blk4.direction, eth0_blk4.queue),
        ("eth0", Direction::Rx, Some(0))
    );
}

#[test]
fn plan_spreads_one_cpu_per_queue_on_the_nic_numa_cores() {
    let root = fixture("a3-high");
    let plan = a3_policy(&root).plan(&root).unwrap();
    // eth0 is not a data NIC: untouched; control vectors untouched.
    assert!(plan.changes.iter().all(|c| c.nic != "eth0"));
    assert_eq!(plan.changes.len(), 4 * 16);
    assert!(plan
        .untouched
        .iter()
        .any(|u| u.contains("eth0") && u.contains("not in the policy")));
    let find = |nic: &str, dir: Direction, q: u32| {
        plan.changes
            .iter()
            .find(|c| c.nic == nic && c.direction == dir && c.queue == Some(q))
            .unwrap()
    };
    assert_eq!(find("eth1", Direction::Tx, 0).target, set("8"));
    assert_eq!(find("eth1", Direction::Tx, 7).target, set("15"));
    assert_eq!(find("eth3", Direction::Rx, 3).target, set("77"));
    assert_eq!(find("eth4", Direction::Rx, 0).target, set("74"));
    assert_eq!(find("eth4", Direction::Rx, 0).current, set("0-207"));
    assert_eq!(plan.pending().count(), 64);
    assert_eq!(plan.nr_cpus, 208);
    let table = plan.to_table();
    assert!(
        table.lines().count() == 65 && table.contains("eth3"),
        "{table}"
    );

    let whole = IrqPolicy {
        spread: Spread::WholeSet,
        ..a3_policy(&root)
    }
    .plan(&root)
    .unwrap();
    assert!(whole
        .changes
        .iter()
        .filter(|c| c.nic == "eth3" && c.direction == Direction::Tx)
        .all(|c| c.target == set("60-73,164-177")));
}

#[test]
fn apply_verify_reset_round_trip() {
    let (_tmp, root) = writable_fixture("a3-high");
    let eth0_irq = 42; // an eth0 notify block: eth0 is not in the policy
    let eth0_before = mask_of(&root, eth0_irq);
    let plan = a3_policy(&root).plan(&root).unwrap();
    let backup = default_backup_path(&root);
    assert!(find_stale_backup(&root, &backup).unwrap().is_none());

    let applied = plan.apply(&backup).unwrap();
    assert_eq!(applied.written.len(), 64);
    assert!(
        plan.verify().unwrap().is_empty(),
        "read back differs after apply"
    );
    let first = &plan.changes[0];
    assert_eq!(mask_of(&root, first.irq), first.target.to_mask_string(208));
    let saved = read_backup(&backup).unwrap().unwrap();
    assert_eq!(saved.entries.len(), 64);
    assert_eq!(saved.pid, std::process::id());
    assert_eq!(
        saved.entries[0].smp_affinity,
        "ffff,ffffffff,ffffffff,ffffffff,ffffffff,ffffffff,ffffffff"
    );

    // A second apply must not overwrite the backup that holds the originals.
    let again = plan.apply(&backup).unwrap_err();
    assert!(matches!(again, IrqError::BackupExists { .. }), "{again}");
    assert!(again.to_string().contains("irq reset"), "{again}");
    // At start-up this is reported with the command that restores it.
    let stale = find_stale_backup(&root, &backup).unwrap().unwrap();
    assert_eq!(stale.irqs, 64);
    assert!(
        stale
            .to_string()
            .contains(&format!("--backup {}", backup.display())),
        "{stale}"
    );

    let restored = reset(&root, &backup).unwrap();
    assert_eq!(restored.irqs.len(), 64);
    assert!(!backup.exists(), "backup removed after restore");
    for c in &plan.changes {
        assert_eq!(
            CpuSet::parse_mask(&mask_of(&root, c.irq)).unwrap(),
            set("0-207"),
            "IRQ {}",
            c.irq
        );
    }
    assert!(plan.changes.iter().all(|c| c.irq != eth0_irq));
    assert_eq!(mask_of(&root, eth0_irq), eth0_before);
    let err = reset(&root, &backup).unwrap_err();
    assert!(matches!(err, IrqError::NoBackup { .. }));
}

/// A write the kernel refuses halfway through: a read-only sysfs attribute (root cannot write it
/// either) stands in for one IRQ's smp_affinity. Everything written before it must be rolled back
/// and the backup removed.
#[test]
fn failing_write_halfway_rolls_back() {
    let refusing = std::path::Path::new("/sys/devices/system/cpu/cpu0/topology/thread_siblings");
    if std::fs::read_to_string(refusing).is_err() {
        println!("SKIP: {} is not readable here", refusing.display());
        return;
    }
    let (_tmp, root) = writable_fixture("a3-high");
    let policy = a3_policy(&root);
    let plan = policy.plan(&root).unwrap();
    let victim = plan.changes[10].irq;
    let victim_file = root.path(format!("/proc/irq/{victim}/smp_affinity"));
    std::fs::remove_file(&victim_file).unwrap();
    std::os::unix::fs::symlink(refusing, &victim_file).unwrap();
    let originals: Vec<String> = plan.changes.iter().map(|c| mask_of(&root, c.irq)).collect();
    // The plan must see a changeable mask on the victim too (the read-only file holds a mask).
    let plan = policy.plan(&root).unwrap();
    let victim_pos = plan
        .pending()
        .position(|c| c.irq == victim)
        .expect("victim pending");
    assert!(
        victim_pos > 0,
        "some IRQs are written before the failing one"
    );

    let backup = default_backup_path(&root);
    let err = plan.apply(&backup).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, IrqError::WriteFailed { irq, .. } if irq == victim),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("rolled back the {victim_pos} IRQ(s)")),
        "{msg}"
    );
    for (c, orig) in plan.changes.iter().zip(&originals) {
        assert_eq!(&mask_of(&root, c.irq), orig, "IRQ {} not restored", c.irq);
    }
    assert!(
        !backup.exists(),
        "a complete rollback leaves no backup behind"
    );
}

#[test]
fn guard_restores_on_drop_and_on_panic() {
    let (_tmp, root) = writable_fixture("a3-high");
    let plan = a3_policy(&root).plan(&root).unwrap();
    let backup = root.path("/run/guard-test.json");
    let irq = plan.changes[0].irq;
    let original = mask_of(&root, irq);
    {
        let guard = plan.apply_guarded(&backup).unwrap();
        assert_ne!(mask_of(&root, irq), original);
        assert_eq!(guard.backup_path(), backup.as_path());
    }
    assert_eq!(mask_of(&root, irq), original, "drop restored");
    assert!(!backup.exists());

    let plan2 = plan.clone();
    let backup2 = backup.clone();
    let result = std::thread::spawn(move || {
        let _guard = plan2.apply_guarded(&backup2).unwrap();
        panic!("simulated failure in the middle of an experiment");
    })
    .join();
    assert!(result.is_err(), "the thread panicked");
    assert_eq!(mask_of(&root, irq), original, "panic unwinding restored");
    assert!(!backup.exists());

    // restore() reports the outcome explicitly.
    let guard = plan.apply_guarded(&backup).unwrap();
    let restored = guard.restore().unwrap();
    assert_eq!(restored.irqs.len(), 64);
    assert_eq!(mask_of(&root, irq), original);
}

#[test]
fn live_system_needs_root_fixture_does_not() {
    let live = SysRoot::live();
    let err = check_privilege(&live, 1000).unwrap_err();
    assert!(
        err.to_string().contains("needs root") && err.to_string().contains("sudo"),
        "{err}"
    );
    check_privilege(&live, 0).unwrap();
    check_privilege(&fixture("a3-high"), 1000).unwrap();
}

#[test]
fn loopback_only_machine_has_nothing_to_change() {
    let root = fixture("single-socket-lo");
    let (_, queues) = queue_irqs(&root).unwrap();
    assert!(queues.is_empty());
    let policy = IrqPolicy {
        tx: BindingSpec::parse("lo:0").unwrap(),
        ..Default::default()
    };
    let plan = policy.plan(&root).unwrap();
    assert!(plan.changes.is_empty());
}

/// The real /proc/interrupts of this machine parses, and every NIC queue IRQ it maps belongs to an
/// interface that exists.
#[test]
fn live_interrupts_parse_and_map() {
    let live = SysRoot::live();
    let Ok((parsed, queues)) = queue_irqs(&live) else {
        println!("SKIP: no /proc/interrupts here");
        return;
    };
    assert!(!parsed.cpus.is_empty());
    let nics = live.list_dir("/sys/class/net");
    for q in &queues {
        assert!(nics.contains(&q.nic), "{q:?}");
        assert!(parsed.get(q.irq).is_some());
    }
    println!(
        "live: {} IRQ rows, {} NIC queue IRQs",
        parsed.lines.len(),
        queues.len()
    );
}

/// virtio-net and mlx5 naming on a small tree built here: the NIC is found through
/// /sys/bus/virtio/devices/virtioN/net and /sys/bus/pci/devices/<bdf>/net; a virtio device without
/// `net` (vsock, balloon) is not a NIC.
#[test]
fn virtio_and_mlx5_queue_irqs() {
    let tmp = common::fast_tempdir();
    let root = SysRoot::new(tmp.path());
    let mk = |rel: &str| std::fs::create_dir_all(root.path(rel)).unwrap();
    mk("/sys/bus/virtio/devices/virtio2/net/ens4");
    mk("/sys/bus/virtio/devices/virtio3");
    mk("/sys/bus/pci/devices/0000:3b:00.0/net/ens1f0np0");
    mk("/sys/class/net/ens4");
    mk("/sys/class/net/ens1f0np0");
    std::fs::create_dir_all(root.path("/proc")).unwrap();
    std::fs::write(
        root.path("/proc/interrupts"),
        "      CPU0  CPU1\n\
         37:  0  0  PCI-MSIX-0000:00:03.0  0-edge  virtio2-config\n\
         38:  5  9  PCI-MSIX-0000:00:03.0  1-edge  virtio2-input.0\n\
         39:  7  0  PCI-MSIX-0000:00:03.0  2-edge  virtio2-output.0\n\
         40:  1  0  PCI-MSIX-0000:00:03.0  3-edge  virtio2-input.1\n\
         41:  0  3  PCI-MSIX-0000:00:04.0  1-edge  virtio3-rx\n\
         60:  0  0  IR-PCI-MSIX-0000:3b:00.0  0-edge  mlx5_async0@pci:0000:3b:00.0\n\
         61:  4  4  IR-PCI-MSIX-0000:3b:00.0  1-edge  mlx5_comp0@pci:0000:3b:00.0\n\
         62:  4  4  IR-PCI-MSIX-0000:3b:00.0  2-edge  mlx5_comp1@pci:0000:3b:00.0\n",
    )
    .unwrap();
    for irq in [37, 38, 39, 40, 41, 60, 61, 62] {
        std::fs::create_dir_all(root.path(format!("/proc/irq/{irq}"))).unwrap();
        std::fs::write(root.path(format!("/proc/irq/{irq}/smp_affinity")), "3\n").unwrap();
    }
    let (_, queues) = queue_irqs(&root).unwrap();
    let got: Vec<(u32, &str, Option<u32>, Direction)> = queues
        .iter()
        .map(|q| (q.irq, q.nic.as_str(), q.queue, q.direction))
        .collect();
    assert_eq!(
        got,
        vec![
            (37, "ens4", None, Direction::Control),
            (38, "ens4", Some(0), Direction::Rx),
            (39, "ens4", Some(0), Direction::Tx),
            (40, "ens4", Some(1), Direction::Rx),
            (60, "ens1f0np0", None, Direction::Control),
            (61, "ens1f0np0", Some(0), Direction::Combined),
            (62, "ens1f0np0", Some(1), Direction::Combined),
        ]
    );
    // Combined vectors take the union of TX and RX cores, one CPU per queue.
    let policy = IrqPolicy {
        tx: BindingSpec::parse("ens1f0np0:0;ens4:0").unwrap(),
        rx: BindingSpec::parse("ens1f0np0:1;ens4:1").unwrap(),
        spread: Spread::OnePerQueue,
    };
    let plan = policy.plan(&root).unwrap();
    let target = |irq: u32| {
        plan.changes
            .iter()
            .find(|c| c.irq == irq)
            .map(|c| c.target.to_string())
    };
    assert_eq!(target(61).as_deref(), Some("0"));
    assert_eq!(target(62).as_deref(), Some("1"));
    assert_eq!(target(39).as_deref(), Some("0"));
    assert_eq!(target(40).as_deref(), Some("1"));
    assert_eq!(target(37), None, "control vectors are left alone");
}
