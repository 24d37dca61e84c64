//! tcpx-topo: where things are on this machine.
//!
//! Will hold: CPUs, cores, hyperthread siblings, NUMA nodes, GPUs and NICs with their PCI bus ids and
//! PCI paths (hwloc through `hwlocality`, plus sysfs), GPU <-> NIC pairing by PCI distance, and the
//! NCCL-style TX/RX binding strings derived from that. Filled by the topology issue; nothing here
//! works yet.
//!
//! Not for: changing anything on the system (that is `tcpx-affinity`), or moving data.
