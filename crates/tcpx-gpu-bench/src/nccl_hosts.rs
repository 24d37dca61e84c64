//! `nccl` with both ranks on one GPU: each rank in a process of its own (this binary's hidden
//! `nccl-rank` subcommand) with its own `NCCL_HOSTID`
//! ([`tcpx_transport::nccl::shared_gpu_host_ids`]), meeting at an `NCCL_COMM_ID` on 127.0.0.1.
//! NCCL then sees two nodes and carries the bytes over its network transport (NET/Socket or a
//! net plugin), which is what a one-GPU machine can compare the other backends with. Rank 0
//! sends, rank 1 receives and prints the figures (the receiver's time per transfer, as
//! `tcpx-run validate` measures it); the received bytes are verified after the timed runs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tcpx_ffi::nccl::{allreduce_bus_bandwidth, Nccl};
use tcpx_gpu::Device;
use tcpx_transport::nccl::{describe_shared_gpu, shared_gpu_host_ids, HOSTID_VAR};
use tcpx_validate::rank::{init_comm, step};
use tcpx_validate::Collective::{AllReduce, SendRecv};

use crate::{emit, human, median, nccl_env, parse_list, report_p2p};

/// What both rank processes are asked to measure.
pub struct RankJob<'a> {
    pub sizes: &'a str,
    pub iters: usize,
    pub gpu: usize,
    pub label: &'a str,
    pub allreduce: bool,
    pub deadline: Duration,
}

impl RankJob<'_> {
    fn args(&self, rank: usize) -> Vec<String> {
        let mut a = vec![
            "nccl-rank".to_string(),
            format!("--rank={rank}"),
            format!("--sizes={}", self.sizes),
            format!("--iters={}", self.iters),
            format!("--gpu={}", self.gpu),
            format!("--label={}", self.label),
            format!("--deadline-s={}", self.deadline.as_secs().max(1)),
        ];
        if self.allreduce {
            a.push("--allreduce".into());
        }
        a
    }
}

/// Kills and reaps every child still running.
fn stop(children: &mut [(usize, Child)]) {
    for (_, c) in children.iter_mut() {
        if matches!(c.try_wait(), Ok(None)) {
            let _ = c.kill();
        }
        let _ = c.wait();
    }
}

