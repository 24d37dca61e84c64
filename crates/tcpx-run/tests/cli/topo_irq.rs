//! `tcpx-run topo` and `tcpx-run irq` end to end: the real binary on fixture trees and on this
//! machine.

use crate::harness::{self, RunWithDeadline as _};

use std::path::PathBuf;
use std::process::{Command, Output};

use harness::{fast_tempdir, fixture_dir};

fn tcpx_run(args: &[&str]) -> Output {
    harness::tcpx_run().args(args).run()
}

/// `tcpx-run topo --json` with `args`, parsed; it must succeed.
fn topo_json(args: &[&str]) -> serde_json::Value {
    let out = stdout_ok(&tcpx_run(&[&["topo", "--json"], args].concat()));
    serde_json::from_str(&out).unwrap()
}

fn stdout_ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn topo_on_a3_high_prints_the_binding_table_and_nccl_strings() {
    let root = fixture_dir("a3-high");
    let out = stdout_ok(&tcpx_run(&["topo", "--root", root.to_str().unwrap()]));
    harness::assert_says(&out, &["208 CPUs online, 104 cores (2 thread(s) per core), 2 package(s), 2 NUMA node(s)", "NCCL_GPUDIRECTTCPX_TX_BINDINGS=\"eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177\"", "NCCL_GPUDIRECTTCPX_RX_BINDINGS=\"eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191\""]);
    let eth3 = out
        .lines()
        .find(|l| l.trim_start().starts_with("eth3 "))
        .expect("eth3 row");
    for cell in [
        "gve",
        "0000:85:00.0",
        "200 Gb/s",
        "52-103",
        "156-207",
        "60-73,164-177",
        "74-87,178-191",
        "4,5",
    ] {
        assert!(eth3.contains(cell), "eth3 row lacks {cell}: {eth3}");
    }
    let gpu7 = out
        .lines()
        .find(|l| l.trim_start().starts_with("7 "))
        .expect("GPU 7 row");
    assert!(
        gpu7.contains("0000:8a:00.0") && gpu7.contains("eth4"),
        "{gpu7}"
    );
}

#[cfg(feature = "hwloc")]
#[test]
fn topo_through_an_hwloc_xml_export_gives_the_same_bindings() {
    let root = fixture_dir("a3-high");
    let xml = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tcpx-topo/tests/fixtures/a3-high.hwloc.xml");
    let out = stdout_ok(&tcpx_run(&[
        "topo",
        "--root",
        root.to_str().unwrap(),
        "--hwloc-xml",
        xml.to_str().unwrap(),
    ]));
    assert!(out.contains("read with hwloc + sysfs"), "{out}");
    assert!(out.contains(
        "NCCL_GPUDIRECTTCPX_RX_BINDINGS=\"eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191\""
    ), "{out}");
}

#[test]
fn topo_json_has_topology_and_plan() {
    let root = fixture_dir("a3-high");
    let v = topo_json(&["--root", root.to_str().unwrap()]);
    assert_eq!(v["topology"]["gpus"].as_array().unwrap().len(), 8);
    assert_eq!(v["topology"]["gpus"][2]["pci"]["bus_id"], "0000:09:00.0");
    assert_eq!(v["plan"]["rows"][1]["nic"], "eth1");
    assert_eq!(v["plan"]["rows"][1]["tx"], "8-21,112-125");
}

#[test]
fn topo_on_loopback_only_machine() {
    let root = fixture_dir("single-socket-lo");
    let out = stdout_ok(&tcpx_run(&["topo", "--root", root.to_str().unwrap()]));
    harness::assert_says(
        &out,
        &[
            "8 CPUs online, 4 cores (2 thread(s) per core), 1 package(s), 1 NUMA node(s)",
            "GPUs: none found",
            "NICs: no physical NIC",
            "Virtual interfaces: lo",
            "NCCL bindings: none",
        ],
    );
}

/// GPU links come from the running driver: a fixture tree gets a one-line reason instead, in the
/// text and in the JSON.
#[test]
fn topo_on_a_fixture_says_why_there_are_no_gpu_links() {
    let root = fixture_dir("a3-high");
    let out = stdout_ok(&tcpx_run(&["topo", "--root", root.to_str().unwrap()]));
    assert!(
        out.contains("GPU links: none (not read: --root points at a fixture tree"),
        "{out}"
    );
    let v = topo_json(&["--root", root.to_str().unwrap()]);
    assert!(
        v["gpu_links"]["error"]
            .as_str()
            .unwrap()
            .contains("fixture tree"),
        "{v}"
    );
}

