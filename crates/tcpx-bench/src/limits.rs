//! What one process can open for an experiment: the backend's comm limit (a plugin's `maxComms`)
//! and, where the backend says what a comm costs in files (the socket backend), file descriptors
//! against the open-file limit. Checked before
//! anything is connected, so "too many channels" is a clear refusal instead of a failure
//! half-way through the handshake.

use crate::Experiment;

/// File descriptors a process holds besides the experiment's sockets (stdio, control
/// connection, listeners, the CUDA driver's files), as headroom.
const FD_HEADROOM: u64 = 64;

/// The soft open-file limit (`ulimit -n`) of this process, from `/proc/self/limits`.
pub fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_file_limit(&text)
}

/// `Max open files` soft limit from the text of a `/proc/<pid>/limits` file; `None` when the
/// line is missing or the limit is `unlimited`.
pub fn parse_open_file_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The soft address-space limit (`ulimit -v`) of this process in bytes, from
/// `/proc/self/limits`; `None` when unlimited or unknown.
pub fn address_space_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_address_space_limit(&text)
}

/// `Max address space` soft limit (bytes) from the text of a `/proc/<pid>/limits` file.
pub fn parse_address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What bounds this process's host memory, for an error about an allocation that failed or
/// would: the address-space limit (`ulimit -v`) when one is set, and `MemAvailable`.
pub fn host_memory_limits() -> String {
    let avail = mem_available().map_or_else(|| "unknown".into(), gib);
    match address_space_limit() {
        Some(l) => format!(
            "this process's address-space limit (ulimit -v) is {}, MemAvailable {avail}",
            gib(l)
        ),
        None => format!("no address-space limit (ulimit -v) is set, MemAvailable is {avail}"),
    }
}

