//! `cargo xtask gpu-test`: build the GPU tests and benchmarks here, bundle them with the shared
//! libraries they need, and write the script that runs them all on a GPU machine.
//!
//! The bundle (`.device-bundle/`, git-ignored) holds `tests/` (test executables), `bin/` (release
//! binaries), `lib/` (non-system shared libraries from `ldd`, e.g. libhwloc.so.15) and `run.sh`.
//! On the GPU machine, from the repository root: `bash .device-bundle/run.sh`. It runs every test
//! executable with `TCPX_REQUIRE_GPU=1` (no usable GPU fails instead of skipping; tests needing
//! more GPUs than the machine has skip, naming their count, unless `TCPX_REQUIRE_GPUS=N` asks for
//! N), NCCL forced onto NET/Socket over loopback and NVLink multicast off (`NCCL_NVLS_ENABLE=0`),
//! then the host-path ratios against plain C TCP (`tcp_yardstick.c`, compiled there), then the
//! reference benchmarks (GPU 0 -> GPU 1 where there are two GPUs, GPU 0 -> GPU 0 on one, NCCL's
//! two ranks then as 2 NCCL hosts; those that need two GPUs skip with the reason), and ends with
//! a summary that lists every skip. `TCPX_BUNDLE_PARTS` picks parts (default `tests ratios bench
//! realplugin`; `closedloop` on request: plan -> tuned.env -> validate through Google's plugin). Logs and `results.jsonl` go to
//! `$OUT` when set (the device tool's output folder), else `.device-bundle/out/`.
//!
//! The ratio part's variables (default in brackets): `TCPX_RATIO_SIZE` (256M),
//! `TCPX_RATIO_ITERS` (20), `TCPX_RATIO_REPS` (3 interleaved repetitions), `TCPX_RATIO_STREAMS`
//! ("1 2 4 8 16"), `TCPX_RATIO_WINDOWS` ("8 32", with 8 MiB chunks, run after the tool with no
//! chunk or window flags), `TCPX_RATIO_BARRIERS` ("iteration size"),
//! `TCPX_RATIO_FREE_SECS` (2, the free-running yardstick's seconds), and for GPU staging at 16
//! sockets `TCPX_RATIO_GPU_SIZES` ("256M 1G") and `TCPX_RATIO_GPU_STAGING`, variants
//! `CHUNK:WINDOW:RING` with RING a size, `auto` or `whole` (a ring as large as the message)
//! ("8M:8:auto 8M:8:whole 4M:8:32M").
//!
//! This machine has no GPU, so xtask cannot run the bundle itself; developers and agents hand
//! `bash .device-bundle/run.sh` to their GPU machine (for agents: the device tool's `run`, with
//! `.device-bundle` in `carry`).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Packages whose tests touch the GPU or libnccl.
/// (The NCCL tests sit in tcpx-gpu-bench, cudap2p's in tcpx-transport, the GPU-count check between
/// two processes in tcpx-bench; tcpx-ffi's own tests need no GPU and run in CI.)
pub const DEFAULT_PACKAGES: &[&str] =
    &["tcpx-gpu", "tcpx-gpu-bench", "tcpx-transport", "tcpx-bench"];
/// Test executables (`package--target`) of those packages that need no GPU and run in CI: left
/// out so the bundle stays under the device tool's 64 MiB.
pub const HOST_ONLY_TESTS: &[&str] = &[
    "tcpx-bench--tcpx_bench",
    "tcpx-bench--experiment",
    "tcpx-bench--multi_nic",
    "tcpx-bench--netns",
    "tcpx-bench--nic_topology",
    "tcpx-transport--socket_loopback",
    "tcpx-transport--socket_nics",
];
/// Single GPU test targets (`package`, `test`) of packages otherwise host-only, bundled as well.
/// They run the tcpx-run binary: run.sh points `TCPX_RUN_BIN` at the bundle's `bin/tcpx-run`.
pub const EXTRA_TESTS: &[(&str, &str)] = &[("tcpx-run", "validate_gpu")];
/// Release binaries carried along (a missing or broken one is left out with a warning).
pub const DEFAULT_BINARIES: &[(&str, &str)] = &[
    ("tcpx-gpu-bench", "tcpx-gpu-bench"),
    ("tcpx-run", "tcpx-run"),
    // The rxdm stand-in, for the real-plugin script (real-tcpx/validate-onegpu.sh).
    ("tcpx-rxdm-standin", "tcpx-rxdm-standin"),
];

/// Scripts of ci/real-tcpx copied into the bundle's real-tcpx/: run.sh runs validate-onegpu.sh
/// when Google's plugin .so is present (`TCPX_REAL_PLUGIN_SO`, or the bundle's so/libnccl-net.so),
/// and closed-loop.sh (with the bundle's plans/) when asked for (`TCPX_BUNDLE_PARTS=closedloop`).
pub const REAL_TCPX_SCRIPTS: &[&str] = &[
    "validate-onegpu.sh",
    "run-loopback.sh",
    "closed-loop.sh",
    "validate-summary.py",
    "fleet-plugin.sh",
    "standin.sh",
];

#[derive(Debug, clap::Args)]
pub struct GpuTestArgs {
    /// Where to put the bundle (relative to the workspace root).
    #[arg(long, default_value = ".device-bundle")]
    pub bundle: PathBuf,
    /// Packages whose test executables go into the bundle (default: the GPU-facing ones).
    #[arg(long = "package", short = 'p')]
    pub packages: Vec<String>,
    /// Leave the benchmarks out of run.sh (tests only).
    #[arg(long)]
    pub no_bench: bool,
    /// Benchmark message sizes for NCCL (comma-separated, K/M/G suffixes).
    #[arg(long, default_value = "1M,4M,16M,64M,256M,1G")]
    pub sizes: String,
}

struct Artifact {
    package: String,
    name: String,
    path: PathBuf,
}

/// Runs cargo with JSON messages and returns the executables it reports.
fn cargo_executables(root: &Path, args: &[&str], want_tests: bool) -> Result<Vec<Artifact>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(root)
        .args(args)
        .arg("--message-format=json")
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {cargo} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "`cargo {}` failed (see the compiler output above)",
            args.join(" ")
        );
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = v["executable"].as_str() else {
            continue;
        };
        // `cargo test --no-run` also reports the package's binaries (built for its integration
        // tests): only test harnesses go into tests/.
        if want_tests != (v["profile"]["test"] == true) {
            continue;
        }
        let package = v["package_id"].as_str().unwrap_or_default();
        // package_id is "path+file:///…/crates/name#0.1.0" (or "name 0.1.0 (…)" on old cargo).
        let package = package
            .rsplit('/')
            .next()
            .and_then(|s| s.split(['#', ' ']).next())
            .unwrap_or(package)
            .to_string();
        let name = v["target"]["name"]
            .as_str()
            .unwrap_or("unknown")
            .to_string();
        found.push(Artifact {
            package,
            name,
            path: PathBuf::from(exe),
        });
    }
    Ok(found)
}

/// Libraries that every Linux machine has and that must come from the machine itself: glibc's
/// parts, the compiler runtime, and the NVIDIA driver (which has to match the kernel module).
fn is_system_lib(name: &str) -> bool {
    const SYSTEM: &[&str] = &[
        "linux-vdso",
        "ld-linux",
        "libc.so",
        "libm.so",
        "libdl.so",
        "librt.so",
        "libpthread.so",
        "libgcc_s.so",
        "libstdc++.so",
        "libcuda.so",
        "libnvidia-",
    ];
    SYSTEM.iter().any(|s| name.starts_with(s))
}

