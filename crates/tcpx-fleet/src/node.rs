//! One node's side of a pair run, the same in the leader's process and in a follower's: the
//! receiver listens on its NIC address (a start-up probe and the bench's control port, each on a
//! port the kernel picks, never a wildcard address), the sender probes from its NIC address and
//! then runs the real `tcpx-bench` client, whose channels bind to its NIC address(es) through
//! the experiment's `nics`. Received bytes are checked when the experiment's `verify` is on.
//!
//! The probe is plain TCP on the same pair of addresses: the sender's `connect` time, the time
//! from its connection being up to the receiver's first byte (the receiver's accept and
//! answer), and the two together (time to first byte). The bench's own set-up (handshake,
//! data connections, warm-up) is its wall time less its timed iterations.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tcpx_bench::{Experiment, Outcome};

use super::proto::{FleetMsg, PairSide, SideReport};
use super::schedule::PairRun;

/// What a node needs to run its sides: its backend settings (with its NIC places in an emulated
/// fabric node) and its own NIC addresses (a leader's message naming another address is
/// refused).
#[derive(Debug, Clone)]
pub struct NodeCtx {
    pub backends: tcpx_bench::SideEnv,
    pub addrs: Vec<IpAddr>,
}

fn failed(run: u32, side: PairSide, error: String) -> FleetMsg {
    FleetMsg::Done {
        run,
        side,
        report: SideReport {
            error: Some(error),
            ..SideReport::default()
        },
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// This side's figures from a bench outcome (its first message size).
fn report_from(outcome: &Outcome, exp: &Experiment) -> SideReport {
    let Some(m) = outcome.measurements.first() else {
        return SideReport {
            error: Some("the bench returned no measurement".into()),
            ..SideReport::default()
        };
    };
    SideReport {
        error: None,
        gbps: Some(m.recv.algbw_gbs),
        p50_us: Some(m.recv.p50_us),
        bytes: m
            .size
            .saturating_mul(u64::from(exp.iters))
            .saturating_mul(u64::from(exp.flows)),
        wrong_bytes: m.recv.wrong_bytes.or(m.send.wrong_bytes),
        ..SideReport::default()
    }
}

/// Carries out a leader's `Serve` or `Send` for this node. Messages for the leader
/// (`Listening`, then `Done`) go to `tell`, from this thread or the worker thread returned.
pub fn execute(
    ctx: &Arc<NodeCtx>,
    msg: FleetMsg,
    tell: impl Fn(FleetMsg) + Send + 'static,
) -> Option<JoinHandle<()>> {
    match msg {
        FleetMsg::Serve { run, exp, listen } => serve(ctx, run, *exp, listen, tell),
        FleetMsg::Send {
            run,
            exp,
            from,
            to,
            probe_port,
            bench_port,
        } => send(ctx, run, *exp, from, to, probe_port, bench_port, tell),
        _ => None,
    }
}

/// The experiment a pair run's bench gets: the leader's, less the NIC addresses for a backend that
/// places its NICs itself (Google's plugin picks its NICs from its own variables and refuses a
/// channel bound to an address). The start-up probe still runs between the NIC addresses named.
fn bench_experiment(mut exp: Experiment) -> Experiment {
    if exp.transport.capabilities().nics.not_applied().is_some() {
        exp.nics.clear();
    }
    exp
}

fn check_own(ctx: &NodeCtx, addr: IpAddr, exp: &Experiment) -> Result<(), String> {
    let own = |a: &IpAddr| ctx.addrs.contains(a);
    let exp_own = exp
        .nics
        .iter()
        .all(|n| n.parse::<IpAddr>().is_ok_and(|a| own(&a)));
    if own(&addr) && exp_own {
        Ok(())
    } else {
        Err(format!(
            "the leader named address {addr} (or NICs {:?}), not among this node's NIC addresses {:?}",
            exp.nics, ctx.addrs
        ))
    }
}

fn serve(
    ctx: &Arc<NodeCtx>,
    run: PairRun,
    exp: Experiment,
    listen: IpAddr,
    tell: impl Fn(FleetMsg) + Send + 'static,
) -> Option<JoinHandle<()>> {
    let side = PairSide::Receiver;
    if let Err(e) = check_own(ctx, listen, &exp) {
        tell(failed(run.id, side, e));
        return None;
    }
    let exp = bench_experiment(exp);
    let bound = TcpListener::bind((listen, 0))
        .map_err(|e| format!("listening for the start-up probe on {listen}: {e}"))
        .and_then(|probe| {
            let bench =
                tcpx_bench::bind_control(SocketAddr::new(listen, 0)).map_err(|e| e.to_string())?;
            Ok((probe, bench))
        })
        .and_then(|(p, b)| {
            let pp = p.local_addr().map_err(|e| e.to_string())?.port();
            let bp = b.local_addr().map_err(|e| e.to_string())?.port();
            Ok((p, b, pp, bp))
        });
    let (probe, bench, probe_port, bench_port) = match bound {
        Ok(x) => x,
        Err(e) => {
            tell(failed(run.id, side, e));
            return None;
        }
    };
    tell(FleetMsg::Listening {
        run: run.id,
        probe_port,
        bench_port,
    });
    let ctx = Arc::clone(ctx);
    let spawned = std::thread::Builder::new()
        .name(format!("fleet-serve-{}", run.id))
        .spawn(move || {
            let deadline = Instant::now() + exp.timeout();
            let probed = tcpx_transport::socket::accept_until(&probe, deadline)
                .map_err(|e| format!("accepting the start-up probe: {e}"))
                .and_then(|c| {
                    c.ok_or_else(|| {
                        format!(
                            "the sender's start-up probe did not arrive within {} s",
                            exp.timeout().as_secs()
                        )
                    })
                })
                .and_then(|(mut s, _)| {
                    use std::io::Write;
                    s.set_nonblocking(false)
                        .and_then(|()| s.write_all(&[1]))
                        .map_err(|e| format!("answering the start-up probe: {e}"))
                });
            drop(probe);
            let msg = match probed {
                Err(e) => failed(run.id, side, e),
                Ok(()) => match tcpx_bench::run_server_with(
                    &exp,
                    &ctx.backends,
                    bench,
                    &mut |_: &tcpx_bench::Measurement| {},
                ) {
                    Ok(o) => FleetMsg::Done {
                        run: run.id,
                        side,
                        report: report_from(&o, &exp),
                    },
                    Err(e) => failed(run.id, side, e.to_string()),
                },
            };
            tell(msg);
        });
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            // `tell` moved into the closure that failed to start: nothing to report with; the
            // leader's pair deadline names this node.
            eprintln!(
                "tcpx-run fleet: starting the receiver thread for run {}: {e}",
                run.id
            );
            None
        }
    }
}

