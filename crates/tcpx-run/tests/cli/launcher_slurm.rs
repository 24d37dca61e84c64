//! Real Slurm (Debian 12's slurmctld, slurmd, srun and munged; 22.05) started by the test: a
//! controller on host `ctl` and two compute nodes `n1`, `n2`, each slurmd as its own emulated
//! host (see `launched.rs`), configured in a temporary directory (root as SlurmUser, munge
//! with a fresh key and its own socket, state, spool, PID and log files there) inside a network
//! namespace of the test's. Then `srun -N 2 -n 4 tcpx-run plan.rhai`: the same command on every
//! task, roles from Slurm's own variables (SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID and the
//! leader from SLURM_JOB_NODELIST): node 0's first task leads, node 1's first task follows, the
//! second task of each node exits, and the pair moves verified bytes. And `salloc -N 2 mpirun`,
//! Open MPI inside a Slurm allocation (its ranks carry the Slurm variables of the step that
//! started them as well as Open MPI's own). Needs root, `ip netns` and the packages
//! (ci/setup-debian.sh installs them); skipped visibly otherwise. Every daemon is stopped and the
//! namespace and directory removed afterwards, pass or fail; the daemons' logs are printed on
//! failure.

use crate::harness::{self, RunWithDeadline as _};
use crate::launched;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use harness::plan_dir;
use launched::{assert_verified_report, program_path, Hosts};

const SLURM_PROGRAMS: [&str; 6] = ["slurmctld", "slurmd", "srun", "salloc", "sinfo", "munged"];

/// Skips the test visibly (`SKIP: <test>: <reason>`, listed by `cargo xtask ci`).
macro_rules! skip_unless {
    ($test:expr, $why:expr) => {
        if let Some(why) = $why {
            let _ = writeln!(std::io::stderr().lock(), "SKIP: {}: {why}", $test);
            return;
        }
    };
}

/// A running single-machine Slurm cluster: munged, slurmctld on `ctl`, slurmd on `n1` and `n2`,
/// both nodes idle.
struct Cluster {
    hosts: Hosts,
}

impl Cluster {
    fn start(tag: &str) -> Cluster {
        let mut hosts = Hosts::new(tag, 2);
        let d = hosts.path().to_path_buf();
        for sub in ["munge", "state", "spool-n1", "spool-n2"] {
            std::fs::create_dir(d.join(sub)).unwrap();
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.join("munge"), std::fs::Permissions::from_mode(0o700)).unwrap();
        // munged wants a key of at least 32 bytes that only its user can read.
        let mut key = vec![0u8; 128];
        {
            use std::io::Read;
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut key))
                .expect("reading /dev/urandom for the munge key");
        }
        let key_path = d.join("munge/munge.key");
        std::fs::write(&key_path, &key).unwrap();
        std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o400)).unwrap();
        let socket = d.join("munge/munge.socket");
        let mut munged = hosts.cmd("ctl", program_path("munged"));
        munged
            .args(["--foreground", "--force", "--origin=127.0.0.1"])
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", key_path.display()))
            .arg(format!(
                "--pid-file={}",
                d.join("munge/munged.pid").display()
            ))
            .arg(format!("--seed-file={}", d.join("munge/seed").display()))
            .arg(format!("--log-file={}", d.join("log/munged.log").display()));
        hosts.start("munged", munged);
        hosts.wait_until("munged's socket", Duration::from_secs(20), || {
            socket.exists()
        });
        let conf = d.join("slurm.conf");
        std::fs::write(&conf, slurm_conf(&d)).unwrap();
        // cgroup/v1 with nothing that uses it (proctrack/linuxproc, task/none): slurmd loads a
        // cgroup plugin in any case, and autodetection fails where /sys/fs/cgroup is unusual.
        std::fs::write(
            d.join("cgroup.conf"),
            "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n",
        )
        .unwrap();
        std::fs::write(d.join("plugstack.conf"), "").unwrap();
        let mut ctld = hosts.cmd("ctl", program_path("slurmctld"));
        ctld.args(["-D", "-i"]).env("SLURM_CONF", &conf);
        hosts.start("slurmctld", ctld);
        for node in ["n1", "n2"] {
            let mut slurmd = hosts.cmd(node, program_path("slurmd"));
            slurmd.arg("-D").env("SLURM_CONF", &conf);
            hosts.start(&format!("slurmd-{node}"), slurmd);
        }
        let mut cluster = Cluster { hosts };
        let mut last = String::new();
        // Each query bounded too (a controller that accepts and never answers).
        let mut sinfo = cluster.hosts.cmd("ctl", "timeout");
        sinfo
            .arg("10")
            .arg(program_path("sinfo"))
            .args(["-h", "-N", "-o", "%N=%t"])
            .env("SLURM_CONF", &conf);
        cluster
            .hosts
            .wait_until("both nodes idle in sinfo", Duration::from_secs(60), || {
                last = sinfo
                    .output_with_deadline()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                let idle = |n: &str| last.lines().any(|l| l.trim() == format!("{n}=idle"));
                idle("n1") && idle("n2")
            });
        cluster
    }

    /// A Slurm client command run on the controller's host.
    fn cmd(&self, program: &str) -> Command {
        let mut c = self.hosts.cmd("ctl", program_path(program));
        c.env("SLURM_CONF", self.hosts.path().join("slurm.conf"));
        c
    }
}