/// Shared libraries `exe` needs beyond the system ones: (soname, resolved path).
fn needed_libs(exe: &Path) -> Result<Vec<(String, PathBuf)>> {
    let out = Command::new("ldd")
        .arg(exe)
        .output()
        .context("running ldd (install libc-bin)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        // "\tlibhwloc.so.15 => /lib/x86_64-linux-gnu/libhwloc.so.15 (0x…)"
        let line = line.trim();
        let Some((name, rest)) = line.split_once(" => ") else {
            continue;
        };
        if is_system_lib(name) {
            continue;
        }
        let path = rest.split_whitespace().next().unwrap_or("");
        if path == "not" {
            bail!(
                "{} needs {name}, which ldd cannot find here: install it first",
                exe.display()
            );
        }
        libs.push((name.to_string(), PathBuf::from(path)));
    }
    Ok(libs)
}

fn copy_exe(src: &Path, dst: &Path) -> Result<()> {
    fs::copy(src, dst)
        .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
    // Debug info is most of a Rust binary's size and the bundle must stay under the device tool's
    // 64 MiB; line tables are not needed to run tests.
    let _ = Command::new("strip").arg("--strip-debug").arg(dst).status();
    Ok(())
}

pub fn run(root: &Path, args: GpuTestArgs) -> Result<()> {
    let packages: Vec<String> = if args.packages.is_empty() {
        DEFAULT_PACKAGES.iter().map(|s| s.to_string()).collect()
    } else {
        args.packages.clone()
    };
    let bundle = root.join(&args.bundle);
    if bundle.exists() {
        fs::remove_dir_all(&bundle).with_context(|| format!("clearing {}", bundle.display()))?;
    }
    for d in ["tests", "bin", "lib"] {
        fs::create_dir_all(bundle.join(d))?;
    }

    eprintln!(
        "xtask gpu-test: building test executables of {}",
        packages.join(", ")
    );
    let mut test_args = vec!["test", "--release", "--no-run"];
    for p in &packages {
        test_args.extend(["-p", p.as_str()]);
    }
    let mut tests = cargo_executables(root, &test_args, true)?;
    for (pkg, test) in EXTRA_TESTS {
        let args = ["test", "--release", "--no-run", "-p", pkg, "--test", test];
        tests.extend(cargo_executables(root, &args, true)?);
    }
    if tests.is_empty() {
        bail!(
            "cargo built no test executables for {}",
            packages.join(", ")
        );
    }

    let mut bins = Vec::new();
    for (pkg, bin) in DEFAULT_BINARIES {
        match cargo_executables(
            root,
            &["build", "--release", "-p", pkg, "--bin", bin],
            false,
        ) {
            Ok(a) => bins.extend(a.into_iter().filter(|a| a.name == *bin)),
            Err(e) => {
                eprintln!("xtask gpu-test: warning: {pkg}/{bin} left out of the bundle: {e:#}")
            }
        }
    }

    // The workspace's test net plugin, for the netplugin GPU tests (TCPX_TEST_PLUGIN_SO in run.sh).
    let mut extra_libs = Vec::new();
    match cargo_executables(
        root,
        &["build", "--release", "-p", "tcpx-test-plugin"],
        false,
    ) {
        Ok(_) => {
            let target = std::env::var("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|_| root.join("target"));
            let so = target.join("release").join("libtcpx_test_plugin.so");
            if so.is_file() {
                extra_libs.push(("libtcpx_test_plugin.so".to_string(), so));
            }
        }
        Err(e) => eprintln!("xtask gpu-test: warning: test plugin left out of the bundle: {e:#}"),
    }
    let mut libs: BTreeSet<(String, PathBuf)> = extra_libs.into_iter().collect();
    let mut listed = Vec::new();
    for t in &tests {
        // Unit tests and integration tests share target names across packages: prefix the package.
        let file = format!("{}--{}", t.package, t.name);
        if HOST_ONLY_TESTS.contains(&file.as_str()) {
            continue;
        }
        copy_exe(&t.path, &bundle.join("tests").join(&file))?;
        listed.push(format!("tests/{file}"));
        libs.extend(needed_libs(&t.path)?);
    }
    for b in &bins {
        copy_exe(&b.path, &bundle.join("bin").join(&b.name))?;
        listed.push(format!("bin/{}", b.name));
        libs.extend(needed_libs(&b.path)?);
    }
    for (name, path) in &libs {
        // copy_exe strips debug info: the test plugin is mostly that.
        copy_exe(path, &bundle.join("lib").join(name))?;
        listed.push(format!("lib/{name}"));
    }
    let have_bench = bins.iter().any(|b| b.name == "tcpx-gpu-bench");
    let script = run_script(!args.no_bench && have_bench, &args.sizes);
    fs::write(bundle.join("run.sh"), script)?;
    fs::write(
        bundle.join("tcp_yardstick.c"),
        crate::bench::TCP_YARDSTICK_C,
    )?;
    fs::write(bundle.join("ratios.py"), RATIOS_PY)?;
    fs::write(bundle.join("scaling.sh"), SCALING_SH)?;
    fs::create_dir_all(bundle.join("real-tcpx"))?;
    for f in REAL_TCPX_SCRIPTS {
        let src = root.join("ci/real-tcpx").join(f);
        fs::copy(&src, bundle.join("real-tcpx").join(f))
            .with_context(|| format!("copying {} into the bundle", src.display()))?;
    }
    // The plans closed-loop.sh runs: the .rhai files and their target sets.
    for sub in ["", "targets"] {
        let (from, to) = (root.join("plans").join(sub), bundle.join("plans").join(sub));
        fs::create_dir_all(&to)?;
        for e in fs::read_dir(&from).with_context(|| format!("reading {}", from.display()))? {
            let path = e?.path();
            if path.is_file() {
                fs::copy(&path, to.join(path.file_name().unwrap_or_default()))
                    .with_context(|| format!("copying {} into the bundle", path.display()))?;
            }
        }
    }

    let size: u64 = walk_size(&bundle)?;
    println!(
        "bundle {} ({:.1} MiB):",
        bundle.display(),
        size as f64 / (1 << 20) as f64
    );
    for l in &listed {
        println!("  {l}");
    }
    if size > 60 << 20 {
        eprintln!("xtask gpu-test: warning: the bundle is over 60 MiB; the device tool carries at most 64 MiB in all");
    }
    println!(
        "\nOn the GPU machine, from the repository root:\n  bash {}/run.sh",
        args.bundle.display()
    );
    println!(
        "(agents: device tool `run` with carry [\"{}\"]; any GPU count: 2-GPU tests skip on one)",
        args.bundle.display()
    );
    Ok(())
}

fn walk_size(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        n += if m.is_dir() {
            walk_size(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(n)
}

/// The script run on the GPU machine. Kept in one piece so the whole procedure reads top to bottom.
fn run_script(bench: bool, sizes: &str) -> String {
    let mut s = String::from(RUN_SH_HEAD);
    s.push_str(RUN_SH_RATIOS);
    if bench {
        s.push_str(&RUN_SH_BENCH.replace("@SIZES@", sizes));
    }
    s.push_str(RUN_SH_REAL_PLUGIN);
    s.push_str(RUN_SH_TAIL);
    s
}

/// `tcpx-run validate` on one GPU as 2 NCCL hosts over NET/Socket and, where Google's plugin .so
/// is present, over it (real-tcpx/validate-onegpu.sh), then `tcpx-run fleet` over it
/// (real-tcpx/fleet-plugin.sh, about 10 s); on request (part `closedloop`) the loop
/// plan -> tuned.env -> validate through the plugin (real-tcpx/closed-loop.sh, about 100 s).
const RUN_SH_REAL_PLUGIN: &str = r#"
if has_part realplugin || has_part closedloop; then
  SO="${TCPX_REAL_PLUGIN_SO:-$B/so/libnccl-net.so}"
  [ -f "$SO" ] || { SKIPS+=("real plugin: no Google plugin .so at $SO (ci/real-tcpx/build.sh makes it; set TCPX_REAL_PLUGIN_SO)"); SO=-; }
  # The plugin's abseil and protobuf, from ci/real-tcpx/deps.sh's prefix copied to deps/, where
  # the machine has none of its own (NCCL would otherwise fall back to its Socket transport).
  [ -d "$B/deps/usr/lib/x86_64-linux-gnu" ] && export LD_LIBRARY_PATH="$B/deps/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
fi
if has_part closedloop && [ "$SO" != - ] && [ -x "$B/bin/tcpx-run" ] && [ -x "$B/bin/tcpx-rxdm-standin" ]; then
  start=$(date +%s)
  PLANS="$B/plans" bash "$B/real-tcpx/closed-loop.sh" "$SO" "$B/bin" "$O/closed-loop" > "$O/closed-loop.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && FAIL=1
  ROWS+=("$(printf '%-44s rc=%-3s %4ss' "real-tcpx/closed-loop.sh" "$rc" "$(( $(date +%s) - start ))")")
  grep -E '^(==|# chosen)' "$O/closed-loop.log" | cut -c1-300 | head -n 40
elif has_part closedloop; then
  SKIPS+=("closed loop: needs Google's plugin .so, bin/tcpx-run and bin/tcpx-rxdm-standin")
fi
if has_part realplugin; then
  if [ -x "$B/bin/tcpx-run" ] && [ -x "$B/bin/tcpx-rxdm-standin" ]; then
    start=$(date +%s)
    bash "$B/real-tcpx/validate-onegpu.sh" "$SO" "$B/bin" "$O/validate-onegpu" > "$O/validate-onegpu.log" 2>&1
    rc=$?; [ $rc -ne 0 ] && FAIL=1
    ROWS+=("$(printf '%-44s rc=%-3s %4ss' "real-tcpx/validate-onegpu.sh" "$rc" "$(( $(date +%s) - start ))")")
    grep -E '^(==|  )' "$O/validate-onegpu.log" | head -n 60
    if [ "$SO" != - ]; then
      # tcpx-run fleet over the plugin: two nodes on lo, the flow-steering wait inside set-up.
      start=$(date +%s)
      bash "$B/real-tcpx/fleet-plugin.sh" "$SO" "$B/bin" "$O/fleet-plugin" > "$O/fleet-plugin.log" 2>&1
      rc=$?; [ $rc -ne 0 ] && FAIL=1
      ROWS+=("$(printf '%-44s rc=%-3s %4ss' "real-tcpx/fleet-plugin.sh" "$rc" "$(( $(date +%s) - start ))")")
      grep -E '^(==|   median|   FAIL)' "$O/fleet-plugin.log" | head -n 20
    fi
  else
    SKIPS+=("real plugin: bin/tcpx-run or bin/tcpx-rxdm-standin missing from the bundle")
  fi
fi
"#;

const RUN_SH_HEAD: &str = r#"#!/usr/bin/env bash
# Written by `cargo xtask gpu-test`; run on a GPU machine from the repository root:
#   bash .device-bundle/run.sh
# Tests run with TCPX_REQUIRE_GPU=1 (no GPU = failure). Logs go to $OUT (or .device-bundle/out).
set -u
B="$(cd "$(dirname "$0")" && pwd)"
O="${OUT:-$B/out}"
mkdir -p "$O"
: > "$O/tests.log"; : > "$O/bench.log"; : > "$O/results.jsonl"
# NVLink multicast stays off on shared hosts (see the device notes); never reset or reconfigure GPUs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TCPX_REQUIRE_GPU=1 RUST_BACKTRACE=1 TCPX_RUN_BIN="$B/bin/tcpx-run"
[ -f "$B/lib/libtcpx_test_plugin.so" ] && export TCPX_TEST_PLUGIN_SO="$B/lib/libtcpx_test_plugin.so"
# NVRTC and NCCL come from the machine's CUDA toolkit or Python wheels: put their folders on the path.
libdirs="$B/lib"
for pat in 'libnvrtc.so.13' 'libnvrtc.so.12' 'libnccl.so.2'; do
  f=$(find /usr/local/cuda/lib64 /usr/local/cuda*/ /usr/lib /usr/lib64 /usr/local/lib /opt -name "$pat" 2>/dev/null | head -n 1)
  if [ -n "$f" ]; then libdirs="$libdirs:$(dirname "$f")"; echo "found $f"; fi
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi -L 2>&1 | tee -a "$O/tests.log"
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total --format=csv 2>&1 | tee -a "$O/tests.log"
nvidia-smi topo -m >> "$O/tests.log" 2>&1
{ lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node\(s\))'; free -g | head -n 2; uname -r; } 2>&1 | tee -a "$O/tests.log"
# Benchmarks go GPU 0 -> GPU 1 where there are two GPUs, GPU 0 -> GPU 0 on one.
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "$NGPU" -ge 2 ]; then DST=1; else DST=0; fi
echo "GPUs: $NGPU; benchmarks go GPU 0 -> GPU $DST"
PARTS=" ${TCPX_BUNDLE_PARTS:-tests ratios bench realplugin} "
has_part() { case "$PARTS" in *" $1 "*) return 0;; esac; return 1; }
declare -a SKIPS
skip_bench() { SKIPS+=("benchmark $1: $2"); echo "SKIP: benchmark $1: $2" | tee -a "$O/bench.log"; }
ulimit -l unlimited 2>/dev/null || true
# The NCCL tests go GPU -> GPU over NET/Socket on loopback, like the benchmark below.
NCCL_SOCKET_ENV="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
NCCL_TUNED_ENV="NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 NCCL_NCHANNELS_PER_NET_PEER=4 NCCL_P2P_NET_CHUNKSIZE=2097152 NCCL_BUFFSIZE=16777216"
declare -a ROWS
FAIL=0
has_part tests || SKIPS+=("tests: not asked for (TCPX_BUNDLE_PARTS=$PARTS)")
for t in "$B"/tests/*; do
  has_part tests || break
  n=$(basename "$t")
  echo "=== $n" >> "$O/tests.log"
  start=$(date +%s)
  env $NCCL_SOCKET_ENV timeout 150 "$t" --test-threads=1 >> "$O/tests.log.part" 2>&1
  rc=$?
  cat "$O/tests.log.part" >> "$O/tests.log"
  sum=$(grep -E '^test result' "$O/tests.log.part" | tail -n 1 | sed 's/test result: //; s/; finished in.*//')
  # libtest prints "test name ... " before the test runs, so a skip line follows it on that line.
  skips=$(grep -c 'SKIP: ' "$O/tests.log.part")
  rm -f "$O/tests.log.part"
  [ $rc -ne 0 ] && FAIL=1
  ROWS+=("$(printf '%-44s rc=%-3s %4ss skips=%-2s %s' "$n" "$rc" "$(( $(date +%s) - start ))" "$skips" "$sum")")
done
grep -E '^(---- |thread .* panicked|failures:)' "$O/tests.log" | head -n 40
"#;

/// Host path against plain C TCP with the same buffers and stream counts, interleaved, and the
/// GPU staging path against the same yardstick at 16 streams.
const RUN_SH_RATIOS: &str = r#"
run="$B/bin/tcpx-run"
if has_part ratios && [ -x "$run" ]; then
  echo "=== host path ratios: plain C TCP, tcpx-run baseline, tcpx-run bench (socket, host memory)" >> "$O/bench.log"
  YARD=""
  if command -v gcc >/dev/null 2>&1 && gcc -O2 -pthread -o "$O/tcp_yardstick" "$B/tcp_yardstick.c" >> "$O/bench.log" 2>&1; then
    YARD="$O/tcp_yardstick"
  else
    skip_bench "plain C TCP yardstick" "no gcc on this machine (ratios use tcpx-run baseline only)"
  fi
  RSIZE="${TCPX_RATIO_SIZE:-256M}"; RBYTES=$(( ${RSIZE%M} * 1048576 ))
  RITERS="${TCPX_RATIO_ITERS:-20}"
  for rep in $(seq 1 "${TCPX_RATIO_REPS:-3}"); do
    for k in ${TCPX_RATIO_STREAMS:-1 2 4 8 16}; do
      # The yardstick: free-running plain C (each stream its own buffers, whole-buffer calls, a
      # fixed time, no barriers: what iperf3 -P K measures).
      [ -n "$YARD" ] && TCP_YARDSTICK_FREE="${TCPX_RATIO_FREE_SECS:-2}" timeout 60 "$YARD" "$RBYTES" 1 "$k" 1 0 2>>"$O/bench.log" | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free\",/" >> "$O/ratios.jsonl"
      # The same with each receiver's reads walking its whole buffer (TCP_YARDSTICK_WALK), as the
      # tool's receives fill whole requests: the free-running yardstick's reads all land in the
      # same few cache-resident MiB, which costs the kernel less per byte.
      [ -n "$YARD" ] && TCP_YARDSTICK_WALK=1 TCP_YARDSTICK_FREE="${TCPX_RATIO_FREE_SECS:-2}" timeout 60 "$YARD" "$RBYTES" 1 "$k" 1 0 2>>"$O/bench.log" | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free_walk\",/" >> "$O/ratios.jsonl"
      # And walking through a 256 KiB bounce copied on with streaming stores: the fastest plain C
      # found that fills its buffer (the socket backend receives large buffers this way).
      [ -n "$YARD" ] && TCP_YARDSTICK_BOUNCE=262144 TCP_YARDSTICK_NT=1 TCP_YARDSTICK_FREE="${TCPX_RATIO_FREE_SECS:-2}" timeout 60 "$YARD" "$RBYTES" 1 "$k" 1 0 2>>"$O/bench.log" | sed "s/^{/{\"rep\":$rep,\"what\":\"c_free_fill\",/" >> "$O/ratios.jsonl"
      # Plain C moving one message in K slices at 256 KiB and whole-slice calls, the stronger
      # kept (a column that explains: the slowest stream holds the message back). Then plain C with a barrier after every
      # iteration (each iteration its own transfer, as the tool times them): for reference.
      for call in 262144 0; do
        [ -n "$YARD" ] && timeout 60 "$YARD" "$RBYTES" "$RITERS" "$k" 1 "$call" 2>>"$O/bench.log" | sed "s/^{/{\"rep\":$rep,\"what\":\"c_tcp_$call\",/" >> "$O/ratios.jsonl"
      done
      [ -n "$YARD" ] && TCP_YARDSTICK_SYNC=1 timeout 60 "$YARD" "$RBYTES" "$RITERS" "$k" 1 262144 2>>"$O/bench.log" | sed "s/^{/{\"rep\":$rep,\"what\":\"c_sync\",/" >> "$O/ratios.jsonl"
      timeout 60 "$run" baseline --json --streams "$k" --size "$RSIZE" --iters "$RITERS" 2>>"$O/bench.log" | tail -n 1 | sed "s/^{/{\"rep\":$rep,\"what\":\"baseline\",/" >> "$O/ratios.jsonl"
      # The tool with no chunk or window flags (its own rule), then with 8 MiB requests, 8 and 32
      # in flight (32: NCCL's most per comm), with a barrier before every iteration and
      # (--barrier size) with the timed iterations back to back as nccl-tests runs them.
      for w in auto ${TCPX_RATIO_WINDOWS:-8 32}; do
        tf=(--chunk 8M --window "$w"); [ "$w" = auto ] && tf=()
        for b in ${TCPX_RATIO_BARRIERS:-iteration size}; do
          what="tcpx_host_w$w"; [ "$b" = size ] && what="tcpx_b2b_w$w"
          # --sample-ms: the process's CPU over the timed iterations, for CPU per byte.
          out=$(timeout 90 "$run" bench --role local --no-csv --json --verify off --barrier "$b" --channels 1 --socks-per-channel "$k" --size "$RSIZE" "${tf[@]}" --iters "$RITERS" --warmup 2 --sample-ms 10 2>>"$O/bench.log" | tail -n 1)
          g=$(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin)["measurements"][0]["recv"]; print(r["algbw_gbs"], json.dumps((r.get("cpu") or {}).get("cpu_s_per_gb")))' 2>/dev/null)
          [ -n "$g" ] && echo "{\"rep\":$rep,\"what\":\"$what\",\"streams\":$k,\"gbps\":${g%% *},\"cpu_s_per_gb\":${g#* }}" >> "$O/ratios.jsonl"
        done
      done
    done
    # GPU staging, GPU 0 -> GPU $DST, 16 sockets, every byte checked on the receiving GPU, for
    # each staging variant CHUNK:WINDOW:RING (RING auto: the tool's default ring; whole: a ring
    # as large as the message, the footprint of a per-buffer mirror, which lives in DRAM).
    for v in ${TCPX_RATIO_GPU_STAGING:-8M:8:auto 8M:8:whole 4M:8:32M}; do
      IFS=: read -r c w r <<< "$v"
      tag=""; [ "$v" != "8M:8:auto" ] && tag="c${c}w${w}r${r}_"
      for sz in ${TCPX_RATIO_GPU_SIZES:-256M 1G}; do
        ring=""
        case "$r" in auto) ;; whole) ring="--staging-ring $sz" ;; *) ring="--staging-ring $r" ;; esac
        for b in ${TCPX_RATIO_BARRIERS:-iteration size}; do
          what="tcpx_gpu_${tag}$sz"; [ "$b" = size ] && what="tcpx_gpu_b2b_${tag}$sz"
          out=$(timeout 120 "$run" bench --role local --no-csv --json --verify on --barrier "$b" --memory "cuda:0,$DST" --channels 1 --socks-per-channel 16 --size "$sz" --chunk "$c" --window "$w" $ring --iters 5 --warmup 1 2>>"$O/bench.log" | tail -n 1)
          g=$(echo "$out" | python3 -c 'import json,sys; m=json.load(sys.stdin)["measurements"][0]; print(m["recv"]["algbw_gbs"], m["recv"].get("wrong_bytes", m["recv"].get("wrong", "?")))' 2>/dev/null)
          [ -n "$g" ] && echo "{\"rep\":$rep,\"what\":\"$what\",\"streams\":16,\"gbps\":${g%% *},\"wrong\":\"${g#* }\"}" >> "$O/ratios.jsonl"
        done
      done
    done
  done
  cat "$O/ratios.jsonl" >> "$O/results.jsonl"
  python3 "$B/ratios.py" "$O/ratios.jsonl" "$DST" 2>&1 | tee -a "$O/bench.log"