/// Refuses, with the numbers, host buffers of `count` x `size` bytes when they alone exceed the
/// address-space limit `limit` (`ulimit -v`; `None`: unlimited): the allocation could only fail.
pub fn check_address_space(count: usize, size: u64, limit: Option<u64>) -> Result<(), String> {
    let need = size.saturating_mul(count as u64);
    match limit {
        Some(l) if need >= l => Err(format!(
            "{count} host buffer(s) of {} need {}, more than this process's address-space limit (ulimit -v) of {}: raise the limit or use a smaller --size or fewer flows",
            crate::format_size(size),
            gib(need),
            gib(l)
        )),
        _ => Ok(()),
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn mem_available() -> Option<u64> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// `MemAvailable` from the text of a `/proc/meminfo` file, in bytes.
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line["MemAvailable:".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Host memory a process running `sides` sides of `exp` allocates for message buffers: one
/// buffer of the largest size per flow and side (GPU memory is checked by the GPU side).
pub fn host_bytes_needed(exp: &Experiment, sides: u32) -> u64 {
    if exp.memory.is_cuda() {
        return 0;
    }
    let largest = exp.sizes.iter().copied().max().unwrap_or(0);
    largest
        .saturating_mul(u64::from(exp.local_flows()))
        .saturating_mul(u64::from(sides))
}

/// Refuses, with the numbers, an experiment whose buffers would not fit in the host memory
/// available now (`available`: `MemAvailable`; `None` when unknown, then nothing is checked),
/// instead of filling memory until the kernel kills the process.
pub fn check_host_memory(
    exp: &Experiment,
    sides: u32,
    available: Option<u64>,
) -> Result<(), String> {
    let need = host_bytes_needed(exp, sides);
    match available {
        Some(avail) if need > avail => Err(format!(
            "{} flow(s) x {}{} need {} of host memory for buffers, but only {} is available (MemAvailable): use a smaller --size or fewer flows",
            exp.local_flows(),
            crate::format_size(exp.sizes.iter().copied().max().unwrap_or(0)),
            if sides > 1 { " x 2 sides" } else { "" },
            gib(need),
            gib(avail),
        )),
        _ => Ok(()),
    }
}

/// Refuses, with the numbers, a plain-TCP baseline whose two buffers (a sender's and a
/// receiver's of `size` bytes each) would not fit in the host memory available now.
pub fn check_baseline_memory(size: u64, available: Option<u64>) -> Result<(), String> {
    let need = size.saturating_mul(2);
    match available {
        Some(avail) if need > avail => Err(format!(
            "a {} baseline needs {} of host memory (a sender's and a receiver's buffer), but only {} is available (MemAvailable): use a smaller --size",
            crate::format_size(size),
            gib(need),
            gib(avail),
        )),
        _ => Ok(()),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Checks that a process running `sides` sides (2 for a local run) of `exp` stays within the
/// backend's comm limit and, for the socket backend, the open-file limit.
pub fn check_process_limits(
    exp: &Experiment,
    sides: u32,
    max_comms: Option<usize>,
    open_files: Option<u64>,
) -> Result<(), String> {
    let comms = u64::from(exp.local_flows()) * u64::from(exp.channels) * u64::from(sides);
    if let Some(max) = max_comms {
        if comms > max as u64 {
            return Err(format!(
                "{} channels x {} flow(s){} need {comms} comms in this process, but transport `{}` allows {max}: use at most {} channels per flow",
                exp.channels,
                exp.local_flows(),
                if sides > 1 { " x 2 sides" } else { "" },
                exp.transport,
                (max as u64 / (u64::from(exp.local_flows()) * u64::from(sides))).max(1),
            ));
        }
    }
    // The backend says what a comm costs in open files; backends that open their own (a
    // plugin's, libnccl's) are not guessed for.
    let per_comm = exp
        .transport
        .capabilities()
        .open_files
        .per_comm(u64::from(exp.socks_per_channel));
    if let Some(per_comm) = per_comm {
        if let Some(limit) = open_files {
            let fds = comms.saturating_mul(per_comm).saturating_add(FD_HEADROOM);
            if fds > limit {
                return Err(format!(
                    "{} flow(s) x {} channels x {} sockets{} need about {fds} open files in this process, but its open-file limit (ulimit -n) is {limit}: raise it (ulimit -n {fds}) or use fewer channels or sockets",
                    exp.local_flows(),
                    exp.channels,
                    exp.socks_per_channel,
                    if sides > 1 { " x 2 sides" } else { "" },
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str =
        "Limit                     Soft Limit           Hard Limit           Units     \n\
Max cpu time              unlimited            unlimited            seconds   \n\
Max open files            1024                 524288               files     \n";

    #[test]
    fn buffers_larger_than_available_memory_are_refused_with_the_numbers() {
        let meminfo = "MemTotal:       24000000 kB\nMemAvailable:   20971520 kB\n";
        let avail = parse_mem_available(meminfo);
        assert_eq!(avail, Some(20 << 30));
        let e = Experiment {
            sizes: vec![1 << 20, 12 << 30],
            ..Experiment::default()
        };
        check_host_memory(&e, 1, avail).unwrap();
        let err = check_host_memory(&e, 2, avail).unwrap_err();
        assert!(
            err.contains("24.0 GiB") && err.contains("20.0 GiB"),
            "{err}"
        );
        check_host_memory(&e, 2, None).unwrap();
        let gpu = Experiment {
            memory: "cuda".parse().unwrap(),
            ..e
        };
        check_host_memory(&gpu, 2, avail).unwrap();
        assert!(mem_available().is_some_and(|m| m > 0));
    }

    /// Issue 43 item 10: buffers beyond `ulimit -v` are refused with the size and the limit.
    #[test]
    fn buffers_beyond_the_address_space_limit_are_refused_with_both_numbers() {
        let limits = format!(
            "{LIMITS}Max address space         209715200            unlimited            bytes     \n"
        );
        assert_eq!(parse_address_space_limit(&limits), Some(200 << 20));
        assert_eq!(parse_address_space_limit(LIMITS), None);
        assert_eq!(
            parse_address_space_limit("Max address space  unlimited  unlimited  bytes"),
            None
        );
        let e = check_address_space(4, 64 << 20, Some(200 << 20)).unwrap_err();
        assert!(
            e.contains("4 host buffer(s) of 64M")
                && e.contains("0.2 GiB")
                && e.contains("ulimit -v"),
            "{e}"
        );
        check_address_space(2, 64 << 20, Some(200 << 20)).unwrap();
        check_address_space(1000, 1 << 30, None).unwrap();
        assert!(host_memory_limits().contains("MemAvailable"));
    }

    #[test]
    fn the_soft_open_file_limit_is_read() {
        assert_eq!(parse_open_file_limit(LIMITS), Some(1024));
        assert_eq!(parse_open_file_limit("Max cpu time  unlimited"), None);
        assert_eq!(
            parse_open_file_limit("Max open files  unlimited  unlimited files"),
            None
        );
        // This process's own limit is readable on Linux.
        assert!(open_file_limit().is_some_and(|n| n > 0));
    }

    fn exp(transport: &str, flows: u32, channels: u32, socks: u32) -> Experiment {
        Experiment {
            transport: transport.parse().unwrap(),
            flows,
            channels,
            socks_per_channel: socks,
            ..Experiment::default()
        }
    }

    #[test]
    fn more_comms_than_the_backend_allows_are_refused_with_the_most_that_fits() {
        let e = exp("netplugin", 2, 8, 1);
        check_process_limits(&e, 1, Some(16), None).unwrap();
        let err = check_process_limits(&e, 2, Some(16), None).unwrap_err();
        assert!(
            err.contains("need 32 comms") && err.contains("allows 16"),
            "{err}"
        );
        assert!(err.contains("at most 4 channels per flow"), "{err}");
        // No limit from the backend: anything goes (the knob ranges still apply).
        check_process_limits(&exp("netplugin", 64, 64, 1), 2, None, None).unwrap();
        // A multi-process child holds one flow only.
        let child = Experiment {
            flow_index: Some(1),
            ..e.clone()
        };
        check_process_limits(&child, 2, Some(16), None).unwrap();
    }

    #[test]
    fn sockets_beyond_the_open_file_limit_are_refused_with_the_limit_to_ask_for() {
        let e = exp("socket", 4, 8, 8);
        // 4 x 8 comms x 2 sides x (8 sockets x 4 + 1) fds + 64 headroom.
        let need = 4 * 8 * 2 * 33 + 64;
        check_process_limits(&e, 2, None, Some(need)).unwrap();
        let err = check_process_limits(&e, 2, None, Some(need - 1)).unwrap_err();
        assert!(
            err.contains(&format!("about {need} open files"))
                && err.contains(&format!("ulimit -n {need}")),
            "{err}"
        );
        // Other backends open their own sockets; the file limit is not guessed for them.
        check_process_limits(&exp("nccl", 4, 8, 8), 2, None, Some(10)).unwrap();
    }

    #[test]
    fn a_baseline_larger_than_available_memory_is_refused_with_the_numbers() {
        let gib = 1u64 << 30;
        assert!(check_baseline_memory(gib, Some(4 * gib)).is_ok());
        assert!(check_baseline_memory(gib, None).is_ok());
        let e = check_baseline_memory(100 * gib, Some(22 * gib)).unwrap_err();
        assert!(e.contains("200.0 GiB") && e.contains("22.0 GiB"), "{e}");
        assert!(check_baseline_memory(u64::MAX, Some(gib)).is_err());
    }
}
