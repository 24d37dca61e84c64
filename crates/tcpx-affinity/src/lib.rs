//! tcpx-affinity: thread pinning, IRQ affinity policies and system samplers.
//!
//! * [`pin`]: pin the tool's own threads and read the kernel's mask back ([`pin_current_thread`]).
//! * [`interrupts`] / [`irqmap`]: `/proc/interrupts` parsing and which IRQ serves which NIC queue
//!   in which direction (gve, virtio-net, mlx5, `<ifname>-TxRx-<q>` drivers).
//! * [`policy`]: IRQ affinity plan / apply (backup first, verify, roll back on failure) / reset,
//!   an [`IrqGuard`] that restores on drop, panic and Ctrl-C, stale-backup detection and the root
//!   check.
//! * [`choice`]: the `irq_policy` knob's policies (`default`, `nccl`, `numa-local`) as an
//!   [`IrqPolicy`] for one machine's topology, shared by plan runs and `tcpx-run apply --irq`.
//! * [`sampler`]: per-CPU time split, IRQs per CPU and NIC, NIC counters and TCP retransmits over
//!   an experiment, as a summary plus raw rows.
//! * [`irq_report`]: what `tcpx-run irq` shows (queue IRQs, per-NIC summary, a policy's plan, a
//!   backup's restore preview), policies from specs or the topology, and the timed hold.
//!
//! Cpu lists, `smp_affinity` masks and NCCL binding specs are `tcpx_topo`'s [`CpuSet`] and
//! [`BindingSpec`], re-exported here. Every reader and writer takes a [`SysRoot`], so tests run
//! on fixture trees.
//!
//! Not for: discovering the topology or deriving bindings from it (that is `tcpx-topo`).
//!
//! # How it works
//!
//! `pin_current_thread` (sched_setaffinity via nix, mask read back and logged). `Interrupts::parse`
//! (`/proc/interrupts`), `map_queue_irqs` (gve `gve-ntfy-blk<i>@pci:<bdf>`: first half TX, second
//! half RX; virtio `input.q`/`output.q`; mlx5 `mlx5_comp<q>` combined; `<if>-TxRx-<q>`).
//! `IrqPolicy{tx, rx, spread}.plan(root)` -> `IrqPlan` (table of current vs target per IRQ);
//! `apply(backup)` writes the backup file first (atomic rename), writes each `smp_affinity`, reads
//! back and verifies; any failure rolls back what was written and removes the backup (or, if that
//! fails, keeps it and prints the restore command). `apply_guarded` returns an `IrqGuard` that restores
//! on drop (also during panic unwinding) and, where the binary asked for it (`restore_on_interrupt`),
//! on Ctrl-C/SIGTERM through a `ctrlc` handler that restores and hands over to the binary to exit.
//! `reset(root, backup)` restores; `find_stale_backup` reports a leftover backup with its restore command; writing to the live `/proc` without euid 0 is refused.
//! `Sampler::start(root, interval)` -> `SamplerHandle`; `stop()` (bounded by interval + 5 s) ->
//! `SampleReport{summary, rows}`: per-CPU busy/user/system/irq/softirq shares, hot cores (> 50 %
//! busy), softirq share of busy time, IRQs per CPU and per NIC (busiest CPU share), NIC bytes/packets/
//! drops and GB/s, TCP retransmits; `rows` are long-format `t_s,source,subject,metric,value` (CSV).
//!
//! Invariants: no IRQ change outlives the process that made it unless the user asked for it
//! (`tcpx-run irq apply --yes`), and then a backup exists until `irq reset`; the sampler thread only
//! reads files and never blocks the measured threads.

#![forbid(unsafe_code)]

pub mod choice;
pub mod interrupts;
pub mod irq_report;
pub mod irqmap;
pub mod pin;
pub mod policy;
pub mod sampler;

pub use interrupts::{Interrupts, IrqId, IrqLine};
pub use irqmap::{map_queue_irqs, Direction, QueueIrq};
pub use pin::{current_thread_affinity, pin_current_thread, PinError, PinReport};
pub use policy::{
    check_privilege, default_backup_path, find_stale_backup, install_signal_restore, queue_irqs,
    read_backup, reset, restore_all_active, restore_on_interrupt, Applied, Backup, IrqChange,
    IrqError, IrqGuard, IrqPlan, IrqPolicy, Restored, Spread, StaleBackup,
};
pub use sampler::{SampleError, SampleReport, SampleRow, SampleSummary, Sampler, SamplerHandle};
pub use tcpx_topo::{BindingSpec, CpuSet, SysRoot};
