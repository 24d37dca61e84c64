//! tcpx-affinity: thread pinning, IRQ affinity policies and system samplers.
//!
//! * [`pin`]: pin the tool's own threads and read the kernel's mask back ([`pin_current_thread`]).
//! * [`interrupts`] / [`irqmap`]: `/proc/interrupts` parsing and which IRQ serves which NIC queue
//!   in which direction (gve, virtio-net, mlx5, `<ifname>-TxRx-<q>` drivers).
//! * [`policy`]: IRQ affinity plan / apply (backup first, verify, roll back on failure) / reset,
//!   an [`IrqGuard`] that restores on drop, panic and Ctrl-C, stale-backup detection and the root
//!   check.
//! * [`sampler`]: per-CPU time split, IRQs per CPU and NIC, NIC counters and TCP retransmits over
//!   an experiment, as a summary plus raw rows.
//!
//! Cpu lists, `smp_affinity` masks and NCCL binding specs are `tcpx_topo`'s [`CpuSet`] and
//! [`BindingSpec`], re-exported here. Every reader and writer takes a [`SysRoot`], so tests run
//! on fixture trees.
//!
//! Not for: discovering the topology or deriving bindings from it (that is `tcpx-topo`).

pub mod interrupts;
pub mod irqmap;
pub mod pin;
pub mod policy;
pub mod sampler;

pub use interrupts::{Interrupts, IrqId, IrqLine};
pub use irqmap::{map_queue_irqs, Direction, QueueIrq};
pub use pin::{current_thread_affinity, pin_current_thread, PinError, PinReport};
pub use policy::{
    check_privilege, default_backup_path, find_stale_backup, install_signal_restore, queue_irqs,
    read_backup, reset, restore_all_active, Applied, Backup, IrqChange, IrqError, IrqGuard,
    IrqPlan, IrqPolicy, Restored, Spread, StaleBackup,
};
pub use sampler::{SampleError, SampleReport, SampleRow, SampleSummary, Sampler, SamplerHandle};
pub use tcpx_topo::{BindingSpec, CpuSet, SysRoot};