fi
"#;

/// Summarises the bundle's `ratios.jsonl` (also usable on a copy brought back from the GPU host:
/// `python3 ratios.py ratios.jsonl [destination GPU]`): medians, and each ratio's median and range over the
/// repetitions, a repetition's ratio taken against the same repetition's yardstick.
const RATIOS_PY: &str = r#"import json, re, sys, statistics as st
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
DST = sys.argv[2] if len(sys.argv) > 2 else "0"
by = {}
for r in rows:
    by.setdefault((r["what"], r["streams"], r["rep"]), r["gbps"])
# The yardstick of a repetition: free-running plain C (c_free) in that repetition; plain C moving
# one message in K slices (c_best, the better of its call sizes) is an extra column.
for (w, k, p), g in list(by.items()):
    if w.startswith("c_tcp_"):
        by[("c_best", k, p)] = max(by.get(("c_best", k, p), 0), g)
ks = sorted({r["streams"] for r in rows})
reps = sorted({r["rep"] for r in rows})
calls = sorted({r["what"] for r in rows if r["what"].startswith("c_tcp_")})
def variants(prefix, label, auto_label):
    ws = {r["what"][len(prefix):] for r in rows if r["what"].startswith(prefix)}
    auto = [(prefix + "auto", auto_label)] if "auto" in ws else []
    return auto + [(prefix + str(w), label % w) for w in sorted(int(x) for x in ws if x.isdigit())]
