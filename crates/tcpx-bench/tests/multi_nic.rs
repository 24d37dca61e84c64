//! Experiments whose channels are bound to NICs (emulated by loopback addresses 127.0.0.2, ...),
//! per-flow figures, one-flow-per-process pairs, and the refusals a user meets.

use tcpx_bench::{bind_control, run_client, run_local, run_server, Experiment, Measurement};

mod common;
use common::loopback;

fn small() -> Experiment {
    Experiment {
        sizes: vec![2 << 20],
        nics: vec!["127.0.0.2".into(), "127.0.0.3".into(), "127.0.0.4".into()],
        ..common::two_flows("nics")
    }
}

#[test]
fn channels_spread_over_emulated_nics_and_every_byte_arrives() {
    let exp = small();
    let out = run_local(&exp, loopback(), &mut |_: &Measurement| {}).unwrap();
    let plan = out.nic_plan.expect("a NIC plan when NICs are named");
    assert_eq!(
        plan.describe(&exp),
        "flow 0: 127.0.0.2,127.0.0.3; flow 1: 127.0.0.4,127.0.0.2"
    );
    for m in &out.measurements {
        assert_eq!(m.recv.wrong_bytes, Some(0));
        for s in [&m.send, &m.recv] {
            assert_eq!(s.flow_gbs.len(), 2, "one figure per flow (GPU)");
            assert!(s.flow_gbs.iter().all(|&g| g > 0.0), "{:?}", s.flow_gbs);
            // The whole is at most the sum of its flows (each flow's time <= the slowest's).
            assert!(s.algbw_gbs <= s.flow_gbs.iter().sum::<f64>() * (1.0 + 1e-9));
        }
    }
}

#[test]
fn a_nic_that_does_not_exist_stops_both_sides_with_its_name() {
    let exp = Experiment {
        nics: vec!["tcpx-no-such-if0".into()],
        ..small()
    };
    let e = run_local(&exp, loopback(), &mut |_: &Measurement| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("NIC `tcpx-no-such-if0` does not exist here") && e.contains("choosing NICs"),
        "{e}"
    );
    // An unknown policy cannot be an experiment's: it is refused where it is read.
    let e = "fastest"
        .parse::<tcpx_bench::NicPolicy>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("NIC policy `fastest` is unknown"), "{e}");
}

/// Runs one server/client pair on its own control port, as one process pair of a multi-process
/// run would (here as threads, the processes are tested in tcpx-run).
fn pair(server: Experiment, client: Experiment) -> (Result<String, String>, Result<(), String>) {
    let listener = bind_control(loopback()).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::scope(|s| {
        let srv = s.spawn(move || {
            run_server(&server, listener, &mut |_: &Measurement| {})
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        let cli = run_client(&client, addr, &mut |_: &Measurement| {})
            .map(|o| {
                o.measurements
                    .iter()
                    .map(|m| format!("{:?}", m.recv.wrong_bytes))
                    .collect()
            })
            .map_err(|e| e.to_string());
        (cli, srv.join().unwrap())
    })
}

#[test]
fn one_flow_per_process_pairs_flow_i_with_flow_i() {
    for i in 0..2 {
        let exp = Experiment {
            flow_index: Some(i),
            ..small()
        };
        let (c, s) = pair(exp.clone(), exp);
        assert_eq!(c.unwrap(), "Some(0)", "flow {i} verified");
        s.unwrap();
    }
}

#[test]
fn mismatched_flow_counts_between_nodes_are_refused_with_both_values() {
    let server = Experiment {
        flows: 4,
        flow_index: Some(1),
        ..small()
    };
    let client = Experiment {
        flows: 2,
        flow_index: Some(1),
        ..small()
    };
    let (c, s) = pair(server, client);
    let c = c.unwrap_err();
    assert!(c.contains("flows: 4 vs 2"), "{c}");
    assert!(s.unwrap_err().contains("flows: 4 vs 2"));
    let e = Experiment {
        flow_index: Some(2),
        ..small()
    }
    .validate(None)
    .unwrap_err();
    assert!(
        e.contains("flow index 2 is outside the experiment's 2 flows"),
        "{e}"
    );
}
