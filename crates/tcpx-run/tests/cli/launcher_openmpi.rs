//! Real Open MPI (Debian 12's openmpi-bin, 4.1): `mpirun -np 4 --oversubscribe --host n1:2,n2:2
//! tcpx-run plan.rhai` on two hosts emulated on this machine (see `launched.rs`), mpirun
//! reaching the second host through its rsh agent as it would through ssh (here a script that
//! runs the daemon's command as that host). The same command on every rank, roles from Open
//! MPI's own variables (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK): rank 0 leads, rank 2
//! (the first on the second host) follows, ranks 1 and 3 exit, and the pair moves verified
//! bytes. Open MPI names no leader host, so TCPX_LEADER does. On one host alone the 4 ranks
//! would be local ranks 0..3 of one node: one leader and no follower, by design (one process per
//! node). Needs root, `ip netns` and openmpi-bin (ci/setup-debian.sh installs it); skipped
//! visibly otherwise. Everything runs in a network namespace of the test's, removed afterwards
//! with every process in it.

use crate::harness;
use crate::launched;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use harness::plan_dir;
use launched::{assert_verified_report, program_path, write_script, Hosts};

/// `mpirun` on the emulated hosts `n1` and `n2` (2 slots each) of `hosts`, through an rsh
/// agent: mpirun calls it as `agent HOST COMMAND...`, the command meant for the remote shell (as
/// ssh joins it), and it runs that as HOST. Then `-np 4 --oversubscribe` and the plan run, with
/// TCPX_LEADER `leader` exported to the ranks (none: neither it nor MASTER_ADDR).
fn mpirun(
    hosts: &Hosts,
    plan: &std::path::Path,
    reports: &std::path::Path,
    leader: Option<&str>,
) -> Command {
    let agent = hosts.path().join("rsh-as-host");
    write_script(
        &agent,
        "#!/bin/sh\n# rsh-as-host HOST CMD...: mpirun's rsh agent, running CMD as host HOST on this machine\n\
         host=$1; shift\n\
         exec \"$(dirname \"$0\")/as-host\" \"$host\" sh -c \"$*\"\n",
    );
    let mut mpirun = hosts.cmd("ctl", program_path("mpirun"));
    mpirun
        .args(launched::mpirun_args())
        .args(["--mca", "plm_rsh_agent"])
        .arg(&agent)
        .args(["--host", "n1:2,n2:2", "-np", "4", "--oversubscribe"])
        .arg("--output-filename")
        .arg(hosts.path().join("ranks"))
        .args(["-x", "TCPX_RUN_TOKEN"]);
    match leader {
        Some(l) => {
            mpirun.args(["-x", "TCPX_LEADER"]).env("TCPX_LEADER", l);
        }
        None => {
            mpirun.env_remove("TCPX_LEADER").env_remove("MASTER_ADDR");
        }
    }
    mpirun
        .arg(harness::bin())
        .arg(plan)
        .arg("--reports")
        .arg(reports)
        .args(["--follower-timeout", "60"])
        .env("TCPX_RUN_TOKEN", launched::TOKEN)
        // Open MPI's session directories go with the test's.
        .env("TMPDIR", hosts.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    mpirun
}

/// Why an Open MPI launcher test cannot run here, if it cannot.
fn skip_reason() -> Option<String> {
    harness::netns_skip_reason().or_else(|| launched::missing_program(&["mpirun"], "openmpi-bin"))
}

/// The launched plan under mpirun on 2 emulated hosts (namespace `tag`, TCPX_LEADER `leader`)
/// for test `test`: the hosts (to stop), the plan run's reports folder, mpirun's output and all
/// it printed; `None` after a visible skip.
fn run_mpirun(
    test: &str,
    tag: &str,
    leader: Option<&str>,
) -> Option<(Hosts, PathBuf, Output, String)> {
    if let Some(why) = skip_reason() {
        let _ = writeln!(std::io::stderr().lock(), "SKIP: {test}: {why}");
        return None;
    }
    let hosts = Hosts::new(tag, 2);
    let (_plans, plan) = plan_dir("launched", launched::PLAN);
    let reports = hosts.path().join("reports");
    let (out, all) = launched::run_launcher("mpirun", &mut mpirun(&hosts, &plan, &reports, leader));
    Some((hosts, reports, out, all))
}

#[test]
fn mpirun_on_two_hosts_starts_a_leader_and_a_follower_that_move_verified_bytes() {
    let Some((mut hosts, reports, out, all)) = run_mpirun(
        "mpirun_on_two_hosts_starts_a_leader_and_a_follower_that_move_verified_bytes",
        "ompi",
        Some("n1"),
    ) else {
        return;
    };
    assert_eq!(out.status.code(), Some(0), "{all}");
    launched::assert_open_mpi_roles(&hosts.path().join("ranks"), &all);
    assert!(assert_verified_report(&reports, "n1", &all) >= 1);
    let left = hosts.stop();
    assert!(left.is_empty(), "processes left in the namespace: {left:?}");
}

/// Open MPI names no leader host (no MASTER_ADDR in its ranks' environment): without
/// TCPX_LEADER the follower says what to set, and mpirun ends the job on its exit code.
#[test]
fn mpirun_without_a_leader_host_says_to_set_tcpx_leader() {
    let Some((mut hosts, _reports, out, all)) = run_mpirun(
        "mpirun_without_a_leader_host_says_to_set_tcpx_leader",
        "ompi-noleader",
        None,
    ) else {
        return;
    };
    assert_ne!(out.status.code(), Some(0), "{all}");
    let (_, err2) = launched::rank_output(&hosts.path().join("ranks"), 2);
    assert!(
        err2.contains("rank 2 under openmpi has no leader address: set TCPX_LEADER or MASTER_ADDR"),
        "rank 2:\n{err2}\n{all}"
    );
    let left = hosts.stop();
    assert!(left.is_empty(), "processes left in the namespace: {left:?}");
}
