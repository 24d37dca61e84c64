//! Pinning the tool's own threads, with the kernel's actual mask read back and logged next to the
//! expected one (the seeds' step 4.1: "expected cores 8-21,112-125, actual cores 8-21,112-125").

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet as NixCpuSet};
use nix::unistd::Pid;
use serde::Serialize;
use tcpx_topo::CpuSet;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("cannot pin to an empty cpu set")]
    Empty,
    #[error("CPU {cpu} is beyond what sched_setaffinity takes here ({limit} CPUs)")]
    TooLarge { cpu: u32, limit: usize },
    #[error("sched_setaffinity({cpus}): {errno} (are these CPUs online and allowed by the cgroup cpuset? see /sys/fs/cgroup/cpuset.cpus.effective)")]
    Set {
        cpus: String,
        errno: nix::errno::Errno,
    },
    #[error("sched_getaffinity: {0}")]
    Get(nix::errno::Errno),
}

/// What was asked and what the kernel applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinReport {
    /// The thread's kernel id (as `ps -L` and `/proc/<pid>/task` show it).
    pub tid: i32,
    pub expected: CpuSet,
    pub actual: CpuSet,
}

impl PinReport {
    pub fn matches(&self) -> bool {
        self.expected == self.actual
    }
}

impl std::fmt::Display for PinReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "thread {}: expected cpus {}, actual cpus {} {}",
            self.tid,
            self.expected,
            self.actual,
            if self.matches() { "(ok)" } else { "(MISMATCH)" }
        )
    }
}

fn to_nix(set: &CpuSet) -> Result<NixCpuSet, PinError> {
    let mut out = NixCpuSet::new();
    for cpu in set.iter() {
        out.set(cpu as usize).map_err(|_| PinError::TooLarge {
            cpu,
            limit: NixCpuSet::count(),
        })?;
    }
    Ok(out)
}

/// The calling thread's current affinity.
pub fn current_thread_affinity() -> Result<CpuSet, PinError> {
    let mask = sched_getaffinity(Pid::from_raw(0)).map_err(PinError::Get)?;
    Ok((0..NixCpuSet::count())
        .filter(|&i| mask.is_set(i).unwrap_or(false))
        .map(|i| i as u32)
        .collect())
}

/// Pin the calling thread to `cpus`, read the mask back and log both. A mismatch (the kernel or a
/// cgroup narrowed the set) is reported in the result and logged as a warning, not an error: the
/// caller decides whether it matters.
pub fn pin_current_thread(cpus: &CpuSet) -> Result<PinReport, PinError> {
    if cpus.is_empty() {
        return Err(PinError::Empty);
    }
    let mask = to_nix(cpus)?;
    sched_setaffinity(Pid::from_raw(0), &mask).map_err(|errno| PinError::Set {
        cpus: cpus.to_string(),
        errno,
    })?;
    let report = PinReport {
        tid: nix::unistd::gettid().as_raw(),
        expected: cpus.clone(),
        actual: current_thread_affinity()?,
    };
    if report.matches() {
        tracing::info!(tid = report.tid, expected = %report.expected, actual = %report.actual, "thread pinned");
    } else {
        tracing::warn!(tid = report.tid, expected = %report.expected, actual = %report.actual, "thread pinned to a different set than asked");
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs in its own thread so the test harness's threads keep their affinity.
    #[test]
    fn pin_and_read_back_each_allowed_cpu() {
        std::thread::spawn(|| {
            let allowed = current_thread_affinity().unwrap();
            assert!(!allowed.is_empty());
            for cpu in allowed.iter() {
                let one: CpuSet = [cpu].into_iter().collect();
                let r = pin_current_thread(&one).unwrap();
                assert!(r.matches(), "{r}");
                assert_eq!(current_thread_affinity().unwrap(), one);
            }
            // Back to everything that was allowed.
            let r = pin_current_thread(&allowed).unwrap();
            assert_eq!(r.actual, allowed);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn refuses_empty_and_impossible_sets() {
        std::thread::spawn(|| {
            assert!(matches!(
                pin_current_thread(&CpuSet::new()),
                Err(PinError::Empty)
            ));
            let huge: CpuSet = [5000].into_iter().collect();
            assert!(matches!(
                pin_current_thread(&huge),
                Err(PinError::TooLarge { .. })
            ));
            // A CPU that is not online: the kernel refuses with EINVAL.
            let online = current_thread_affinity().unwrap();
            let absent = online.last().unwrap() + 1;
            let e = pin_current_thread(&[absent].into_iter().collect()).unwrap_err();
            assert!(e.to_string().contains("cgroup"), "{e}");
        })
        .join()
        .unwrap();
    }
}
