//! `tcpx-run validate` on two GPUs with real libnccl: a tuned.env against NCCL's defaults, both
//! send/recv (the `nccl` backend) and all-reduce, every arm a process of its own. Checks that both
//! collectives come back measured with finite figures and a gain for every size (not its value:
//! speed is measured, not asserted). Needs 2 GPUs and libnccl; prints `SKIP:` without. In the GPU
//! bundle (`cargo xtask gpu-test`) the binary is `TCPX_RUN_BIN`, which run.sh sets.

use std::path::PathBuf;
use std::process::Command;

use tcpx_gpu::testing::{gpus_or_skip, skip};

fn tcpx_run() -> PathBuf {
    std::env::var_os("TCPX_RUN_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_tcpx-run").into())
}

#[test]
fn gpu_validate_measures_sendrecv_and_allreduce_with_a_tuned_env() {
    const T: &str = "gpu_validate_measures_sendrecv_and_allreduce_with_a_tuned_env";
    if gpus_or_skip(T, 2).is_none() {
        return;
    }
    if let Err(e) = tcpx_ffi::nccl::Nccl::load() {
        return skip(T, &format!("no libnccl: {e}"));
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
        .arg(&env)
        // NET/Socket over loopback, as the bundle's other NCCL tests (set here too, so the test
        // means the same when run on its own).
        .envs([
            ("NCCL_P2P_DISABLE", "1"),
            ("NCCL_SHM_DISABLE", "1"),
            ("NCCL_NET", "Socket"),
            ("NCCL_IB_DISABLE", "1"),
            ("NCCL_SOCKET_IFNAME", "lo"),
            ("NCCL_NVLS_ENABLE", "0"),
        ])
        .output()
        .unwrap();
    let text = format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(v["status"], "ok", "{text}");
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
    println!("{}", String::from_utf8_lossy(&o.stdout));
}