/// The parent: starts rank 0 and rank 1 on `job.gpu` and waits for both (rank 1's output is
/// this process's); a rank that fails or outlives the whole run's deadline ends both.
pub fn run(job: &RankJob<'_>) -> Result<()> {
    let sizes = parse_list(job.sizes)?;
    let steps = sizes.len() * (job.iters + 1) * if job.allreduce { 2 } else { 1 } + 4;
    let limit = job
        .deadline
        .saturating_mul(steps.min(u32::MAX as usize) as u32);
    let exe = std::env::current_exe().context("finding this program to start the ranks")?;
    // NCCL's rendezvous: rank 0 listens here. Taken from the kernel and let go just before; a
    // port taken in between fails rank 0's init with the address in its error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free port on 127.0.0.1 for NCCL_COMM_ID")?
        .port();
    let ids = shared_gpu_host_ids(2);
    eprintln!(
        "tcpx-gpu-bench nccl: {}, one process each, NCCL_COMM_ID 127.0.0.1:{port}",
        describe_shared_gpu(job.gpu, &ids)
    );
    let mut children: Vec<(usize, Child)> = Vec::new();
    for (rank, id) in ids.iter().enumerate() {
        let mut cmd = Command::new(&exe);
        cmd.args(job.args(rank))
            .env(HOSTID_VAR, id)
            .env("NCCL_COMM_ID", format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(if rank == 1 {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        match cmd.spawn() {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                stop(&mut children);
                bail!("starting rank {rank} ({}): {e}", exe.display());
            }
        }
    }
    let deadline = Instant::now() + limit;
    let mut failed = Vec::new();
    let mut done = [false; 2];
    while done.iter().any(|d| !d) {
        for (rank, c) in children.iter_mut() {
            if done[*rank] {
                continue;
            }
            match c.try_wait() {
                Ok(Some(s)) => {
                    done[*rank] = true;
                    if !s.success() {
                        failed.push(format!("rank {rank} exited with {s}"));
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    done[*rank] = true;
                    failed.push(format!("rank {rank}: waiting for it: {e}"));
                }
            }
        }
        if !failed.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let late: Vec<usize> = (0..2).filter(|&r| !done[r]).collect();
    stop(&mut children);
    if !failed.is_empty() {
        bail!(
            "{} (its stderr above says why; the other rank was stopped)",
            failed.join("; ")
        );
    }
    if !late.is_empty() {
        bail!(
            "rank(s) {late:?} did not finish within {limit:?} and were killed: is NCCL's network \
             reachable (NCCL_SOCKET_IFNAME=lo on one machine)? NCCL_DEBUG=INFO shows its view"
        );
    }
    Ok(())
}

/// One rank process (`nccl-rank`): `NCCL_HOSTID` and `NCCL_COMM_ID` come from the parent.
pub fn rank(rank: usize, job: &RankJob<'_>) -> Result<()> {
    anyhow::ensure!(rank < 2, "rank {rank}: the ranks are 0 and 1");
    let sizes = parse_list(job.sizes)?;
    let Some(&max) = sizes.iter().max() else {
        bail!("no sizes given")
    };
    let nccl = Nccl::load()?;
    let dev = Device::open(job.gpu)?;
    if rank == 1 {
        eprintln!("{nccl:?}; {dev:?} as 2 NCCL hosts; env {}", nccl_env());
    }
    let mut comm = init_comm(nccl, &dev, rank, job.deadline)?;
    let stream = dev.new_stream()?;
    let buf = dev.alloc(max.max(4))?;
    let label = job.label;
    let placement = describe_shared_gpu(job.gpu, &shared_gpu_host_ids(2));
    for (k, &n) in sizes.iter().enumerate() {
        let seed = 0x5eed_0000 + k as u64;
        // Rank 0 sends the pattern; rank 1 poisons first, so a missed write is caught.
        stream.fill_pattern(&buf, 0, n, if rank == 0 { seed } else { seed ^ 0xdead }, 0)?;
        stream.synchronize()?;
        step(nccl, &mut comm, SendRecv, &buf, &stream, n, job.deadline)?; // warm-up / connect
        let mut secs = Vec::with_capacity(job.iters);
        for _ in 0..job.iters {
            let t = Instant::now();
            step(nccl, &mut comm, SendRecv, &buf, &stream, n, job.deadline)?;
            secs.push(t.elapsed().as_secs_f64());
        }
        if rank == 1 {
            let bad = stream.verify_pattern(&buf, 0, n, seed, 0)?;
            let gpus = (job.gpu, job.gpu);
            report_p2p(nccl, label, n, bad, &secs, gpus, Some(&placement))?;
        }
    }
    if job.allreduce {
        for &n in &sizes {
            let n = n / 4 * 4;
            if n == 0 {
                continue;
            }
            let mut secs = Vec::new();
            for i in 0..=job.iters {
                let t = Instant::now();
                step(nccl, &mut comm, AllReduce, &buf, &stream, n, job.deadline)?;
                if i > 0 {
                    secs.push(t.elapsed().as_secs_f64());
                }
            }
            if rank == 1 {
                let med = median(secs);
                let busbw = allreduce_bus_bandwidth(n, med, 2) / 1e9;
                println!(
                    "nccl-allreduce {label:>10} {:>6}  busbw {busbw:7.2} GB/s  ({placement})",
                    human(n)
                );
                emit(json!({"kind": "nccl_allreduce", "label": label, "bytes": n,
                    "median_s": med, "busbw_gbps": busbw, "algbw_gbps": n as f64 / med / 1e9,
                    "placement": placement, "env": nccl_env()}));
            }
        }
        // What the all-reduce summed is checked: 1 on rank 0 plus 2 on rank 1 is 3 everywhere.
        let count = (1 << 18).min(max / 4);
        if count > 0 {
            let ones: Vec<u8> = std::iter::repeat_n((rank as f32 + 1.0).to_ne_bytes(), count)
                .flatten()
                .collect();
            buf.write_from_host(0, &ones)?;
            dev.synchronize()?;
            step(
                nccl,
                &mut comm,
                AllReduce,
                &buf,
                &stream,
                count * 4,
                job.deadline,
            )?;
            let mut back = vec![0u8; count * 4];
            buf.read_to_host(0, &mut back)?;
            if let Some(i) = back
                .chunks_exact(4)
                .position(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) != 3.0)
            {
                bail!("ncclAllReduce summed wrong on rank {rank}: element {i} is not 1 + 2");
            }
        }
    }
    // Neither rank closes its connections before the other is done (a sender that exits at
    // once can cut a network receiver short): a one-element all-reduce is the barrier.
    step(nccl, &mut comm, AllReduce, &buf, &stream, 4, job.deadline)
        .context("the closing barrier (a one-element all-reduce)")?;
    Ok(())
}
