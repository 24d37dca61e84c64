//! Samplers: deltas and summaries on fixture snapshots whose files the test changes between reads,
//! and the background thread on this machine's real /proc.

mod common;

use std::time::Duration;

use common::writable_fixture;
use tcpx_affinity::sampler::{rows_between, summarize, IrqOwners, Snapshot, HOT_CPU_BUSY_PCT};
use tcpx_affinity::{SampleError, Sampler};
use tcpx_topo::SysRoot;

/// Add `by` jiffies to field `field` (0 = user ... 6 = softirq) of cpuN in /proc/stat.
fn bump_stat(root: &SysRoot, cpu: u32, field: usize, by: u64) {
    let text = root.read("/proc/stat").unwrap();
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            let mut parts: Vec<String> = l.split_whitespace().map(str::to_string).collect();
            if parts.first().map(String::as_str) == Some(&format!("cpu{cpu}")) {
                let v: u64 = parts[field + 1].parse().unwrap();
                parts[field + 1] = (v + by).to_string();
            }
            parts.join(" ")
        })
        .collect();
    std::fs::write(root.path("/proc/stat"), out.join("\n") + "\n").unwrap();
}

/// Add `by` to IRQ `irq`'s count on CPU column `cpu` of /proc/interrupts (fixed-width columns).
fn bump_irq(root: &SysRoot, irq: u32, cpu: usize, by: u64) {
    let text = root.read("/proc/interrupts").unwrap();
    let key = format!("{irq:>4}:");
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if !l.starts_with(&key) {
                return l.to_string();
            }
            let start = 5 + cpu * 11;
            let v: u64 = l[start..start + 11].trim().parse().unwrap();
            format!("{}{:>11}{}", &l[..start], v + by, &l[start + 11..])
        })
        .collect();
    std::fs::write(root.path("/proc/interrupts"), out.join("\n") + "\n").unwrap();
}

fn add_to_file(root: &SysRoot, rel: &str, by: u64) {
    let v: u64 = root.read(rel).unwrap().trim().parse().unwrap();
    std::fs::write(root.path(rel), format!("{}\n", v + by)).unwrap();
}

#[test]
fn fixture_deltas_give_hot_cores_irq_balance_nic_rates_and_retransmits() {
    let (_tmp, root) = writable_fixture("a3-high");
    let owners = IrqOwners::discover(&root);
    let a = Snapshot::read(&root, &owners, 0.0).unwrap();
    assert_eq!(a.cpu.len(), 208);

    // Over 2 s: CPU 22 (eth1's first RX core) 90% busy, 6% softirq; CPU 8 30% busy.
    for cpu in 0..208 {
        bump_stat(&root, cpu, 3, 200); // idle
    }
    // CPU 22: busy = 1620 user + 60 system + 120 softirq = 1800 against 200 idle -> 90% busy.
    bump_stat(&root, 22, 0, 1620);
    bump_stat(&root, 22, 2, 60);
    bump_stat(&root, 22, 6, 120);
    bump_stat(&root, 8, 0, 86); // 86 / 286 = 30%
                                // eth1 RX queue 0 is gve block 8 of eth1: IRQ 49 (mgmt) + 1 + 8 = 58. 900 on CPU 22, 100 on 0.
    let eth1_rx0 = 58;
    bump_irq(&root, eth1_rx0, 22, 900);
    bump_irq(&root, eth1_rx0, 0, 100);
    add_to_file(
        &root,
        "/sys/class/net/eth1/statistics/rx_bytes",
        20_000_000_000,
    );
    add_to_file(&root, "/sys/class/net/eth1/statistics/rx_dropped", 3);
    let snmp = root
        .read("/proc/net/snmp")
        .unwrap()
        .replace(" 200000 7 ", " 201000 17 ");
    std::fs::write(root.path("/proc/net/snmp"), snmp).unwrap();

    let b = Snapshot::read(&root, &owners, 2.0).unwrap();
    let rows = rows_between(&a, &b);
    let s = summarize(&a, &b, 2);

    let cpu22 = s.cpus.iter().find(|c| c.cpu == Some(22)).unwrap();
    assert!((cpu22.busy_pct - 90.0).abs() < 1e-9, "{cpu22:?}");
    assert!((cpu22.softirq_pct - 6.0).abs() < 1e-9, "{cpu22:?}");
    assert_eq!(
        s.hot_cores,
        vec![22],
        "only CPU 22 is above {HOT_CPU_BUSY_PCT}%"
    );
    let busy_all = 1800 + 86;
    assert!((s.softirq_share_pct - 100.0 * 120.0 / busy_all as f64).abs() < 1e-9);

    let eth1 = s.irq_balance.iter().find(|b| b.nic == "eth1").unwrap();
    assert_eq!(eth1.total, 1000);
    assert_eq!(eth1.busiest_cpu, Some(22));
    assert!((eth1.busiest_share_pct - 90.0).abs() < 1e-9);
    assert_eq!(s.irqs_per_cpu[&22], 900);
    assert!(s
        .irq_balance
        .iter()
        .filter(|b| b.nic != "eth1")
        .all(|b| b.total == 0));

    let nic = s.nics.iter().find(|n| n.nic == "eth1").unwrap();
    assert_eq!(nic.rx_bytes, 20_000_000_000);
    assert!(
        (nic.rx_gbps - 10.0).abs() < 1e-9,
        "20e9 bytes over 2 s is 10 GB/s"
    );
    assert_eq!(nic.dropped, 3);
    let tcp = s.tcp.as_ref().unwrap();
    assert_eq!((tcp.out_segs, tcp.retrans_segs), (1000, 10));
    assert!((tcp.retrans_pct - 1.0).abs() < 1e-9);

    let find = |src: &str, subj: &str, metric: &str| {
        rows.iter()
            .find(|r| r.source == src && r.subject == subj && r.metric == metric)
            .map(|r| r.value)
    };
    assert_eq!(find("irq", "eth1/cpu22", "irqs"), Some(900.0));
    assert_eq!(find("nic", "eth1", "rx_gbps"), Some(10.0));
    assert_eq!(find("tcp", "tcp", "retrans_segs"), Some(10.0));
    assert!((find("cpu", "cpu22", "busy_pct").unwrap() - 90.0).abs() < 1e-9);
}

