//! Flow processes never outlive their parent: SIGKILL, SIGTERM or SIGINT sent to the PID of a
//! `tcpx-run bench --multi-process` parent (not its process group) ends every flow process within
//! a few seconds. Real processes; every wait polls /proc against a deadline.

use crate::harness;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The parent pid and state of process `pid`, or `None` once it is gone.
fn stat(pid: u32) -> Option<(u32, char)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| stat(p).is_some_and(|(pp, _)| pp == pid))
        .collect()
}

/// Whether `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: u32) -> bool {
    stat(pid).is_none_or(|(_, state)| state == 'Z' || state == 'X')
}

fn parent_killed_by(signal: nix::sys::signal::Signal) {
    let port = harness::free_ports(2).to_string();
    // A shell that starts a job in the background without job control (`cmd &` in a script,
    // nohup) leaves SIGINT ignored, and an ignored signal stays ignored across exec: coreutils'
    // `env --default-signal` gives the parent the default dispositions a terminal would.
    let mut parent = Command::new("env")
        .args(["--default-signal=INT,TERM,HUP", harness::bin()])
        .args([
            "bench",
            "--multi-process",
            "--role",
            "local",
            "--flows",
            "2",
        ])
        .args(["--port", &port, "--size", "1M", "--iters", "1000000"])
        .args([
            "--warmup",
            "0",
            "--channels",
            "1",
            "--socks-per-channel",
            "1",
        ])
        .args(["--no-csv", "--timeout", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = parent.id();
    // Two flows, both sides: four flow processes.
    let deadline = Instant::now() + Duration::from_secs(60);
    let kids = loop {
        let kids = children_of(pid);
        if kids.len() == 4 {
            break kids;
        }
        if Instant::now() > deadline || parent.try_wait().unwrap().is_some() {
            let _ = parent.kill();
            panic!("the parent never had its 4 flow processes (saw {kids:?})");
        }
        std::thread::yield_now();
    };
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).unwrap();
    let status = tcpx_test_support::wait_within(
        &mut parent,
        Duration::from_secs(10),
        Duration::from_millis(10),
    )
    .unwrap_or_else(|| panic!("the parent did not end within 10 s of {signal}"));
    assert!(!status.success(), "{status:?}");
    let all_ended = || kids.iter().all(|&k| ended(k));
    if !tcpx_test_support::poll_until(Duration::from_secs(5), Duration::from_millis(10), all_ended)
    {
        let left: Vec<u32> = kids.iter().copied().filter(|&k| !ended(k)).collect();
        for &k in &left {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(k as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        panic!("flow processes {left:?} outlived their parent ({signal})");
    }
}

#[test]
fn flow_processes_die_when_the_parent_is_killed() {
    parent_killed_by(nix::sys::signal::Signal::SIGKILL);
}

#[test]
fn flow_processes_die_when_the_parent_is_terminated() {
    parent_killed_by(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn flow_processes_die_when_the_parent_is_interrupted() {
    parent_killed_by(nix::sys::signal::Signal::SIGINT);
}
