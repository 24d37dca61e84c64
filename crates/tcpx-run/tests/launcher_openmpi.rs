//! Real Open MPI (Debian 12's openmpi-bin, 4.1): `mpirun -np 4 --oversubscribe --host n1:2,n2:2
//! tcpx-run plan.rhai` on two hosts emulated on this machine (see `launched/mod.rs`), mpirun
//! reaching the second host through its rsh agent as it would through ssh (here a script that
//! runs the daemon's command as that host). The same command on every rank, roles from Open
//! MPI's own variables (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK): rank 0 leads, rank 2
//! (the first on the second host) follows, ranks 1 and 3 exit, and the pair moves verified
//! bytes. Open MPI names no leader host, so TCPX_LEADER does. On one host alone the 4 ranks
//! would be local ranks 0..3 of one node: one leader and no follower, by design (one process per
//! node). Needs root, `ip netns` and openmpi-bin (ci/setup-debian.sh installs it); skipped
//! visibly otherwise. Everything runs in a network namespace of the test's, removed afterwards
//! with every process in it.

mod common;
mod launched;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::{output_within, plan_dir};
use launched::{assert_verified_report, program_path, text, write_script, Hosts};

#[test]
fn mpirun_on_two_hosts_starts_a_leader_and_a_follower_that_move_verified_bytes() {
    let test = "mpirun_on_two_hosts_starts_a_leader_and_a_follower_that_move_verified_bytes";
    let why = common::netns_skip_reason()
        .or_else(|| launched::missing_program(&["mpirun"], "openmpi-bin"));
    if let Some(why) = why {
        let _ = writeln!(std::io::stderr().lock(), "SKIP: {test}: {why}");
        return;
    }
    let mut hosts = Hosts::new("ompi", 2);
    // mpirun calls its rsh agent as `agent HOST COMMAND...`, the command meant for the remote
    // shell (as ssh joins it): run it there as HOST.
    let agent = hosts.path().join("rsh-as-host");
    write_script(
        &agent,
        "#!/bin/sh\n# rsh-as-host HOST CMD...: mpirun's rsh agent, running CMD as host HOST on this machine\n\
         host=$1; shift\n\
         exec \"$(dirname \"$0\")/as-host\" \"$host\" sh -c \"$*\"\n",
    );
    let (_plans, plan) = plan_dir("launched", launched::PLAN);
    let reports = hosts.path().join("reports");
    let mut mpirun = hosts.cmd("ctl", program_path("mpirun"));
    mpirun
        .args(launched::mpirun_args())
        .args(["--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args(["--host", "n1:2,n2:2", "-np", "4", "--oversubscribe"])
        .args(["-x", "TCPX_RUN_TOKEN", "-x", "TCPX_LEADER"])
        .arg(common::bin())
        .arg(&plan)
        .arg("--reports")
        .arg(&reports)
        .args(["--follower-timeout", "60"])
        .env("TCPX_RUN_TOKEN", launched::TOKEN)
        .env("TCPX_LEADER", "n1")
        // Open MPI's session directories go with the test's.
        .env("TMPDIR", hosts.path());
    let out = output_within(
        mpirun
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(180),
    )
    .unwrap_or_else(|o| panic!("mpirun ran past 180 s: {}", text(&o)));
    let (all, err) = (text(&out), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{all}");
    for says in [
        "tcpx-run: rank 2 (openmpi) follows the leader at n1:5310",
        "tcpx-run: rank 1 is local rank 1 of its node under openmpi",
        "tcpx-run: rank 3 is local rank 1 of its node under openmpi",
        "tcpx-run: waiting for a follower on 0.0.0.0:5310",
        "(run token proven both ways)",
    ] {
        assert!(err.contains(says), "should say `{says}`:\n{all}");
    }
    for once in ["follows the leader", "waiting for a follower"] {
        assert_eq!(
            err.matches(once).count(),
            1,
            "one leader, one follower:\n{all}"
        );
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("plan launched: PASS"),
        "{all}"
    );
    assert!(assert_verified_report(&reports, &all) >= 1);
    let left = hosts.stop();
    assert!(left.is_empty(), "processes left in the namespace: {left:?}");
}
