//! Two real NICs without two machines: the test creates two network namespaces joined by a veth
//! pair, runs the server in one and the client in the other (each thread enters its namespace;
//! the threads it starts inherit it), and always deletes both namespaces again, also when an
//! assertion fails. Needs root and `ip`; skips visibly otherwise.

use std::net::SocketAddr;
use std::process::Command;

use tcpx_bench::{bind_control, run_client, run_server, Experiment, Measurement};

mod common;

/// Deletes the namespaces it names when dropped (deleting a namespace removes its veth end, and
/// with it the pair).
struct Netns {
    names: Vec<String>,
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            let ok = Command::new("ip")
                .args(["netns", "del", n])
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!(
                    "WARNING: could not delete network namespace {n}: run `ip netns del {n}`"
                );
            }
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `f` on a thread that entered namespace `ns`.
fn in_netns<'scope, T: Send + 'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    ns: String,
    f: impl FnOnce() -> T + Send + 'scope,
) -> std::thread::ScopedJoinHandle<'scope, T> {
    s.spawn(move || {
        let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("namespace file");
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
}

/// Creates the namespaces (a: `va` 10.213.7.1, b: `vb` 10.213.7.2, a's end left down), or says
/// why not.
fn setup() -> Result<(Netns, [String; 2], [String; 2]), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("needs root to create network namespaces".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Err("the `ip` tool (iproute2) is not installed".into());
    }
    let pid = std::process::id();
    let ns = [format!("tcpx-test-{pid}-a"), format!("tcpx-test-{pid}-b")];
    let dev = [format!("tx{pid}a"), format!("tx{pid}b")];
    let mut guard = Netns { names: Vec::new() };
    for n in &ns {
        ip(&["netns", "add", n])?;
        guard.names.push(n.clone());
    }
    ip(&[
        "link", "add", &dev[0], "netns", &ns[0], "type", "veth", "peer", "name", &dev[1], "netns",
        &ns[1],
    ])?;
    ip(&["-n", &ns[0], "addr", "add", "10.213.7.1/24", "dev", &dev[0]])?;
    ip(&["-n", &ns[1], "addr", "add", "10.213.7.2/24", "dev", &dev[1]])?;
    for n in &ns {
        ip(&["-n", n, "link", "set", "lo", "up"])?;
    }
    ip(&["-n", &ns[1], "link", "set", &dev[1], "up"])?;
    Ok((guard, ns, dev))
}

#[test]
fn transfer_between_two_namespaces_over_a_veth_pair() {
    let (guard, ns, dev) = match setup() {
        Ok(x) => x,
        Err(why) => {
            eprintln!("SKIP: veth/netns test: {why}");
            return;
        }
    };
    let exp = Experiment {
        sizes: vec![4 << 20],
        flows: 1,
        chunk: Some(512 << 10),
        ..common::two_flows("netns")
    };
    std::thread::scope(|s| {
        // While a's end is down, naming it is an error that says so.
        let down = Experiment {
            nics: vec![dev[0].clone()],
            ..exp.clone()
        };
        let e = in_netns(s, ns[0].clone(), move || {
            tcpx_bench::nics::plan_nics(&down, None).unwrap_err()
        })
        .join()
        .unwrap();
        assert!(e.contains(&format!("NIC `{}` is down", dev[0])), "{e}");
    });
    ip(&["-n", &ns[0], "link", "set", &dev[0], "up"]).unwrap();
    // The carrier comes up a moment after the link (the kernel's link watch): wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for (n, d) in ns.iter().zip(&dev) {
        loop {
            let out = Command::new("ip")
                .args(["-n", n, "-br", "link", "show", "dev", d])
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if text.split_whitespace().nth(1) == Some("UP") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{d} in {n} did not come up within 10 s: {text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    let server_exp = Experiment {
        nics: vec![dev[0].clone()],
        ..exp.clone()
    };
    // Each side names its own NIC: the client's is the other end, by address this time.
    let client_exp = Experiment {
        nics: vec!["10.213.7.2".into()],
        ..exp
    };
    let control: SocketAddr = "10.213.7.1:0".parse().unwrap();
    let (client, server) = std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::channel();
        let srv = in_netns(s, ns[0].clone(), move || {
            let l = bind_control(control).map_err(|e| e.to_string())?;
            tx.send(l.local_addr().unwrap()).unwrap();
            run_server(&server_exp, l, &mut |_: &Measurement| {}).map_err(|e| e.to_string())
        });
        let addr = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("server bound its control port");
        let cli = in_netns(s, ns[1].clone(), move || {
            run_client(&client_exp, addr, &mut |_: &Measurement| {}).map_err(|e| e.to_string())
        });
        (cli.join().unwrap(), srv.join().unwrap())
    });
    let client = client.unwrap();
    let server = server.unwrap();
    assert_eq!(server.measurements[0].recv.wrong_bytes, Some(0));
    assert!(
        server.peer.starts_with("10.213.7.2:"),
        "the client came from the other namespace: {}",
        server.peer
    );
    let plan = client.nic_plan.unwrap();
    assert!(plan.per_flow[0]
        .iter()
        .all(|c| c.addr.to_string() == "10.213.7.2"));
    assert_eq!(
        server.nic_plan.unwrap().per_flow[0][1].name,
        dev[0],
        "server channels bound to the veth NIC"
    );
    drop(guard);
    assert!(
        !std::path::Path::new(&format!("/run/netns/{}", ns[0])).exists(),
        "namespace removed"
    );
}
