//! The follower: serves a leader's experiments from this node (the other side of a plan run).
//! For every experiment the leader sends it binds a bench listener, applies its side's knobs
//! (thread binding, IRQ policy, its own NICs), says where to connect and runs
//! `tcpx_bench::run_server` while the leader runs the client. With `process_mode:
//! "multi-process"` it reserves one control port per flow instead, tells the leader the first,
//! and runs one flow process per flow (started by the [`Launcher`](crate::Launcher) it was given).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tcpx_affinity::CpuSet;
use tcpx_bench::Experiment;

use crate::facts::gather_facts;
use crate::flows::{children_limit, flow_children, ChildFault, FlowSide, Launcher};
use crate::knobs::{
    binding_for, irq_for, nic_policy_not_applied, nics_for, run_pinned, End, IrqOutcome, NicChoice,
};
use crate::link::{Link, LinkError, LinkMsg, LINK_PROTOCOL};
use crate::supervise::supervise_until;
use crate::FaultHooks;

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
pub fn reserve_ports(ip: IpAddr, count: u32) -> Result<(u16, Vec<socket2::Socket>), String> {
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
}

/// Test hooks for one multi-process experiment's server children.
#[derive(Clone, Copy, Debug, Default)]
struct ChildHooks {
    exit_after_accept: Option<u32>,
    hold_port: Option<u32>,
}

/// The follower: handshake, then serve experiments until the leader says goodbye. Returns the
/// number of experiments served.
pub fn serve(stream: TcpStream, opts: &FollowOpts) -> anyhow::Result<u32> {
    let mut link = Link::new(stream).context("setting up the link to the leader")?;
    let host = gather_facts(&link.peer.to_string());
    link.send(&LinkMsg::Hello {
        protocol: LINK_PROTOCOL,
        version: env!("CARGO_PKG_VERSION").into(),
        host: host.hostname.clone(),
    })
    .map_err(|e| anyhow::anyhow!("greeting the leader at {}: {e}", link.peer))?;
    match link.recv(Duration::from_secs(30)) {
        Ok(LinkMsg::Hello { protocol, .. }) if protocol == LINK_PROTOCOL => {}
        Ok(LinkMsg::Hello { protocol, version, .. }) => bail!(
            "the leader speaks link protocol {protocol} (tcpx-run {version}), this follower {LINK_PROTOCOL}: run the same tcpx-run build on both nodes"
        ),
        Ok(other) => bail!("the leader sent {other:?} instead of a greeting"),
        Err(e) => bail!("waiting for the leader's greeting from {}: {e}", link.peer),
    }
    let loopback = link.peer.ip().is_loopback();
    let mut served = 0u32;
    let mut hooks = Some(ChildHooks {
        exit_after_accept: opts.faults.follower_fail_flow,
        hold_port: opts.faults.follower_hold_port,
    });
    loop {
        let msg = match link.recv(opts.idle) {
            Ok(m) => m,
            Err(LinkError::Closed) => bail!(
                "the leader at {} closed the connection without saying goodbye (did it crash? see its output) after {served} experiments",
                link.peer
            ),
            Err(LinkError::Timeout) => bail!(
                "the leader at {} sent nothing for {} s: giving up",
                link.peer,
                opts.idle.as_secs()
            ),
            Err(e) => bail!("reading from the leader at {}: {e}", link.peer),
        };
        match msg {
            LinkMsg::Bye => return Ok(served),
            // The leader's stop request crossed our `Done`: that experiment is over already.
            LinkMsg::Abort { .. } => continue,
            LinkMsg::Prepare { exp, knobs } => {
                if opts.faults.follower_exit_after.is_some_and(|n| served >= n) {
                    // Test hook: vanish like a crashed node would (the OS closes the link
                    // mid-experiment); exit rather than abort so no core file is left behind.
                    eprintln!("tcpx-run follow: --fail-after {served}: exiting now");
                    std::process::exit(101);
                }
                served += 1;
                let mut not_applied = BTreeMap::new();
                let irq = irq_for(&knobs, &host, loopback);
                let _guard = match irq {
                    IrqOutcome::Refused(r) => {
                        let _ = link.send(&LinkMsg::Refused { reason: r });
                        continue;
                    }
                    IrqOutcome::NotApplied(r) => {
                        not_applied.insert("irq_policy".into(), r);
                        None
                    }
                    IrqOutcome::Applied(g) => Some(g),
                    IrqOutcome::NotRequested => None,
                };
                let cpus = match binding_for(&knobs, &host, End::Recv) {
                    Ok(c) => c,
                    Err(r) => {
                        not_applied.insert("thread_binding".into(), r);
                        None
                    }
                };
                let mut exp = *exp;
                let choice = nics_for(&knobs, &host, loopback);
                if let Some(r) = nic_policy_not_applied(&knobs, &choice, loopback) {
                    not_applied.insert("nic_policy".into(), r);
                }
                match choice {
                    NicChoice::Default => {}
                    NicChoice::Use(nics) => exp.nics = nics,
                    NicChoice::NotApplied(r) => {
                        not_applied.insert("nics".into(), r);
                    }
                    NicChoice::Missing(r) => {
                        let _ = link.send(&LinkMsg::Refused { reason: r });
                        continue;
                    }
                }
                if exp.multi_process {
                    let hooks = hooks.take().unwrap_or_default();
                    serve_multi(
                        &mut link,
                        &*opts.launcher,
                        &exp,
                        not_applied,
                        cpus.as_ref(),
                        hooks,
                    )?;
                    continue;
                }
                let listener = match tcpx_bench::bind_control(SocketAddr::new(link.local.ip(), 0)) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = link.send(&LinkMsg::Refused {
                            reason: e.to_string(),
                        });
                        continue;
                    }
                };
                let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
                if let Err(e) = link.send(&LinkMsg::Ready { port, not_applied }) {
                    bail!("telling the leader at {} we are ready: {e}", link.peer);
                }
                let (result, pin_error) = run_pinned(cpus.as_ref(), || {
                    tcpx_bench::run_server(&exp, listener, &mut |_: &tcpx_bench::Measurement| {})
                });
                let nic_plan = result
                    .as_ref()
                    .ok()
                    .and_then(|o| o.nic_plan.as_ref())
                    .map(|p| p.describe(&exp));
                let mut error = result.err().map(|e| e.to_string());
                if let (None, Some(p)) = (&error, pin_error) {
                    error = Some(format!("follower thread binding: {p}"));
                }
                if let Err(e) = link.send(&LinkMsg::Done { error, nic_plan }) {
                    bail!("reporting to the leader at {}: {e}", link.peer);
                }
            }
            other => bail!("the leader sent {other:?} where an experiment was expected"),
        }
    }
}

