//! Whether a host address range is mapped readable and writable in this process, from
//! /proc/self/maps, so that `reg` refuses a stray integer instead of crashing on first use.

/// `Ok` when every byte of `ptr..ptr + len` lies in mappings with `rw` permissions; otherwise a
/// message naming the first byte that does not.
pub fn check_host_range(ptr: u64, len: usize) -> Result<(), String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("reading /proc/self/maps to check reg({ptr:#x}, {len}): {e}"))?;
    check_in(&maps, ptr, len)
}

fn check_in(maps: &str, ptr: u64, len: usize) -> Result<(), String> {
    let end = ptr.saturating_add(len as u64);
    let mut at = ptr;
    // Mappings are listed in address order; walk them, extending coverage while contiguous.
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16)) else {
            continue;
        };
        if hi <= at {
            continue;
        }
        if lo > at {
            break;
        }
        if !perms.starts_with("rw") {
            return Err(format!(
                "address {at:#x} in reg({ptr:#x}, {len}) is in a mapping with permissions \
                 {perms} ({lo:#x}-{hi:#x}): host memory given to reg must be readable and \
                 writable (a bytes object is not; use a bytearray or numpy array)"
            ));
        }
        at = hi;
        if at >= end {
            return Ok(());
        }
    }
    Err(format!(
        "address {at:#x} in reg({ptr:#x}, {len}) is not mapped in this process and is not CUDA \
         device memory: pass a live buffer's address (tensor.data_ptr(), array.ctypes.data) and \
         its size in bytes"
    ))
}
