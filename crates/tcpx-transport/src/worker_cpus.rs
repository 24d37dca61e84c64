//! Where the socket backend's worker threads run (the `worker_cpus` knob,
//! [`tcpx_model::WorkerCpus`]). With `own`, each worker of a comm claims one CPU among those the
//! thread starting the comm may use (its side's `send_cpus`/`recv_cpus`, a `thread_binding`, or
//! the process's mask): the CPU this process's workers hold fewest of, the lowest such. Both
//! sides of a loopback transfer in one process so take disjoint CPUs while there are enough, and
//! a claim is given back when its worker ends. Not for: choosing which CPUs a side may use (the
//! binding knobs do that), or other processes' threads, which this one cannot see.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tcpx_model::WorkerCpus;
use tcpx_topo::CpuSet;

/// How many of this process's workers hold each CPU.
#[derive(Debug, Default)]
pub(crate) struct Loads(BTreeMap<u32, u32>);

impl Loads {
    /// Takes the CPU of `allowed` held by the fewest workers (the lowest such); `None` when
    /// `allowed` is empty.
    pub(crate) fn take(&mut self, allowed: &CpuSet) -> Option<u32> {
        let cpu = allowed
            .iter()
            .min_by_key(|c| (self.0.get(c).copied().unwrap_or(0), *c))?;
        *self.0.entry(cpu).or_insert(0) += 1;
        Some(cpu)
    }

    /// Gives back one hold of `cpu`.
    pub(crate) fn give(&mut self, cpu: u32) {
        if let Some(n) = self.0.get_mut(&cpu) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.0.remove(&cpu);
            }
        }
    }

    /// Workers holding `cpu`.
    #[cfg(test)]
    pub(crate) fn held(&self, cpu: u32) -> u32 {
        self.0.get(&cpu).copied().unwrap_or(0)
    }
}

static LOADS: Mutex<Loads> = Mutex::new(Loads(BTreeMap::new()));

fn loads() -> MutexGuard<'static, Loads> {
    // The map stays consistent whatever a panicking holder did (each change is one statement).
    LOADS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One worker's hold of a CPU; given back when dropped.
#[derive(Debug)]
pub(crate) struct CpuClaim {
    cpu: u32,
}

impl CpuClaim {
    pub(crate) fn cpu(&self) -> u32 {
        self.cpu
    }

    /// Pins the calling thread to the claimed CPU (`tcpx_affinity::pin_current_thread`). An
    /// error leaves the thread where it was.
    pub(crate) fn pin_here(&self) -> Result<(), tcpx_affinity::PinError> {
        tcpx_affinity::pin_current_thread(&std::iter::once(self.cpu).collect()).map(drop)
    }
}

impl Drop for CpuClaim {
    fn drop(&mut self) {
        loads().give(self.cpu);
    }
}

/// Whether `mode` gives each of a comm's `workers` its own CPU, for a thread that may use
/// `allowed`.
pub(crate) fn own_cpus(mode: WorkerCpus, allowed: &CpuSet, workers: usize) -> bool {
    if mode != WorkerCpus::Auto || !mode.own_cpus(allowed.len(), workers, true) {
        return mode.own_cpus(allowed.len(), workers, false);
    }
    let one_node = tcpx_topo::sysfs::in_one_numa_node(&tcpx_topo::SysRoot::live(), allowed);
    mode.own_cpus(allowed.len(), workers, one_node)
}