/// slurm.conf for the cluster in `d`: root runs everything, munge through the test's socket,
/// no cgroups or accounting, two nodes of 2 CPUs (whatever this machine has) on their own
/// addresses and slurmd ports.
fn slurm_conf(d: &std::path::Path) -> String {
    let d = d.display();
    format!(
        "ClusterName=tcpxtest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
SlurmctldPort=6817
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool-%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SchedulerType=sched/builtin
MailProg=/bin/true
PlugStackConfig={d}/plugstack.conf
NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.11 Port=6818 CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=n2 NodeAddr=127.0.0.12 Port=6819 CPUs=2 State=UNKNOWN
PartitionName=test Nodes=n1,n2 Default=YES MaxTime=5 State=UP
"
    )
}

#[test]
fn srun_on_two_nodes_starts_a_leader_and_a_follower_that_move_verified_bytes() {
    let test = "srun_on_two_nodes_starts_a_leader_and_a_follower_that_move_verified_bytes";
    skip_unless!(test, harness::netns_skip_reason());
    skip_unless!(
        test,
        launched::missing_program(&SLURM_PROGRAMS, "slurmctld, slurmd, slurm-client, munge")
    );
    let mut cluster = Cluster::start("slurm");
    let (_plans, plan) = plan_dir("launched", launched::PLAN);
    let reports = cluster.hosts.path().join("reports");
    let mut srun = cluster.cmd("srun");
    // Four tasks on two nodes, labelled by task; the same command on each.
    srun.args(["-N", "2", "-n", "4", "-l", "-t", "2"])
        .arg(harness::bin())
        .arg(&plan)
        .arg("--reports")
        .arg(&reports)
        .args(["--follower-timeout", "60"])
        .env("TCPX_RUN_TOKEN", launched::TOKEN);
    let (out, all) = launched::run_launcher("srun", &mut srun);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{all}");
    // Roles from Slurm's variables: task 0 (node 0, local 0) leads and is found by the others
    // through the node list's first host; task 2 (node 1, local 0) follows; tasks 1 and 3
    // (local rank 1) exit.
    for says in [
        "2: tcpx-run: rank 2 (slurm) follows the leader at n1:5310",
        "1: tcpx-run: rank 1 is local rank 1 of node 0 under slurm",
        "3: tcpx-run: rank 3 is local rank 1 of node 1 under slurm",
        "0: tcpx-run: waiting for a follower on 0.0.0.0:5310",
        "(run token proven both ways)",
    ] {
        assert!(err.contains(says), "should say `{says}`:\n{all}");
    }
    assert!(
        !err.contains("0: tcpx-run: rank 0") && err.matches("follows the leader").count() == 1,
        "one follower, and task 0 leads:\n{all}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("0: plan launched: PASS"),
        "{all}"
    );
    assert!(assert_verified_report(&reports, "n1", &all) >= 1);
    let left = cluster.hosts.stop();
    assert!(
        left.is_empty(),
        "processes left after the cluster stopped: {left:?}"
    );
}

/// Open MPI inside a Slurm allocation (`salloc -N 2 mpirun`): mpirun finds the nodes in the
/// allocation and starts its daemons through srun, so every rank also carries the Slurm
/// variables of the daemon's step (the same SLURM_PROCID, SLURM_LOCALID 0 for both ranks of a
/// node). The roles must come from Open MPI's variables, the innermost launcher's.
#[test]
fn mpirun_inside_a_slurm_allocation_takes_roles_from_open_mpi() {
    let test = "mpirun_inside_a_slurm_allocation_takes_roles_from_open_mpi";
    skip_unless!(test, harness::netns_skip_reason());
    skip_unless!(
        test,
        launched::missing_program(&SLURM_PROGRAMS, "slurmctld, slurmd, slurm-client, munge")
    );
    skip_unless!(test, launched::missing_program(&["mpirun"], "openmpi-bin"));
    let mut cluster = Cluster::start("slmpi");
    let (_plans, plan) = plan_dir("launched", launched::PLAN);
    let reports = cluster.hosts.path().join("reports");
    let mut salloc = cluster.cmd("salloc");
    salloc
        .args(["-N", "2", "-n", "4", "-t", "2"])
        .arg(program_path("mpirun"))
        .args(launched::mpirun_args())
        .args(["-np", "4", "--output-filename"])
        .arg(cluster.hosts.path().join("ranks"))
        .arg(harness::bin())
        .arg(&plan)
        .arg("--reports")
        .arg(&reports)
        .args(["--follower-timeout", "60"])
        .env("TCPX_RUN_TOKEN", launched::TOKEN)
        // Open MPI's session directories go with the test's.
        .env("TMPDIR", cluster.hosts.path())
        // Open MPI names no leader host: the user says which (rank 0 runs on the first node).
        .env("TCPX_LEADER", "n1");
    let (out, all) = launched::run_launcher("salloc mpirun", &mut salloc);
    assert_eq!(out.status.code(), Some(0), "{all}");
    launched::assert_open_mpi_roles(&cluster.hosts.path().join("ranks"), &all);
    assert!(assert_verified_report(&reports, "n1", &all) >= 1);
    let left = cluster.hosts.stop();
    assert!(
        left.is_empty(),
        "processes left after the cluster stopped: {left:?}"
    );
}