# The tool's rows: with no flags (window "auto") first, a barrier before every iteration, then
# the timed iterations back to back.
tools = variants("tcpx_host_w", "8M x %d", "no flags") + variants("tcpx_b2b_w", "8M x %d back to back", "no flags back to back")
# GPU rows: tcpx_gpu_[b2b_][cCHUNKwWINDOWrRING_]SIZE (no variant part: 8M x 8, the default
# staging), ordered by variant, size, then back to back after per-iteration.
def nbytes(t):
    """4096, 512K, 8M, 1G as bytes; 0 for words (auto, whole, off) and None."""
    m = re.fullmatch(r"(\d+)([KMG]?)", t or "")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)] if m else 0
def gpu_key(w):
    m = re.fullmatch(r"tcpx_gpu_(b2b_)?(?:c(\w+?)w(\d+)r(\w+?)_)?(\d+[KMG]?)", w)
    if not m:
        return None
    b2b, c, win, ring, size = m.groups()
    label = "GPU " + size
    if c:
        rings = {"off": "mirror", "whole": "ring = message", "auto": "ring auto"}
        label += " %s, %s x %s" % (rings.get(ring, "ring " + ring), c, win)
    variant = (nbytes(c), int(win or 0), nbytes(ring), ring or "") if c else ()
    return (variant, nbytes(size), bool(b2b)), label + (" back to back" if b2b else "")