/// A CPU claim for each of `threads` workers of a comm started by the calling thread, or none
/// where `mode` keeps the kernel's placement (or the kernel does not say where the thread may run).
pub(crate) fn claims(mode: WorkerCpus, threads: usize) -> Vec<Option<CpuClaim>> {
    let allowed = tcpx_affinity::current_thread_affinity().unwrap_or_default();
    if !own_cpus(mode, &allowed, threads) {
        return (0..threads).map(|_| None).collect();
    }
    let mut l = loads();
    (0..threads)
        .map(|_| l.take(&allowed).map(|cpu| CpuClaim { cpu }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(cpus: &[u32]) -> CpuSet {
        cpus.iter().copied().collect()
    }

    #[test]
    fn workers_take_the_least_held_cpus_and_give_them_back() {
        let mut l = Loads::default();
        let side = set(&[0, 1, 2, 3]);
        // One side's four workers, then the other side's: disjoint while there are CPUs enough.
        let a: Vec<u32> = (0..2).map(|_| l.take(&side).unwrap()).collect();
        assert_eq!(a, [0, 1]);
        let b: Vec<u32> = (0..2).map(|_| l.take(&side).unwrap()).collect();
        assert_eq!(b, [2, 3]);
        // More workers than CPUs: they double up evenly.
        assert_eq!(l.take(&side), Some(0));
        assert_eq!(l.take(&side), Some(1));
        l.give(0);
        l.give(0);
        assert_eq!(l.held(0), 0);
        assert_eq!(l.take(&side), Some(0));
        // Only the CPUs a side may use.
        assert_eq!(l.take(&set(&[3, 7])), Some(7));
        assert_eq!(l.take(&set(&[])), None);
        // Giving back a CPU never held changes nothing.
        l.give(42);
        assert_eq!(l.held(42), 0);
    }

    #[test]
    fn auto_owns_cpus_from_sixteen_when_the_workers_fill_half_and_the_others_say_what_they_mean() {
        let many = set(&(0..16).collect::<Vec<u32>>());
        assert!(WorkerCpus::Auto.own_cpus(16, 8, true));
        assert!(WorkerCpus::Auto.own_cpus(32, 16, true));
        // Few workers find idle CPUs by themselves.
        assert!(!WorkerCpus::Auto.own_cpus(16, 4, true));
        assert!(!WorkerCpus::Auto.own_cpus(32, 8, true));
        // Across NUMA nodes, and on small machines: the kernel's placement.
        assert!(!WorkerCpus::Auto.own_cpus(16, 8, false));
        assert!(!WorkerCpus::Auto.own_cpus(15, 8, true));
        assert!(!WorkerCpus::Auto.own_cpus(2, 16, true));
        assert!(own_cpus(WorkerCpus::Own, &set(&[0]), 1));
        assert!(!own_cpus(WorkerCpus::Shared, &many, 16));
        assert!(!own_cpus(WorkerCpus::Auto, &set(&[0, 1]), 2));
        // Shared: no claims, whatever the machine.
        assert!(claims(WorkerCpus::Shared, 3).iter().all(Option::is_none));
        assert_eq!(claims(WorkerCpus::Shared, 3).len(), 3);
    }

    #[test]
    fn an_owned_cpu_pins_the_thread_that_takes_it_and_is_given_back_when_dropped() {
        let allowed = tcpx_affinity::current_thread_affinity().unwrap();
        assert!(!allowed.is_empty(), "sched_getaffinity names no CPU");
        let (cpus, seen) = std::thread::spawn(|| {
            let claims = claims(WorkerCpus::Own, 2);
            let cpus: Vec<u32> = claims.iter().map(|c| c.as_ref().unwrap().cpu()).collect();
            let first = claims[0].as_ref().unwrap();
            first.pin_here().unwrap();
            (cpus, tcpx_affinity::current_thread_affinity().unwrap())
        })
        .join()
        .unwrap();
        // The kernel holds the thread to the claimed CPU, one of those it was allowed.
        assert_eq!(seen, set(&[cpus[0]]));
        assert!(
            cpus.iter().all(|&c| allowed.contains(c)),
            "{cpus:?} not in {allowed}"
        );
        if allowed.len() >= 2 {
            assert_ne!(cpus[0], cpus[1], "two workers of one comm share a CPU");
        }
        // The claims ended with the thread.
        assert!(cpus.iter().all(|&c| loads().held(c) == 0), "{:?}", loads());
        // This thread's own mask is untouched.
        assert_eq!(tcpx_affinity::current_thread_affinity().unwrap(), allowed);
    }
}
