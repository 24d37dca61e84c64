//! tcpx-affinity: CPU lists, NCCL binding specs, thread pinning, IRQ policies and system samplers.
//!
//! Will hold: cpu list and `smp_affinity` mask parsing/formatting, `/proc/interrupts` parsing, IRQ
//! plans that are backed up, applied, verified and restored, and samplers of `/proc/stat`,
//! `/proc/interrupts`, NIC counters and TCP retransmits. Filled by the topology/affinity issue;
//! nothing here works yet.
//!
//! Not for: discovering the topology (that is `tcpx-topo`).
