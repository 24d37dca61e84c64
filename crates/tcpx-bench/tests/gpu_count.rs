//! Two "nodes" that disagree on how many GPUs they have: the receiving node (a child process
//! that sees one GPU through `CUDA_VISIBLE_DEVICES=0`) cannot hold a 2-flow experiment, refuses
//! it, and the sending node (this process, two GPUs) is told why instead of timing out. Needs two
//! GPUs; skips visibly otherwise.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};

use tcpx_bench::{Experiment, Measurement};

const ROLE: &str = "TCPX_GPU_COUNT_TEST_ROLE";

fn experiment() -> Experiment {
    Experiment {
        name: "gpu-count".into(),
        flows: 2,
        memory: tcpx_bench::Memory::Cuda,
        sizes: vec![1 << 20],
        iters: 1,
        warmup: 0,
        channels: 1,
        timeout_s: 20.0,
        ..Experiment::default()
    }
}

/// The receiving node. Does its work only when started by the test below (with [`ROLE`] set);
/// run on its own it has nothing to do.
#[test]
fn receiving_node_child() {
    if std::env::var(ROLE).as_deref() != Ok("server") {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("PORT {}", listener.local_addr().unwrap().port());
    let r = tcpx_bench::run_server(&experiment(), listener, &mut |_: &Measurement| {});
    match r {
        Ok(_) => println!("SERVER OK"),
        Err(e) => println!("SERVER ERROR {e}"),
    }
}

#[test]
fn a_node_with_fewer_gpus_than_flows_refuses_and_its_peer_is_told() {
    let Some(_gpus) = tcpx_gpu::testing::gpus_or_skip("mismatched GPU counts between nodes", 2)
    else {
        return;
    };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "receiving_node_child", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(ROLE, "server")
        .env("CUDA_VISIBLE_DEVICES", "0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut port = None;
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        // libtest prints "test receiving_node_child ... " before the child's own output, on
        // the same line.
        if let Some((_, p)) = line.trim().split_once("PORT ") {
            port = Some(p.trim().parse::<u16>().unwrap());
            break;
        }
        line.clear();
    }
    let port = port.expect("the child printed its port");
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let err = tcpx_bench::run_client(&experiment(), addr, &mut |_: &Measurement| {})
        .expect_err("the receiving node has one GPU for two flows")
        .to_string();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(child.wait().unwrap().success(), "{rest}");
    let want = "2 flows need 2 GPUs on the recv side (one GPU per flow), but this machine has 1";
    assert!(
        rest.contains("SERVER ERROR") && rest.contains(want),
        "server: {rest}"
    );
    assert!(
        err.contains("refused") && err.contains(want) && err.contains("CUDA_VISIBLE_DEVICES=0"),
        "client: {err}"
    );
}
