//! The follower: serves a leader's experiments from this node (the other side of a plan run).
//! For every experiment the leader sends it binds a bench listener, applies its side's knobs
//! (thread binding, IRQ policy, its own NICs), says where to connect and runs
//! `tcpx_bench::run_server` while the leader runs the client. With `process_mode:
//! "multi-process"` it reserves one control port per flow instead, tells the leader the first,
//! and runs one flow process per flow (started by the [`Launcher`](crate::Launcher) it was given).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_affinity::CpuSet;
use tcpx_bench::Experiment;

use crate::error::{FollowerCrash, OrchestrateError};
use crate::facts::gather_facts;
use crate::knobs::{binding_for, irq_for, run_pinned, side_nics, IrqOutcome};
use crate::proto::{Action, Event, Follower};
use crate::FaultHooks;
use tcpx_flows::process::{
    children_limit, flow_children, ChildFault, FlowProcesses, FlowSide, Launcher,
};
use tcpx_flows::supervise::supervise_until;
use tcpx_link::{Link, LinkError, LinkMsg};
use tcpx_model::{Knob, NotApplied, Outside, Side};

/// A TCP socket bound to `ip:port` that does not listen, without SO_REUSEADDR.
///
/// Why not a `TcpListener`: a listening socket completes the handshake of a client that comes
/// early (the leader starts its clients as soon as it reads `Ready`), and dropping it then
/// resets that connection, which the client reports as the server closing the control
/// connection. A bound socket that does not listen refuses the connection, and the client
/// tries again until the flow's own process listens. Without SO_REUSEADDR here, a child's bind
/// (std sets SO_REUSEADDR) still fails with "address in use" while the port is held.
fn bind_unlistened(ip: IpAddr, port: u16) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let addr = SocketAddr::new(ip, port);
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// The port a socket from [`bind_unlistened`] holds.
fn held_port(s: &socket2::Socket) -> Result<u16, String> {
    s.local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map(|a| a.port())
        .ok_or_else(|| "reading the port of a reserved socket".to_string())
}

/// Binds `count` consecutive free ports on `ip` and keeps them bound (not listening, so an
/// early client is refused and retries rather than being accepted and reset): the caller
/// releases them right before the processes that take them over start. Returns the first port.
pub(crate) fn reserve_ports(ip: IpAddr, count: u32) -> Result<(u16, Vec<socket2::Socket>), String> {
    let mut last = String::new();
    for _ in 0..64 {
        let first =
            bind_unlistened(ip, 0).map_err(|e| format!("binding a control port on {ip}: {e}"))?;
        let base = held_port(&first)?;
        if u32::from(base) + count > 65536 {
            continue;
        }
        let mut held = vec![first];
        for i in 1..count {
            match bind_unlistened(ip, base + i as u16) {
                Ok(l) => held.push(l),
                Err(e) => {
                    last = format!("port {} was taken ({e})", u32::from(base) + i);
                    break;
                }
            }
        }
        if held.len() as u32 == count {
            return Ok((base, held));
        }
    }
    Err(format!(
        "found no {count} consecutive free control ports on {ip} in 64 tries (last: {last}): free some ports or use fewer flows"
    ))
}

/// Options of the follower loop.
#[derive(Clone)]
pub struct FollowOpts {
    /// Longest wait for the leader's next message.
    pub idle: Duration,
    /// How to start the flow processes of multi-process experiments.
    pub launcher: Arc<dyn Launcher>,
    /// Faults to act out (tests); the leader's are ignored here.
    pub faults: FaultHooks,
    /// The run token the leader must prove and this side proves ([`tcpx_link::auth`]); required
    /// for a leader beyond this machine.
    pub token: Option<tcpx_link::auth::RunToken>,
    /// This process's backend settings (and NIC places in an emulated fabric node), as the
    /// binary read them; given to the experiments served in this process (flow processes read
    /// their own).
    pub side_env: tcpx_bench::SideEnv,
}

/// Test hooks for one multi-process experiment's server children.
#[derive(Clone, Copy, Debug, Default)]
struct ChildHooks {
    exit_after_accept: Option<u32>,
    hold_port: Option<u32>,
}

