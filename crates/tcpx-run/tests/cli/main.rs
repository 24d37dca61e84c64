//! The `tcpx-run` command line as users run it: one test binary, one module per command or
//! concern, every run through the harness in [`harness`] (the binary, a deadline on every run,
//! output captured, plan directories with the real target sets). One binary instead of one per
//! file: CI compiles and links the harness and the dependencies' test profile once.
//!
//! The tests run in parallel in this one process (libtest's threads), so each keeps to its own:
//! temporary directories, ports from [`harness::free_ports`] or port 0, fabric ids and namespace
//! tags no other module uses. A test that needs no GPU and no root runs anywhere; one that needs
//! root and `ip netns` (the fabric, the launchers) prints `SKIP: <test>: <reason>` and returns
//! without them.
//!
//! Left as binaries of their own, beside this one:
//! - `validate_gpu.rs`: `cargo xtask gpu-test` bundles it by name for the GPU machine
//!   (`xtask::gpu_test::EXTRA_TESTS`), and the bundle stays small with it alone.
//! - `calibration.rs`: `cargo xtask calibrate` runs its ignored benchmark by name
//!   (`--test calibration`), and its timed fabric runs want the machine to themselves.
//! - `watch_cli.rs`: its verdict test names a slow device by its speed against four bench
//!   processes running side by side, which the other modules' loopback runs would share the
//!   CPUs with.

#[macro_use]
mod harness;
mod launched;

mod accept_channels;
mod backend_env;
mod bench;
mod bench_multi_process;
mod bench_sockets;
mod doctor;
mod fabric;
mod fabric_plan;
mod fleet;
mod fleet_port;
mod harden;
mod harden_files;
mod harden_net;
mod launcher_openmpi;
mod launcher_slurm;
mod limits;
mod netplugin_bench;
mod orphans;
mod output_modes;
mod plan;
mod plan_modes;
mod plan_verdicts;
mod topo_irq;
mod tune;
mod tuned;
mod watch_shim;