gpus = sorted(((gpu_key(w)[0], w, gpu_key(w)[1]) for w in {r["what"] for r in rows} if gpu_key(w)))
gpus = [(w, l) for _, w, l in gpus]
def med(w, k):
    v = [by[(w, k, p)] for p in reps if (w, k, p) in by]
    return "%.2f" % st.median(v) if v else "-"
def ratio(a, k, b):
    v = [by[(a, k, p)] / by[(b, k, p)] for p in reps if (a, k, p) in by and by.get((b, k, p))]
    return "%.2f [%.2f-%.2f]" % (st.median(v), min(v), max(v)) if v else "-"
# Older logs have no free-running rows: then the one-message best is the yardstick.
Y = "c_free" if any(r["what"] == "c_free" for r in rows) else "c_best"
print("Plain C per call size (GB/s, median): " + "; ".join(
    "%s: %s" % (c.replace("c_tcp_", "call ").replace("call 0", "whole slice"), " ".join("%d:%s" % (k, med(c, k)) for k in ks)) for c in calls))
# The walking yardstick (c_free_walk): receives land all over each receiver's buffer, the memory
# traffic the tool has; a column of its own and the tool's ratios to it, where it was run.
W = "c_free_walk" if any(r["what"] == "c_free_walk" for r in rows) else None
# The filling yardstick (c_free_fill): walking through a bounce with streaming stores, the fastest
# plain C found whose received bytes land in its buffer.
F = "c_free_fill" if any(r["what"] == "c_free_fill" for r in rows) else None
head = ["streams", "plain C free-running (yardstick)"] + (["plain C free-running, receives walking the buffer"] if W else [])
head += ["plain C filling its buffer through a bounce"] if F else []
head += ["plain C one message, best call size", "plain C, barrier per iteration", "tcpx-run baseline"]
head += ["tcpx-run bench, %s" % l for _, l in tools]
head += ["%s / yardstick" % l for _, l in tools]
head += ["%s / walking yardstick" % l for _, l in tools] if W else []
head += ["%s / filling C" % l for _, l in tools] if F else []
head += ["%s / C one message" % l for _, l in tools]
for _, l in gpus:
    head += ["%s GPU0->GPU%s" % (l, DST), "%s / yardstick" % l] + (["%s / walking" % l] if W else [])
    head += ["%s / filling C" % l] if F else []
print("| " + " | ".join(head) + " |")
print("|" + "---:|" * len(head))
for k in ks:
    g = k == 16
    cells = [str(k), med("c_free", k)] + ([med(W, k)] if W else []) + ([med(F, k)] if F else [])
    cells += [med("c_best", k), med("c_sync", k), med("baseline", k)]
    cells += [med(w, k) for w, _ in tools]
    cells += [ratio(w, k, Y) for w, _ in tools]
    cells += [ratio(w, k, W) for w, _ in tools] if W else []
    cells += [ratio(w, k, F) for w, _ in tools] if F else []
    cells += [ratio(w, k, "c_best") for w, _ in tools]
    for w, _ in gpus:
        cells += [med(w, k) if g else "-", ratio(w, k, Y) if g else "-"]
        cells += [ratio(w, k, W) if g else "-"] if W else []
        cells += [ratio(w, k, F) if g else "-"] if F else []
    print("| " + " | ".join(cells) + " |")
# CPU per byte over the timed part (the yardstick's getrusage, the tool's --sample-ms) and the
# CPUs that kept busy (CPU-s per GB x GB/s): where the CPUs are the limit, these two explain the
# ratio.
def cpu(r):
    if "sys_s" in r and r.get("bytes"):
        return (r["user_s"] + r["sys_s"]) / (r["bytes"] / 1e9)
    return r.get("cpu_s_per_gb")
cpus = {(r["what"], r["streams"], r["rep"]): cpu(r) for r in rows if cpu(r) is not None}
if cpus:
    def cpu_cells(w, k):
        v = [(cpus[(w, k, p)], by[(w, k, p)]) for p in reps if (w, k, p) in cpus and (w, k, p) in by]
        if not v:
            return ["-", "-"]
        return ["%.3f" % st.median([c for c, _ in v]), "%.1f" % st.median([c * g for c, g in v])]
    head = ["streams", "yardstick CPU-s/GB", "yardstick CPUs busy"]
    head += ["walking CPU-s/GB", "walking CPUs busy"] if W else []
    for _, l in tools:
        head += ["%s CPU-s/GB" % l, "%s CPUs busy" % l]
    print("CPU per byte over the timed part (median) and CPUs busy (CPU-s per GB x GB/s):")
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for k in ks:
        cells = [str(k)] + cpu_cells(Y, k) + (cpu_cells(W, k) if W else [])
        for w, _ in tools:
            cells += cpu_cells(w, k)
        print("| " + " | ".join(cells) + " |")
wrong = {str(r.get("wrong")) for r in rows if r["what"].startswith("tcpx_gpu")}
print("GPU rows, wrong bytes per run:", ", ".join(sorted(wrong)) or "none run")
"#;

const RUN_SH_BENCH: &str = r#"
bench="$B/bin/tcpx-gpu-bench"
if has_part bench; then
rec() { tee -a "$O/bench.log" | grep '^RESULT ' | sed 's/^RESULT //' >> "$O/results.jsonl"; }
echo "=== pinned copies" >> "$O/bench.log"
timeout 60 "$bench" pinned --gpu 0 2>&1 | rec
echo "=== TCPX unpack kernel vs device-to-device copy (target >= 70%)" >> "$O/bench.log"
timeout 120 "$bench" unpack --sizes 512K,1M,2M,4M 2>&1 | rec
timeout 60 "$bench" unpack --sizes 512K,4M --min-fragment 2048 2>&1 | rec
echo "=== raw TCP loopback" >> "$O/bench.log"
timeout 90 "$bench" tcp --streams 1,2,4,8,16 --total 8G 2>&1 | rec
# NCCL's network runs: on one GPU (DST 0) the two ranks are 2 NCCL hosts, a process each.
echo "=== NCCL NET/Socket, defaults (GPU 0 -> GPU $DST)" >> "$O/bench.log"
env $NCCL_SOCKET_ENV NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout 150 "$bench" nccl --src 0 --dst $DST --sizes @SIZES@ --label socket-default --allreduce 2>&1 | rec
echo "=== NCCL NET/Socket, 4 sockets x 4 threads (GPU 0 -> GPU $DST)" >> "$O/bench.log"
env $NCCL_SOCKET_ENV NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 timeout 150 "$bench" nccl --src 0 --dst $DST --sizes @SIZES@ --label socket-4x4 2>&1 | rec
# NCCL at its best measured on this path (docs/PERFORMANCE.md, "Against NCCL NET/Socket tuned"):
# its network chunk (128 KiB by default) is the lever; 2 MiB chunks and 4 channels per peer.
echo "=== NCCL NET/Socket, 4x4, 4 channels per peer, 2 MiB network chunks (GPU 0 -> GPU $DST)" >> "$O/bench.log"
env $NCCL_SOCKET_ENV $NCCL_TUNED_ENV timeout 150 "$bench" nccl --src 0 --dst $DST --sizes @SIZES@ --label socket-4x4-ch4-2m 2>&1 | rec
# NCCL's own intra-node transports (NVLink/P2P) need a GPU per rank.
if [ "$NGPU" -ge 2 ]; then
echo "=== NCCL default transports (NVLink/P2P), for scale" >> "$O/bench.log"
timeout 90 "$bench" nccl --sizes 256M,1G --label nccl-p2p-default 2>&1 | rec
else
  skip_bench "NCCL over NVLink/P2P" "NCCL's intra-node transports need one GPU per rank: 2 GPUs, this machine has $NGPU"