/// The follower: handshake, then serve experiments until the leader says goodbye. Returns the
/// number of experiments the leader asked for. The protocol decisions are
/// [`proto::Follower`](crate::proto::Follower)'s; this is its driver.
pub fn serve(stream: TcpStream, opts: &FollowOpts) -> Result<u32, OrchestrateError> {
    let mut link = Link::new(stream)
        .map_err(|e| OrchestrateError::step("setting up the link to the leader", e))?;
    tcpx_link::auth::require_token(opts.token.as_ref(), link.peer.ip(), "following a leader")
        .map_err(OrchestrateError::Refused)?;
    let host = gather_facts(&link.peer.to_string());
    let loopback = link.peer.ip().is_loopback();
    let peer = link.peer;
    let mut hooks = Some(ChildHooks {
        exit_after_accept: opts.faults.follower_fail_flow,
        hold_port: opts.faults.follower_hold_port,
    });
    let creds = crate::proto::Credentials {
        token: opts.token.clone(),
        nonce: tcpx_link::auth::nonce()
            .map_err(|e| OrchestrateError::step("reading /dev/urandom for a nonce", e))?,
    };
    let (mut proto, first) = Follower::new(&host.hostname, opts.idle, Instant::now(), creds);
    let mut actions: VecDeque<Action> = first.into();
    loop {
        while let Some(action) = actions.pop_front() {
            match action {
                Action::Send(m) => send(&mut link, &m)?,
                Action::Bye { served } => return Ok(served),
                Action::Fatal(why) => {
                    return Err(OrchestrateError::Failed(format!(
                        "{why} (the leader at {peer})"
                    )))
                }
                Action::Prepare { exp, outside } => {
                    let asked = proto.served();
                    if opts.faults.follower_exit_after.is_some_and(|n| asked > n) {
                        // Test hook: vanish like a crashed node would. Returning drops the link,
                        // so the leader sees it close mid-experiment; the binary exits.
                        eprintln!("tcpx-run follow: --fail-after {}: exiting now", asked - 1);
                        return Err(FollowerCrash { served: asked - 1 }.into());
                    }
                    let hooks = if exp.multi_process {
                        hooks.take().unwrap_or_default()
                    } else {
                        ChildHooks::default()
                    };
                    match prepare(
                        &link,
                        &*opts.launcher,
                        &host,
                        loopback,
                        *exp,
                        &outside,
                        hooks,
                    ) {
                        Err(reason) => actions
                            .extend(proto.handle(Event::Prepared(Err(reason)), Instant::now())),
                        Ok(prepared) => {
                            let ready =
                                Event::Prepared(Ok((prepared.port, prepared.not_applied.clone())));
                            for a in proto.handle(ready, Instant::now()) {
                                if let Action::Send(m) = a {
                                    send(&mut link, &m)?;
                                }
                            }
                            let (error, nic_plan) =
                                run(&mut link, &mut proto, prepared, &opts.side_env);
                            actions.extend(
                                proto.handle(Event::RunEnded { error, nic_plan }, Instant::now()),
                            );
                        }
                    }
                }
                // Stop requests only matter while a run's processes are supervised.
                _ => {}
            }
        }
        let now = Instant::now();
        let wait = proto
            .poll_timeout()
            .map_or(opts.idle, |t| t.saturating_duration_since(now));
        let event = match link.recv(wait) {
            Ok(m) => Event::Received(m),
            Err(LinkError::Closed) => Event::Closed,
            Err(LinkError::Timeout) => Event::Timeout,
            Err(LinkError::Other(e)) => Event::LinkFailed(e),
        };
        actions.extend(proto.handle(event, Instant::now()));
    }
}

fn send(link: &mut Link, m: &LinkMsg) -> Result<(), OrchestrateError> {
    link.send(m)
        .map_err(|e| OrchestrateError::Failed(format!("telling the leader at {}: {e}", link.peer)))
}

/// How this side runs a prepared experiment.
enum Serving {
    /// All flows in this process, served from this listener.
    Single(std::net::TcpListener),
    /// One server process per flow on the reserved ports.
    Multi {
        held: Vec<socket2::Socket>,
        flows: FlowProcesses,
        hold_port: Option<u32>,
    },
}

/// An experiment ready to run: where the leader connects, what could not be applied, and what
/// stays applied while it runs.
struct Prepared {
    exp: Experiment,
    port: u16,
    not_applied: NotApplied,
    cpus: Option<CpuSet>,
    _irq: Option<tcpx_affinity::IrqGuard>,
    serving: Serving,
}