#[test]
fn missing_proc_fails_at_start_with_the_path() {
    let err = Sampler::start(SysRoot::new("/nonexistent/tcpx"), Duration::from_millis(10))
        .err()
        .unwrap();
    assert!(matches!(err, SampleError::Io(_)));
    assert!(
        err.to_string().contains("/nonexistent/tcpx/proc/stat"),
        "{err}"
    );
    let err = Sampler::start(SysRoot::live(), Duration::ZERO)
        .err()
        .unwrap();
    assert!(matches!(err, SampleError::BadInterval(_)));
}

/// The thread on the real /proc: CPU work on a pinned thread shows up in that CPU's busy share.
#[test]
fn live_sampler_sees_a_busy_cpu() {
    let live = SysRoot::live();
    if live.read("/proc/stat").is_err() {
        println!("SKIP: no /proc/stat here");
        return;
    }
    let handle = Sampler::start(live, Duration::from_millis(20)).unwrap();
    // Burn one CPU for a bounded amount of work (not time): about 0.1-1 s.
    let worker = std::thread::spawn(|| {
        let cpu = tcpx_affinity::current_thread_affinity()
            .unwrap()
            .first()
            .unwrap();
        tcpx_affinity::pin_current_thread(&[cpu].into_iter().collect()).unwrap();
        let mut x: u64 = 1;
        for i in 0..100_000_000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
        }
        std::hint::black_box(x);
        cpu
    });
    let cpu = worker.join().unwrap();
    let report = handle.stop().unwrap();
    let s = &report.summary;
    assert!(s.samples >= 2, "{} samples", s.samples);
    assert!(s.duration_s > 0.0);
    let busy = s.cpus.iter().find(|c| c.cpu == Some(cpu)).unwrap().busy_pct;
    println!(
        "live: {} samples over {:.2} s, cpu{cpu} busy {busy:.0}%, all {:.0}%",
        s.samples, s.duration_s, s.all_cpus.busy_pct
    );
    assert!(
        busy > 50.0,
        "the pinned spinning thread should make cpu{cpu} busy, got {busy}%"
    );
    assert!(report
        .rows
        .iter()
        .any(|r| r.source == "cpu" && r.subject == format!("cpu{cpu}")));
    let mut csv = Vec::new();
    report.write_csv(&mut csv).unwrap();
    let csv = String::from_utf8(csv).unwrap();
    assert!(csv.starts_with("t_s,source,subject,metric,value\n"));
    assert_eq!(csv.lines().count(), report.rows.len() + 1);
}

/// The CPU cost of a loopback TCP transfer, as the samplers see it: `lo`'s byte counters grow by at
/// least the bytes sent, and the CPUs were busy while it ran.
#[test]
fn live_sampler_measures_a_loopback_transfer() {
    use std::io::{Read, Write};
    let live = SysRoot::live();
    if live.read("/sys/class/net/lo/statistics/tx_bytes").is_err() {
        println!("SKIP: no loopback counters in /sys/class/net/lo/statistics");
        return;
    }
    const BYTES: usize = 256 << 20;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = Sampler::start(live, Duration::from_millis(50)).unwrap();
    let receiver = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < BYTES {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "sender closed early at {got} bytes");
            got += n;
        }
        got
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..BYTES / chunk.len() {
        s.write_all(&chunk).unwrap();
    }
    assert_eq!(receiver.join().unwrap(), BYTES);
    let report = handle.stop().unwrap();
    let sum = &report.summary;
    let lo = sum
        .nics
        .iter()
        .find(|n| n.nic == "lo")
        .expect("lo in the NIC summary");
    assert!(
        lo.tx_bytes >= BYTES as u64,
        "lo tx grew by {} < {BYTES}",
        lo.tx_bytes
    );
    assert!(lo.rx_bytes >= BYTES as u64);
    assert!(sum.all_cpus.busy_pct > 0.0);
    // Moving 256 MiB through the kernel twice costs this process measurable CPU time.
    let own = sum
        .process_cpu_s
        .expect("process CPU time on the live root");
    assert!(own > 0.0, "{own}");
    assert!(report.rows.iter().any(|r| r.source == "process"));
    let cpu_s: f64 = sum
        .cpus
        .iter()
        .map(|c| c.busy_pct / 100.0 * sum.duration_s)
        .sum();
    println!(
        "live: {:.0} MB over lo in {:.2} s ({:.2} GB/s): machine CPU busy {:.0}% of {} CPUs (system {:.0}%, softirq {:.0}%), softirq share {:.0}%, {:.2} machine CPU-s per GB, this process {:.2} CPU-s, tcp retrans {:?}",
        lo.tx_bytes as f64 / 1e6,
        sum.duration_s,
        lo.tx_gbps,
        sum.all_cpus.busy_pct,
        sum.cpus.len(),
        sum.all_cpus.system_pct,
        sum.all_cpus.softirq_pct,
        sum.softirq_share_pct,
        cpu_s / (lo.tx_bytes as f64 / 1e9),
        sum.process_cpu_s.unwrap_or(f64::NAN),
        sum.tcp.as_ref().map(|t| t.retrans_segs)
    );
}