fi
echo "=== socket backend GPU 0 -> GPU $DST (pinned staging), 1 channel" >> "$O/bench.log"
timeout 240 "$bench" socket --src 0 --dst $DST --sizes @SIZES@ --socks 1,2,4,8,16 --channels 1 2>&1 | rec
echo "=== socket backend GPU 0 -> GPU $DST (pinned staging), 4 channels" >> "$O/bench.log"
timeout 120 "$bench" socket --src 0 --dst $DST --sizes 64M,256M,1G --socks 2,4 --channels 4 2>&1 | rec
if [ "$NGPU" -ge 2 ]; then
echo "=== nccl transport backend through the driver (NET/Socket env, 8 MiB chunks)" >> "$O/bench.log"
env $NCCL_SOCKET_ENV timeout 120 "$bench" socket --sizes 16M,256M,1G --socks 0 --channels 1 2>&1 | rec
else
  skip_bench "nccl transport backend in one process" "two ranks in one process need 2 GPUs (tcpx-run bench --transport nccl below runs it on one GPU as 2 NCCL hosts)"
fi
# The same comparison through the tool's own driver (tcpx-run bench), when it is in the bundle.
if [ -x "$run" ]; then
  C="--size 64M,256M,1G --iters 5 --warmup 1 --no-csv --timeout 60 --memory cuda:0,$DST"
  echo "=== tcpx-run bench" >> "$O/bench.log"
  timeout 100 "$run" bench $C --chunk 8M --window 8 --transport socket --channels 1 --socks-per-channel 16 --name socket-gpu-1x16 >> "$O/bench.log" 2>&1
  # On one GPU the nccl backend's sides run as 2 NCCL hosts, a process each. Its default chunk
  # is the whole message: one ncclSend/ncclRecv per message, as NCCL's own benchmark calls it.
  env $NCCL_SOCKET_ENV timeout 100 "$run" bench $C --transport nccl --channels 1 --name nccl-socket >> "$O/bench.log" 2>&1
  env $NCCL_SOCKET_ENV NCCL_NSOCKS_PERTHREAD=4 NCCL_SOCKET_NTHREADS=4 timeout 100 "$run" bench $C --transport nccl --channels 1 --name nccl-socket-4x4 >> "$O/bench.log" 2>&1
  env $NCCL_SOCKET_ENV $NCCL_TUNED_ENV timeout 100 "$run" bench $C --transport nccl --channels 1 --name nccl-socket-4x4-ch4-2m >> "$O/bench.log" 2>&1
fi
if [ "${TCPX_GPU_SWEEP:-0}" = 1 ]; then
  # Chunk x window sweep of the socket GPU path at 16 sockets (TCPX_GPU_SWEEP=1 bash run.sh).
  for c in 2M 4M 16M 32M; do for w in 4 16; do
    echo "=== sweep chunk $c window $w" >> "$O/bench.log"
    timeout 60 "$bench" socket --src 0 --dst $DST --sizes 256M,1G --socks 16 --chunk $c --window $w --iters 3 2>&1 | rec
  done; done
fi
grep -vE '^RESULT ' "$O/bench.log" | grep -E '^(nccl|pinned|unpack|tcp|socket|===|tcpx-gpu-bench: error|# tcpx-run bench|tcpx-run: )|^ +[0-9]+ +[0-9]+ +uint8 '
else
  SKIPS+=("benchmarks: not asked for (TCPX_BUNDLE_PARTS=$PARTS)")
fi
"#;

/// Issue 7's measurements, one purpose per device call: `bash .device-bundle/scaling.sh peer`
/// (GPU0 -> GPU1: plain peer copies against the cudap2p backend, one and two processes) and
/// `bash .device-bundle/scaling.sh matrix` (the machine's GPUs split into two "nodes" over
/// loopback TCP: single vs multi-process x 1/2/4 emulated NICs x 1/2/4/8 channels per GPU).
const SCALING_SH: &str = r###"#!/usr/bin/env bash
# Written by `cargo xtask gpu-test`; run from the repository root on a GPU machine:
#   bash .device-bundle/scaling.sh peer|matrix|plans|topo
set -u
B="$(cd "$(dirname "$0")" && pwd)"
O="${OUT:-$B/out}"
mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RUST_BACKTRACE=1
libdirs="$B/lib"
for pat in 'libnvrtc.so.13' 'libnvrtc.so.12'; do
  f=$(find /usr/local/cuda/lib64 /usr/local/cuda*/ /usr/lib /usr/lib64 /usr/local/lib /opt -name "$pat" 2>/dev/null | head -n 1)
  [ -n "$f" ] && libdirs="$libdirs:$(dirname "$f")"
done
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ulimit -n 65536 2>/dev/null || true
ulimit -l unlimited 2>/dev/null || true
run="$B/bin/tcpx-run"; bench="$B/bin/tcpx-gpu-bench"
N=$(nvidia-smi -L | grep -c '^GPU ')
LOG="$O/scaling.log"
{ date -u; nvidia-smi -L; nvidia-smi topo -m; nproc; } >> "$LOG" 2>&1
what="${1:-matrix}"
SIZE="${TCPX_SCALING_SIZE:-256M}"
if [ "$what" = topo ]; then
  "$run" topo 2>&1 | tee -a "$LOG"
fi
if [ "$what" = peer ]; then
  echo "=== plain peer copies GPU0 -> GPU1" | tee -a "$LOG"
  timeout 120 "$bench" peer --sizes 64M,256M,1G 2>&1 | tee -a "$LOG" | grep -E '^(peer|tcpx-gpu-bench)'
  C="--memory cuda:0,1 --size 64M,256M,1G --iters 10 --warmup 2 --no-csv --timeout 60 --transport cudap2p --channels 1"
  for mode in read write; do
    for chunk in 8M 64M; do
      echo "=== cudap2p one process, $mode, chunk $chunk" | tee -a "$LOG"
      TCPX_CUDAP2P_MODE=$mode timeout 120 "$run" bench --role local --chunk $chunk --window 8 --name cudap2p-$mode-$chunk $C 2>&1 | tee -a "$LOG" | grep -E ' uint8 |error|Wrong|Avg bus'
    done
    echo "=== cudap2p two processes (CUDA IPC), $mode, chunk 64M" | tee -a "$LOG"
    port=$((29500 + RANDOM % 200))
    TCPX_CUDAP2P_MODE=$mode timeout 120 "$run" bench --role server --peer 127.0.0.1:$port --chunk 64M --window 8 --name cudap2p-ipc-$mode $C > "$O/ipc-server-$mode.log" 2>&1 &
    spid=$!
    TCPX_CUDAP2P_MODE=$mode timeout 120 "$run" bench --role client --peer 127.0.0.1:$port --chunk 64M --window 8 --name cudap2p-ipc-$mode $C 2>&1 | tee -a "$LOG" | grep -E ' uint8 |error|Wrong|Avg bus'
    wait $spid; echo "server exit $?" | tee -a "$LOG"; cat "$O/ipc-server-$mode.log" >> "$LOG"
  done