/// Applies this side's knobs and binds what the leader will connect to; `Err` is the reason this
/// side refuses the experiment.
fn prepare(
    link: &Link,
    launcher: &dyn Launcher,
    host: &tcpx_plan::SystemFacts,
    loopback: bool,
    mut exp: Experiment,
    outside: &Outside,
    hooks: ChildHooks,
) -> Result<Prepared, String> {
    // The leader's experiment is checked like one from flags: a value out of range is refused
    // with the reason, never a panic here.
    exp.validate(None)
        .map_err(|e| format!("the leader's experiment is out of range here: {e}"))?;
    let mut not_applied = NotApplied::new();
    let irq = match irq_for(outside, host, loopback) {
        IrqOutcome::Refused(r) => return Err(r),
        IrqOutcome::NotApplied(r) => {
            not_applied.insert(Knob::IrqPolicy, r);
            None
        }
        IrqOutcome::Applied(g) => Some(g),
        IrqOutcome::NotRequested => None,
    };
    let cpus = match binding_for(outside, host, Side::Recv) {
        Ok(c) => c,
        Err(r) => {
            not_applied.insert(Knob::ThreadBinding, r);
            None
        }
    };
    if let Some(nics) = side_nics(&exp, outside, host, loopback, &mut not_applied)? {
        exp.nics = nics;
    }
    let ip = link.local.ip();
    let (port, serving) = if exp.multi_process {
        // One control port per flow, reserved now and released right before the children
        // start, so a child that finds its port taken fails with the bind error.
        let (base, held) = reserve_ports(ip, exp.flows)?;
        let faults: Vec<(u32, ChildFault)> = hooks
            .exit_after_accept
            .map(|f| (f, ChildFault::ExitAfterAccept))
            .into_iter()
            .collect();
        let flows = flow_children(
            launcher,
            &exp,
            &[FlowSide::Server],
            SocketAddr::new(ip, base),
            &faults,
        )
        .map_err(|e| format!("{e:#}"))?;
        (
            base,
            Serving::Multi {
                held,
                flows,
                hold_port: hooks.hold_port,
            },
        )
    } else {
        let listener =
            tcpx_bench::bind_control(SocketAddr::new(ip, 0)).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
        (port, Serving::Single(listener))
    };
    Ok(Prepared {
        exp,
        port,
        not_applied,
        cpus,
        _irq: irq,
        serving,
    })
}

/// Runs a prepared experiment's server side; the error text and NIC plan for `Done`. A
/// multi-process run keeps reading the link: the leader says `Abort` when its client processes
/// failed, and ours are stopped rather than left to wait out their timeout.
fn run(
    link: &mut Link,
    proto: &mut Follower,
    p: Prepared,
    side_env: &tcpx_bench::SideEnv,
) -> (Option<String>, Option<String>) {
    let exp = &p.exp;
    let (mut error, nic_plan, pin_error) = match p.serving {
        Serving::Single(listener) => {
            let (result, pin_error) = run_pinned(p.cpus.as_ref(), || {
                tcpx_bench::run_server_with(
                    exp,
                    side_env,
                    listener,
                    &mut |_: &tcpx_bench::Measurement| {},
                )
            });
            let nic_plan = result
                .as_ref()
                .ok()
                .and_then(|o| o.nic_plan.as_ref())
                .map(|n| n.describe(exp));
            (result.err().map(|e| e.to_string()), nic_plan, pin_error)
        }
        Serving::Multi {
            held,
            flows,
            hold_port,
        } => {
            // Released right before the children bind them (the test hook keeps one).
            let kept: Vec<socket2::Socket> = held
                .into_iter()
                .zip(0u32..)
                .filter(|(_, i)| hold_port == Some(*i))
                .map(|(l, _)| l)
                .collect();
            let limit = children_limit(exp);
            let mut leader_says = || {
                let event = match link.try_recv()? {
                    Ok(m) => Event::Received(m),
                    Err(LinkError::Closed) => Event::Closed,
                    Err(e) => Event::LinkFailed(e.to_string()),
                };
                Action::stop_reason(proto.handle(event, Instant::now()))
            };
            let (result, pin_error) = run_pinned(p.cpus.as_ref(), || {
                supervise_until(flows.specs, limit, &mut leader_says)
            });
            drop(kept);
            drop(flows.dir);
            match result {
                Ok(children) => {
                    let plans: Vec<String> =
                        children.iter().filter_map(|c| c.nic_plan.clone()).collect();
                    (
                        None,
                        (!plans.is_empty()).then(|| plans.join("; ")),
                        pin_error,
                    )
                }
                Err(e) => (
                    Some(format!("follower's server processes: {e}")),
                    None,
                    pin_error,
                ),
            }
        }
    };
    if let (None, Some(p)) = (&error, pin_error) {
        error = Some(format!("follower thread binding: {p}"));
    }
    (error, nic_plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn reserved_ports_are_consecutive_and_held_until_released() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let (base, held) = reserve_ports(ip, 3).unwrap();
        assert_eq!(held.len(), 3);
        for (i, l) in held.iter().enumerate() {
            assert_eq!(held_port(l).unwrap(), base + i as u16);
        }
        // Held: nobody else can take them (std's bind sets SO_REUSEADDR, as a child's does).
        let e = TcpListener::bind((ip, base + 1)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        // Held but not listening: an early client is refused (and retries), never accepted
        // into a backlog that is reset when the reservation is released.
        let e = TcpStream::connect((ip, base)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        drop(held);
        // Released: the flow's child can bind its port.
        TcpListener::bind((ip, base + 1)).unwrap();
    }
}