/// On this machine: the matrix where the driver sees GPUs, else the reason in one line.
#[test]
fn topo_on_this_machine_shows_gpu_links_or_why_not() {
    if !std::path::Path::new("/sys/devices/system/cpu/online").exists() {
        println!("SKIP: no /sys here");
        return;
    }
    let out = stdout_ok(&tcpx_run(&["topo"]));
    let line = out
        .lines()
        .find(|l| l.starts_with("GPU links"))
        .unwrap_or_else(|| panic!("no GPU links section:\n{out}"));
    let v = topo_json(&[]);
    let links = &v["gpu_links"];
    if line.starts_with("GPU links: none (") {
        assert!(links["error"].is_string(), "{links}");
    } else {
        let n = links["gpus"].as_array().unwrap().len();
        assert!(n >= 1, "{links}");
        assert_eq!(
            links["links"].as_array().unwrap().len(),
            n * (n - 1),
            "{links}"
        );
        if n >= 2 {
            assert!(
                out.contains("Link matrix (as nvidia-smi topo -m):"),
                "{out}"
            );
        }
    }
}

#[test]
fn topo_with_a_wrong_root_says_what_to_check() {
    let out = tcpx_run(&["topo", "--root", "/nonexistent/tcpx"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/tcpx/sys/devices/system/cpu/online") && err.contains("--root"),
        "{err}"
    );
}

/// The live machine: topo's numbers equal what the kernel says.
#[test]
fn topo_and_irq_show_on_this_machine() {
    let Ok(online) = std::fs::read_to_string("/sys/devices/system/cpu/online") else {
        println!("SKIP: no /sys here");
        return;
    };
    let out = stdout_ok(&tcpx_run(&["topo", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let expected_source = if cfg!(feature = "hwloc") {
        "hwloc-and-sysfs"
    } else {
        "sysfs"
    };
    assert_eq!(v["topology"]["source"], expected_source);
    let cpus: Vec<u64> = v["topology"]["cpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_u64().unwrap())
        .collect();
    let expected = tcpx_topo::CpuSet::parse_list(&online).unwrap();
    assert_eq!(cpus, expected.iter().map(u64::from).collect::<Vec<_>>());
    let nics: Vec<String> = v["topology"]["nics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap().to_string())
        .collect();
    let mut sys_nics: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    sys_nics.sort();
    assert_eq!(nics, sys_nics);

    let out = stdout_ok(&tcpx_run(&["irq", "show", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let interrupts = std::fs::read_to_string("/proc/interrupts").unwrap();
    for q in v["queue_irqs"].as_array().unwrap() {
        let irq = q["irq"].as_u64().unwrap();
        let line = interrupts
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{irq}:")))
            .unwrap();
        assert!(line.contains(q["name"].as_str().unwrap()), "{line}");
        assert!(sys_nics.contains(&q["nic"].as_str().unwrap().to_string()));
    }
    println!(
        "live: {} NIC queue IRQs",
        v["queue_irqs"].as_array().unwrap().len()
    );
}

#[test]
fn irq_apply_is_a_dry_run_without_yes_then_applies_and_resets() {
    let tmp = fast_tempdir();
    harness::copy_tree(&fixture_dir("a3-high"), tmp.path());
    let root = tmp.path().to_str().unwrap();
    let mask = |irq: u32| {
        std::fs::read_to_string(tmp.path().join(format!("proc/irq/{irq}/smp_affinity"))).unwrap()
    };
    // eth1 RX queue 0 = gve block 8 of eth1 = IRQ 58 (see the fixture generator).
    let original = mask(58);

    let out = stdout_ok(&tcpx_run(&["irq", "--root", root, "show"]));
    assert!(
        out.lines()
            .any(|l| l.contains("58") && l.contains("eth1") && l.contains("rx")),
        "{out}"
    );
    // Per-NIC summary: eth3 on NUMA 1, TX blocks 84-91, RX 92-99, management vector 83.
    let eth3 = out
        .lines()
        .find(|l| l.starts_with("eth3 "))
        .expect("eth3 summary row");
    let cells: Vec<&str> = eth3.split_whitespace().collect();
    assert_eq!(
        &cells[..7],
        ["eth3", "1", "84-91", "92-99", "-", "83", "0-207"],
        "{eth3}"
    );

    let out = stdout_ok(&tcpx_run(&["irq", "--root", root, "plan"]));
    assert!(out.contains("64 of 64 IRQs would change"), "{out}");

    let out = stdout_ok(&tcpx_run(&["irq", "--root", root, "apply"]));
    assert!(out.contains("Dry run: nothing was written"), "{out}");
    assert_eq!(mask(58), original);

    let out = stdout_ok(&tcpx_run(&["irq", "--root", root, "apply", "--yes"]));
    assert!(out.contains("Applied and verified 64 IRQ(s)"), "{out}");
    assert_eq!(
        tcpx_topo::CpuSet::parse_mask(&mask(58))
            .unwrap()
            .to_string(),
        "22"
    );
    assert!(tmp.path().join("run/tcpx-lab/irq-backup.json").exists());

    // Any later command reports the leftover backup with the command that restores it.
    let shown = tcpx_run(&["irq", "--root", root, "show"]);
    let err = String::from_utf8_lossy(&shown.stderr);
    assert!(
        err.contains("Restore with: tcpx-run irq reset --yes --root"),
        "{err}"
    );
    // Applying twice is refused (the backup holds the originals).
    let again = tcpx_run(&["irq", "--root", root, "apply", "--yes"]);
    assert!(!again.status.success());

    let out = stdout_ok(&tcpx_run(&["irq", "--root", root, "reset"]));
    assert!(
        out.contains("would restore") && out.contains("Dry run"),
        "{out}"
    );
    assert_ne!(mask(58), original);
    let out = stdout_ok(&tcpx_run(&["irq", "--root", root, "reset", "--yes"]));
    assert!(out.contains("Restored 64 IRQ(s)"), "{out}");
    assert_eq!(mask(58), original);
    assert!(!tmp.path().join("run/tcpx-lab/irq-backup.json").exists());
}

#[test]
fn irq_plan_takes_explicit_specs() {
    let root = fixture_dir("a3-high");
    let out = stdout_ok(&tcpx_run(&[
        "irq",
        "--root",
        root.to_str().unwrap(),
        "plan",
        "--tx",
        "eth2:1-2",
        "--rx",
        "eth2:3",
        "--spread",
        "whole-set",
    ]));
    assert!(out.contains("16 of 16 IRQs would change"), "{out}");
    let bad = tcpx_run(&[
        "irq",
        "--root",
        root.to_str().unwrap(),
        "plan",
        "--tx",
        "eth2",
        "--rx",
        "eth2:3",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected e.g."));
}

/// `apply --yes --hold`: the policy is in place while held and Ctrl-C (SIGINT) restores it.
#[test]
fn irq_apply_hold_restores_on_ctrl_c() {
    hold_then_signal("INT", 130);
}

/// SIGTERM restores too, and the exit status says SIGTERM (128 + 15), not Ctrl-C.
#[test]
fn irq_apply_hold_restores_on_sigterm_with_status_143() {
    hold_then_signal("TERM", 143);
}

fn hold_then_signal(signal: &str, status: i32) {
    use std::io::BufRead;
    use std::sync::mpsc;
    use std::time::Duration;

    let tmp = fast_tempdir();
    harness::copy_tree(&fixture_dir("a3-high"), tmp.path());
    let root = tmp.path().to_str().unwrap().to_string();
    let mask = |irq: u32| {
        std::fs::read_to_string(tmp.path().join(format!("proc/irq/{irq}/smp_affinity"))).unwrap()
    };
    let original = mask(58);
    let mut child = Command::new(harness::bin())
        .args(["irq", "--root", &root, "apply", "--yes", "--hold", "120"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Wait (bounded) for the line saying the policy is in place.
    let holding = loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) if l.contains("holding for up to 120 s") => break true,
            Ok(_) => continue,
            Err(_) => break false,
        }
    };
    if !holding {
        let _ = child.kill();
        panic!("tcpx-run never reported holding the policy");
    }
    assert_eq!(
        tcpx_topo::CpuSet::parse_mask(&mask(58))
            .unwrap()
            .to_string(),
        "22"
    );
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .unwrap()
        .success());
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(child.wait_with_output());
    });
    let out = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("tcpx-run exits after the signal")
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(status),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("restored 1 IRQ affinity backup"));
    assert_eq!(mask(58), original);
    assert!(!tmp.path().join("run/tcpx-lab/irq-backup.json").exists());
}

/// Writing the live system's IRQ affinity as an ordinary user is refused with a clear message,
/// and nothing is written. Runs the real binary as uid 65534 through setpriv.
#[test]
fn irq_apply_as_non_root_is_refused() {
    if !nix_is_root() {
        println!("SKIP: needs root to drop to another user");
        return;
    }
    let bin = harness::bin();
    let out = match Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            bin,
            "irq",
            "apply",
            "--yes",
        ])
        .output_with_deadline()
    {
        Ok(o) => o,
        Err(e) => {
            println!("SKIP: setpriv not available ({e})");
            return;
        }
    };
    let err = String::from_utf8_lossy(&out.stderr);
    if matches!(out.status.code(), Some(126) | Some(127)) || err.contains("Permission denied") {
        println!("SKIP: uid 65534 cannot execute {bin} here ({err})");
        return;
    }
    if err.contains("No NIC queue IRQ") || err.contains("/proc/interrupts") {
        println!("SKIP: no readable /proc/interrupts as uid 65534 ({err})");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(
        err.contains("needs root") && err.contains("uid 65534"),
        "{err}"
    );
}

fn nix_is_root() -> bool {
    // /proc/self/status "Uid:" line: real, effective, saved, fs.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}
