//! `tcpx-run validate` with real libnccl: a tuned.env against NCCL's defaults, both send/recv and
//! all-reduce, every arm its own processes. The first test puts both ranks on GPU 0 as 2 NCCL
//! hosts (`--gpus 0,0`: one GPU is enough) and checks that both collectives come back measured
//! with finite figures and a gain for every size (not its value: speed is measured, not
//! asserted), and that NCCL's own log proves it: NET/Socket, 2 nodes, the tuned variables read by
//! the tuned arm, no problem flagged. The second (2 GPUs) is the one-host path through the `nccl`
//! backend. Need libnccl (and the GPUs); print `SKIP:` without. In the GPU bundle (`cargo xtask
//! gpu-test`) the binary is `TCPX_RUN_BIN`, which run.sh sets.
//!
//! A test binary of its own, not a module of `tests/cli`: `cargo xtask gpu-test` builds and
//! bundles it by name (`xtask::gpu_test::EXTRA_TESTS`) for the GPU machine, where the CLI tests
//! would add nothing but size to a bundle held under the device tool's 64 MiB.

use std::path::PathBuf;
use std::process::Command;

use tcpx_gpu::testing::{gpus_or_skip, skip};

fn tcpx_run() -> PathBuf {
    std::env::var_os("TCPX_RUN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_tcpx-run").into())
}

/// NET/Socket over loopback, as the bundle's other NCCL tests (set here too, so the test means
/// the same when run on its own).
const SOCKET_ENV: [(&str, &str); 6] = [
    ("NCCL_P2P_DISABLE", "1"),
    ("NCCL_SHM_DISABLE", "1"),
    ("NCCL_NET", "Socket"),
    ("NCCL_IB_DISABLE", "1"),
    ("NCCL_SOCKET_IFNAME", "lo"),
    ("NCCL_NVLS_ENABLE", "0"),
];

fn measured_with_gains(v: &serde_json::Value, text: &str) {
    let cs = v["collectives"].as_array().unwrap();
    let names: Vec<&str> = cs.iter().filter_map(|c| c["collective"].as_str()).collect();
    assert_eq!(names, ["sendrecv", "allreduce"], "{text}");
    for c in cs {
        assert_eq!(c["status"], "measured", "{text}");
        let sizes = c["sizes"].as_array().unwrap();
        let got: Vec<u64> = sizes.iter().filter_map(|s| s["size"].as_u64()).collect();
        assert_eq!(got, [1 << 20, 16 << 20], "{text}");
        for s in sizes {
            for arm in ["default", "tuned"] {
                let f = &s[arm];
                assert_eq!(f["n"], 2, "{arm}: {text}");
                let m = f["median"].as_f64().unwrap();
                assert!(m.is_finite() && m > 0.0, "{arm} median {m}: {text}");
            }
            for k in ["gain", "gain_lo", "gain_hi"] {
                let g = s[k].as_f64().unwrap_or(f64::NAN);
                assert!(g.is_finite() && g > 0.0, "{k} {g}: {text}");
            }
        }
    }
}

/// `tcpx-run validate --json` of a tuned.env (4 NCCL socket threads of 4 sockets, 2 TCPX
/// channels) against NCCL's defaults at 1M and 16M, with `args`, for test `test` on `gpus` GPUs:
/// its document (which must say `ok`), the whole output for messages, and its stdout. `None`
/// (after a visible skip) without the GPUs or libnccl.
fn validate(test: &str, gpus: usize, args: &[&str]) -> Option<(serde_json::Value, String, String)> {
    gpus_or_skip(test, gpus)?;
    if let Err(e) = tcpx_ffi::nccl::Nccl::load() {
        skip(test, &format!("no libnccl: {e}"));
        return None;
    }
    let d = tempfile::tempdir().unwrap();
    let env = d.path().join("tuned.env");
    std::fs::write(
        &env,
        "NCCL_SOCKET_NTHREADS=4\nNCCL_NSOCKS_PERTHREAD=4\nTCPX_CHANNELS=2\n",
    )
    .unwrap();
    let o = Command::new(tcpx_run())
        .args([
            "validate", "--json", "--reps", "2", "--iters", "3", "--warmup", "1",
        ])
        .args(["--size", "1M,16M"])
        .args(args)
        .arg(&env)
        .envs(SOCKET_ENV)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let text = format!(
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(v["status"], "ok", "{text}");
    Some((v, text, stdout))
}

#[test]
fn gpu_validate_on_one_gpu_as_two_nccl_hosts_with_log_evidence() {
    let Some((v, text, stdout)) = validate(
        "gpu_validate_on_one_gpu_as_two_nccl_hosts_with_log_evidence",
        1,
        &["--gpus", "0,0", "--run-timeout", "120"],
    ) else {
        return;
    };
    assert_eq!(v["placement"]["kind"], "shared_gpu", "{text}");
    assert!(
        v["found"]
            .as_str()
            .unwrap_or("")
            .contains("1 GPU as 2 NCCL hosts"),
        "{text}"
    );
    measured_with_gains(&v, &text);
    for c in v["collectives"].as_array().unwrap() {
        let ev = c["evidence"].as_array().expect("evidence per arm");
        let arms: Vec<&str> = ev.iter().filter_map(|e| e["arm"].as_str()).collect();
        assert_eq!(arms, ["default", "tuned"], "{text}");
        for e in ev {
            assert_eq!(e["networks"], serde_json::json!(["Socket"]), "{text}");
            assert_eq!(e["nodes"], 2, "NCCL saw two hosts: {text}");
            assert_eq!(e["problems"], serde_json::json!([]), "{text}");
        }
        assert_eq!(ev[1]["read"]["NCCL_SOCKET_NTHREADS"], "4", "{text}");
        assert_eq!(ev[1]["read"]["NCCL_NSOCKS_PERTHREAD"], "4", "{text}");
        assert!(
            ev[0]["read"].get("NCCL_SOCKET_NTHREADS").is_none(),
            "the default arm has NCCL's defaults: {text}"
        );
    }
    assert_eq!(v["evidence_problems"], serde_json::json!([]), "{text}");
    println!("{stdout}");
}

#[test]
fn gpu_validate_measures_sendrecv_and_allreduce_with_a_tuned_env_on_two_gpus() {
    let Some((v, text, stdout)) = validate(
        "gpu_validate_measures_sendrecv_and_allreduce_with_a_tuned_env_on_two_gpus",
        2,
        &[],
    ) else {
        return;
    };
    assert_eq!(v["placement"]["kind"], "two_gpus", "{text}");
    measured_with_gains(&v, &text);
    println!("{stdout}");
}