/// The server side of a multi-process experiment: one control port per flow reserved (and
/// released right before the children start, so a child that finds its port taken fails with
/// the bind error), `Ready` with the first, one server flow process per flow
/// under [`supervise_until`] (a dead child is named, the others stopped), then `Done`.
fn serve_multi(
    link: &mut Link,
    launcher: &dyn Launcher,
    exp: &Experiment,
    not_applied: BTreeMap<String, String>,
    cpus: Option<&CpuSet>,
    hooks: ChildHooks,
) -> anyhow::Result<()> {
    let ip = link.local.ip();
    let refuse = |link: &mut Link, reason: String| -> anyhow::Result<()> {
        link.send(&LinkMsg::Refused { reason })
            .map_err(|e| anyhow::anyhow!("telling the leader at {}: {e}", link.peer))
    };
    let (base, held) = match reserve_ports(ip, exp.flows) {
        Ok(r) => r,
        Err(e) => return refuse(link, e),
    };
    let faults: Vec<(u32, ChildFault)> = hooks
        .exit_after_accept
        .map(|f| (f, ChildFault::ExitAfterAccept))
        .into_iter()
        .collect();
    let flows = match flow_children(
        launcher,
        exp,
        &[FlowSide::Server],
        SocketAddr::new(ip, base),
        &faults,
    ) {
        Ok(f) => f,
        Err(e) => return refuse(link, format!("{e:#}")),
    };
    if let Err(e) = link.send(&LinkMsg::Ready {
        port: base,
        not_applied,
    }) {
        bail!("telling the leader at {} we are ready: {e}", link.peer);
    }
    // Released right before the children bind them (the test hook keeps one).
    let kept: Vec<socket2::Socket> = held
        .into_iter()
        .zip(0u32..)
        .filter(|(_, i)| hooks.hold_port == Some(*i))
        .map(|(l, _)| l)
        .collect();
    let limit = children_limit(exp);
    // The leader says `Abort` when its client processes failed: stop ours rather than let them
    // wait out their timeout for clients that will not connect.
    let mut leader_says = || {
        link.try_recv().map(|msg| match msg {
            Ok(LinkMsg::Abort { reason }) => format!("stopped at the leader's request ({reason})"),
            Ok(other) => format!("the leader sent {other:?} during the run"),
            Err(e) => format!("lost the leader during the run ({e})"),
        })
    };
    let (result, pin_error) = run_pinned(cpus, || {
        supervise_until(flows.specs, limit, &mut leader_says)
    });
    drop(kept);
    drop(flows.dir);
    let (mut error, nic_plan) = match result {
        Ok(children) => {
            let plans: Vec<String> = children.iter().filter_map(|c| c.nic_plan.clone()).collect();
            (None, (!plans.is_empty()).then(|| plans.join("; ")))
        }
        Err(e) => (Some(format!("follower's server processes: {e}")), None),
    };
    if let (None, Some(p)) = (&error, pin_error) {
        error = Some(format!("follower thread binding: {p}"));
    }
    link.send(&LinkMsg::Done { error, nic_plan })
        .map_err(|e| anyhow::anyhow!("reporting to the leader at {}: {e}", link.peer))
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