fi
if [ "$what" = plans ]; then
  # The issue-7 plans on this machine's GPUs split in two halves (gpu-loopback targets, adapted).
  H=$((N / 2))
  [ "$H" -ge 1 ] || { echo "plans need at least 2 GPUs, found $N"; exit 1; }
  T="$O/gpu-loopback-${N}gpu.toml"
  sed "s/cuda:0,4/cuda:0,$H/; s/^gpus = 4/gpus = $H/" plans/targets/gpu-loopback.toml > "$T"
  for p in ${TCPX_PLANS:-phase2_single_process phase3_multi_nic phase3_multi_channel}; do
    echo "=== plan $p on $N GPUs (cuda:0,$H)" | tee -a "$LOG"
    timeout 300 "$run" "plans/$p.rhai" --targets "$T" --reports "$O/reports" > "$O/plan-$p.log" 2>&1
    echo "exit $?" >> "$O/plan-$p.log"
    tail -n 25 "$O/plan-$p.log" | tee -a "$LOG"
  done
fi
if [ "$what" = matrix ]; then
  H=$((N / 2))
  [ "$H" -ge 1 ] || { echo "matrix needs at least 2 GPUs, found $N"; exit 1; }
  echo "=== matrix: GPUs 0..$((H-1)) as node A (send), $H..$((N-1)) as node B (recv), $SIZE" | tee -a "$LOG"
  C="--role local --flows $H --memory cuda:0,$H --size $SIZE --iters ${TCPX_SCALING_ITERS:-5} --warmup 2 --chunk 8M --window 8 --socks-per-channel ${TCPX_SCALING_SOCKS:-2} --no-csv --timeout 60"
  k=0
  for mode in single multi; do
    for nics in 1 2 4; do
      list=$(seq -s, -f "127.0.0.%g" 2 $((nics + 1)))
      for ch in ${TCPX_SCALING_CHANNELS:-1 2 4 8}; do
        k=$((k + 1))
        extra=""; [ $mode = multi ] && extra="--multi-process --port $((30000 + k * 16))"
        t0=$(date +%s.%N)
        out=$(timeout 180 "$run" bench $C --channels $ch --nics $list $extra 2>&1)
        rc=$?
        t1=$(date +%s.%N)
        echo "## mode=$mode nics=$nics channels=$ch rc=$rc" >> "$LOG"; echo "$out" >> "$LOG"
        node=$(echo "$out" | grep -E '^# +[0-9]+ +node ' | tail -n 1)
        flows=$(echo "$out" | grep -E '^# +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+' | awk '{printf "%s/%s ", $4, $5}')
        err=$(echo "$out" | grep -E 'error|Error' | head -n 2 | tr '
' ' ')
        printf 'SCALING mode=%s nics=%s channels=%s rc=%s wall=%.1fs node(send recv wrong)=%s per-flow(send/recv)=%s %s
'           "$mode" "$nics" "$ch" "$rc" "$(awk "BEGIN{print $t1 - $t0}")" "$(echo $node | awk '{print $4, $5, $6}')" "$flows" "$err" | tee -a "$LOG"
      done
    done
  done
fi
"###;

const RUN_SH_TAIL: &str = r#"
echo
echo "GPU test run summary ($NGPU GPU(s))"
for r in "${ROWS[@]}"; do echo "$r"; done
echo "Skipped, and why:"
grep -ho 'SKIP: .*' "$O/tests.log" | sed 's/^SKIP: /  test /' | sort | uniq -c
for s in "${SKIPS[@]}"; do echo "  $s"; done
if [ $FAIL -ne 0 ]; then echo "RESULT: some GPU tests FAILED (see $O/tests.log)"; else echo "RESULT: all GPU test executables passed"; fi
exit $FAIL
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_libraries_stay_behind() {
        assert!(is_system_lib("libc.so.6"));
        assert!(is_system_lib("libcuda.so.1"));
        assert!(!is_system_lib("libhwloc.so.15"));
        assert!(!is_system_lib("libudev.so.1"));
    }

    #[test]
    fn script_has_the_safety_settings_and_the_benchmarks_on_request() {
        let with = run_script(true, "1M,2M");
        assert!(with.contains("NCCL_NVLS_ENABLE=0"));
        assert!(
            with.contains("real-tcpx/validate-onegpu.sh"),
            "the real-plugin script runs"
        );
        assert!(with.contains("realplugin}"), "and is a default part");
        assert!(
            with.contains("PLANS=\"$B/plans\" bash \"$B/real-tcpx/closed-loop.sh\""),
            "the closed loop runs on request, with the bundle's plans"
        );
        assert!(with.contains("TCPX_REQUIRE_GPU=1"));
        assert!(with.contains("--sizes 1M,2M"));
        assert!(with.contains("\"$bench\" unpack --sizes 512K,1M,2M,4M"));
        // NCCL is compared at its best measured configuration too, not only at its defaults.
        assert!(with.contains("NCCL_P2P_NET_CHUNKSIZE=2097152"));
        assert!(with.contains("--label socket-4x4-ch4-2m"));
        assert!(with.contains("--name nccl-socket-4x4-ch4-2m"));
        let without = run_script(false, "1M");
        assert!(!without.contains("tcpx-gpu-bench\" nccl"));
        assert!(without.trim_end().ends_with("exit $FAIL"));
    }

    /// run.sh is plain bash, names GPU 1 only through $DST (GPU 0 on a 1-GPU machine), runs
    /// NCCL's two-rank benchmarks only with two GPUs, and lists the skips in its summary.
    #[test]
    fn run_script_parses_and_fits_the_gpu_count() {
        let script = run_script(true, "16M");
        assert!(script.contains("if [ \"$NGPU\" -ge 2 ]; then DST=1; else DST=0; fi"));
        assert!(!script.contains("cuda:0,1"), "GPU 1 named outright");
        assert!(script.contains("--memory \"cuda:0,$DST\""));
        assert!(script.contains("Skipped, and why:"));
        assert!(script.contains("\"$YARD\" \"$RBYTES\""));
        assert!(script.contains("TCP_YARDSTICK_FREE="));
        assert!(bash_parses("run.sh", &script), "bash -n rejected run.sh");
    }

    /// Whether `bash -n` accepts `script`, written to a scratch file named `file`.
    fn bash_parses(file: &str, script: &str) -> bool {
        let dir = std::env::temp_dir().join(format!("xtask-{file}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join(file);
        fs::write(&f, script).unwrap();
        let st = Command::new("bash").arg("-n").arg(&f).status().unwrap();
        fs::remove_dir_all(&dir).unwrap();
        st.success()
    }

    /// 16-stream rows of ratios.jsonl, one per (repetition, what, GB/s).
    fn rows_at_16(rows: &[(u32, &str, f64)]) -> String {
        rows.iter()
            .map(|(rep, what, g)| {
                format!("{{\"rep\":{rep},\"what\":\"{what}\",\"streams\":16,\"gbps\":{g}}}\n")
            })
            .collect()
    }

    /// Runs ratios.py over `jsonl` with `args` after it and returns its output; None where this
    /// machine has no python3.
    fn ratio_summary(name: &str, jsonl: &str, args: &[&str]) -> Option<String> {
        let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (py, data) = (dir.join("ratios.py"), dir.join("ratios.jsonl"));
        fs::write(&py, RATIOS_PY).unwrap();
        fs::write(&data, jsonl).unwrap();
        let out = Command::new("python3")
            .arg(&py)
            .arg(&data)
            .args(args)
            .output();
        fs::remove_dir_all(&dir).unwrap();
        let Ok(out) = out else {
            eprintln!("SKIP: no python3");
            return None;
        };
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The ratio summary reads what run.sh writes and puts each window's ratio against the
    /// repetition's free-running yardstick, and against its best one-message plain C call size.
    #[test]
    fn ratio_summary_takes_each_repetition_against_its_own_yardstick() {
        let rows = [
            (1, "c_free", 40.0),
            (2, "c_free", 20.0),
            (1, "c_tcp_262144", 20.0),
            (1, "c_tcp_0", 10.0),
            (1, "c_sync", 16.0),
            (1, "baseline", 19.0),
            (1, "tcpx_host_w8", 18.0),
            (1, "tcpx_host_w32", 22.0),
            (2, "c_tcp_262144", 10.0),
            (2, "c_tcp_0", 25.0),
            (2, "c_sync", 16.0),
            (2, "baseline", 19.0),
            (2, "tcpx_host_w8", 20.0),
            (2, "tcpx_host_w32", 25.0),
        ];
        let mut text = rows_at_16(&rows);
        // CPU of the timed part: the yardstick's getrusage line and the tool's --sample-ms, at 4
        // streams (the 16-stream rows above have none).
        text.push_str(
            "{\"rep\":1,\"what\":\"c_free\",\"streams\":4,\"gbps\":10.0,\"bytes\":20e9,\"user_s\":1.0,\"sys_s\":9.0}\n",
        );
        text.push_str(
            "{\"rep\":1,\"what\":\"tcpx_host_w8\",\"streams\":4,\"gbps\":8.0,\"cpu_s_per_gb\":0.6}\n",
        );
        text.push_str(
            "{\"rep\":1,\"what\":\"tcpx_host_w32\",\"streams\":4,\"gbps\":9.0,\"cpu_s_per_gb\":null}\n",
        );
        let Some(text) = ratio_summary("ratios", &text, &[]) else {
            return;
        };
        let row = text.lines().find(|l| l.starts_with("| 16 |")).expect(&text);
        // Free-running per repetition: 40 and 20; 8 in flight: 18/40 and 20/20; 32: 22/40 and
        // 25/20. Best one-message C: 20 and 25; 8: 18/20 and 20/25; 32: 22/20 and 25/25.
        assert!(
            row.contains(
                "| 0.72 [0.45-1.00] | 0.90 [0.55-1.25] | 0.85 [0.80-0.90] | 1.05 [1.00-1.10] |"
            ),
            "{row}"
        );
        assert!(text.contains("8M x 32 / yardstick"), "{text}");
        // CPU per byte: (1 + 9) CPU-s over 20 GB, 5 CPUs busy at 10 GB/s; the tool's 0.6 at 8 GB/s;
        // a run without CPU figures shows dashes.
        assert!(
            text.lines()
                .any(|l| l == "| 4 | 0.500 | 5.0 | 0.600 | 4.8 | - | - |"),
            "{text}"
        );
    }

    /// Back-to-back rows (`--barrier size`) get columns of their own beside the per-iteration
    /// ones, host and GPU, each against the same repetition's yardstick.
    #[test]
    fn ratio_summary_shows_back_to_back_runs_beside_per_iteration_ones() {
        let rows = [
            (1, "c_free", 40.0),
            (1, "tcpx_host_w32", 20.0),
            (1, "tcpx_b2b_w32", 30.0),
            (1, "tcpx_gpu_256M", 10.0),
            (1, "tcpx_gpu_b2b_256M", 12.0),
            (1, "tcpx_gpu_c1Mw8r8M_256M", 20.0),
        ];
        let Some(text) = ratio_summary("ratios-b2b", &rows_at_16(&rows), &["1"]) else {
            return;
        };
        // Every GPU column names the destination GPU given on the command line.
        assert!(
            text.contains("| GPU 256M GPU0->GPU1 |")
                && text.contains("| GPU 256M back to back GPU0->GPU1 |"),
            "{text}"
        );
        assert!(
            text.contains("| 8M x 32 back to back / yardstick |"),
            "{text}"
        );
        assert!(
            text.contains("| GPU 256M back to back / yardstick |"),
            "{text}"
        );
        let row = text.lines().find(|l| l.starts_with("| 16 |")).expect(&text);
        // Host: 20/40 and 30/40; GPU: 10/40 and 12/40.
        assert!(
            row.contains("| 0.50 [0.50-0.50] | 0.75 [0.75-0.75] |"),
            "{row}"
        );
        assert!(row.contains("| 12.00 | 0.30 [0.30-0.30] |"), "{row}");
        // A staging variant (1 MiB chunks, 8 in flight, an 8 MiB ring) is a column of its own,
        // after the default mirror's: 20/40.
        assert!(
            text.contains("| GPU 256M back to back GPU0->GPU1 | GPU 256M back to back / yardstick | GPU 256M ring 8M, 1M x 8 GPU0->GPU1 |"),
            "{text}"
        );
        assert!(row.ends_with("| 20.00 | 0.50 [0.50-0.50] |"), "{row}");
    }

    /// With walking-yardstick rows the summary adds their column and the tool's ratio to them,
    /// per repetition, beside the ratio to the free-running yardstick.
    #[test]
    fn ratio_summary_adds_the_walking_yardstick_where_it_ran() {
        let rows = [
            (1, "c_free", 40.0),
            (2, "c_free", 20.0),
            (1, "c_free_walk", 30.0),
            (2, "c_free_walk", 25.0),
            (1, "tcpx_host_w32", 27.0),
            (2, "tcpx_host_w32", 25.0),
        ];
        let Some(text) = ratio_summary("ratios-walk", &rows_at_16(&rows), &[]) else {
            return;
        };
        assert!(text.contains("| 8M x 32 / walking yardstick |"), "{text}");
        let row = text.lines().find(|l| l.starts_with("| 16 |")).expect(&text);
        // Medians 30 and 27.5; the tool to the yardstick 27/40 and 25/20, to the walking one
        // 27/30 and 25/25.
        assert!(
            row.starts_with(
                "| 16 | 30.00 | 27.50 | - | - | - | 26.00 | 0.96 [0.68-1.25] | 0.95 [0.90-1.00] |"
            ),
            "{row}"
        );
    }

    /// No-flags runs come first among the tool's columns, and with filling-yardstick rows the
    /// summary adds their column and every ratio to them, host and GPU, per repetition.
    #[test]
    fn ratio_summary_puts_no_flags_first_and_adds_the_filling_yardstick() {
        let rows = [
            (1, "c_free", 40.0),
            (2, "c_free", 40.0),
            (1, "c_free_fill", 30.0),
            (2, "c_free_fill", 20.0),
            (1, "tcpx_host_w32", 24.0),
            (2, "tcpx_host_w32", 16.0),
            (1, "tcpx_host_wauto", 27.0),
            (2, "tcpx_host_wauto", 22.0),
            (1, "tcpx_gpu_256M", 15.0),
            (2, "tcpx_gpu_256M", 20.0),
        ];
        let Some(text) = ratio_summary("ratios-fill", &rows_at_16(&rows), &[]) else {
            return;
        };
        assert!(
            text.contains("| tcpx-run bench, no flags | tcpx-run bench, 8M x 32 |"),
            "{text}"
        );
        assert!(
            text.contains("| no flags / filling C | 8M x 32 / filling C |"),
            "{text}"
        );
        let row = text.lines().find(|l| l.starts_with("| 16 |")).expect(&text);
        // Medians: free 40, filling 25, no flags 24.5, 8M x 32 20. To the filling C per
        // repetition: no flags 27/30 and 22/20, 8M x 32 24/30 and 16/20; GPU 15/30 and 20/20.
        assert!(row.starts_with("| 16 | 40.00 | 25.00 |"), "{row}");
        assert!(
            row.contains("| 1.00 [0.90-1.10] | 0.80 [0.80-0.80] |"),
            "{row}"
        );
        assert!(row.ends_with("| 0.75 [0.50-1.00] |"), "{row}");
    }

    /// The scaling script is plain bash that `bash -n` accepts, keeps multicast off, and splits
    /// the GPUs into two halves for the node A / node B matrix.
    #[test]
    fn scaling_script_parses_and_splits_the_gpus_in_two() {
        assert!(SCALING_SH.contains("NCCL_NVLS_ENABLE=0"));
        assert!(SCALING_SH.contains("--memory cuda:0,$H"));
        assert!(SCALING_SH.contains("--multi-process"));
        assert!(
            bash_parses("scaling.sh", SCALING_SH),
            "bash -n rejected scaling.sh"
        );
    }
}
