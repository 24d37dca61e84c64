//! `ci/real-tcpx/build.sh` refuses, before building anything, inputs it cannot build from, and
//! says what is missing (the build itself needs nvcc and runs on the GPU machine).

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ci/real-tcpx/build.sh")
}

fn run(args: &[&Path], cuda_home: &Path) -> (i32, String) {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .env("CUDA_HOME", cuda_home)
        .output()
        .expect("run bash");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn build_sh_names_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("plugin");
    let nccl = dir.path().join("nccl");
    let deps = dir.path().join("deps");
    let out = dir.path().join("out");
    for d in [&src, &nccl, &deps] {
        std::fs::create_dir_all(d).unwrap();
    }
    let (code, err) = run(&[&src, &nccl, &deps, &out], dir.path());
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("is not an nccl-plugin-gpudirecttcpx checkout"),
        "{err}"
    );

    std::fs::create_dir_all(src.join("src/rx_buf_mgr_client")).unwrap();
    std::fs::write(src.join("CMakeLists.txt"), "").unwrap();
    let (code, err) = run(&[&src, &nccl, &deps, &out], &dir.path().join("no-cuda"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no nvcc at"), "{err}");

    let (code, err) = run(&[&src, &nccl], dir.path());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("usage:"), "{err}");
}