/// The start-up probe from `from` to `to`: (connect, accept, first byte), milliseconds.
fn probe(from: IpAddr, to: SocketAddr, wait: Duration) -> Result<(f64, f64, f64), String> {
    use socket2::{Domain, Socket, Type};
    let domain = if to.is_ipv4() {
        Domain::IPV4
    } else {
        Domain::IPV6
    };
    let s = Socket::new(domain, Type::STREAM, None).map_err(|e| e.to_string())?;
    s.bind(&SocketAddr::new(from, 0).into())
        .map_err(|e| format!("binding the probe to {from}: {e}"))?;
    let t0 = Instant::now();
    s.connect_timeout(&to.into(), wait)
        .map_err(|e| format!("start-up probe: connecting from {from} to {to}: {e}"))?;
    let connected = t0.elapsed();
    let mut stream: TcpStream = s.into();
    // One deadline for the whole probe: a receiver that hangs costs the sender `wait`, so the
    // sender reports before the leader's pair deadline.
    let left = wait.saturating_sub(connected).max(Duration::from_millis(1));
    stream
        .set_read_timeout(Some(left))
        .map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    stream
        .read_exact(&mut b)
        .map_err(|e| format!("start-up probe: no answer from {to}: {e}"))?;
    let first = t0.elapsed();
    Ok((ms(connected), ms(first - connected), ms(first)))
}

#[allow(clippy::too_many_arguments)]
fn send(
    ctx: &Arc<NodeCtx>,
    run: PairRun,
    exp: Experiment,
    from: IpAddr,
    to: IpAddr,
    probe_port: u16,
    bench_port: u16,
    tell: impl Fn(FleetMsg) + Send + 'static,
) -> Option<JoinHandle<()>> {
    let side = PairSide::Sender;
    if let Err(e) = check_own(ctx, from, &exp) {
        tell(failed(run.id, side, e));
        return None;
    }
    let exp = bench_experiment(exp);
    let ctx = Arc::clone(ctx);
    std::thread::Builder::new()
        .name(format!("fleet-send-{}", run.id))
        .spawn(move || {
            let msg = match probe(from, SocketAddr::new(to, probe_port), exp.timeout()) {
                Err(e) => failed(run.id, side, e),
                Ok((connect, accept, first)) => {
                    let t = Instant::now();
                    match tcpx_bench::run_client_with(
                        &exp,
                        &ctx.backends,
                        SocketAddr::new(to, bench_port),
                        &mut |_: &tcpx_bench::Measurement| {},
                    ) {
                        Ok(o) => {
                            let wall = ms(t.elapsed());
                            let mut report = report_from(&o, &exp);
                            let timed = o
                                .measurements
                                .first()
                                .map_or(0.0, |m| m.send.avg_us * f64::from(exp.iters) / 1e3);
                            report.connect_ms = Some(connect);
                            report.accept_ms = Some(accept);
                            report.first_byte_ms = Some(first);
                            report.setup_ms = Some((wall - timed).max(0.0));
                            FleetMsg::Done {
                                run: run.id,
                                side,
                                report,
                            }
                        }
                        Err(e) => failed(run.id, side, e.to_string()),
                    }
                }
            };
            tell(msg);
        })
        .map_err(|e| {
            eprintln!(
                "tcpx-run fleet: starting the sender thread for run {}: {e}",
                run.id
            )
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_that_places_its_nics_itself_gets_no_nic_address_for_its_bench() {
        let mut exp = Experiment {
            nics: vec!["127.0.0.11".into()],
            ..Experiment::default()
        };
        assert_eq!(
            bench_experiment(exp.clone()).nics,
            ["127.0.0.11"],
            "socket binds it"
        );
        exp.transport = tcpx_bench::Backend::NetPlugin;
        assert!(
            bench_experiment(exp).nics.is_empty(),
            "the plugin refuses it"
        );
    }
}
