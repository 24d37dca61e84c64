//! UTC timestamps without a calendar crate (days-from-civil, Howard Hinnant's algorithm).

use std::time::{SystemTime, UNIX_EPOCH};

fn parts(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem / 60 % 60) as u32,
        (rem % 60) as u32,
    )
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `20261122T111500Z` for `secs` since the epoch (directory-name friendly).
pub fn stamp_of(secs: u64) -> String {
    let (y, m, d, h, mi, s) = parts(secs);
    format!("{y:04}{m:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// [`stamp_of`] now.
pub fn utc_stamp() -> String {
    stamp_of(now_secs())
}

/// `2026-11-22T11:15:00Z` now.
pub fn utc_now_iso() -> String {
    let (y, m, d, h, mi, s) = parts(now_secs());
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_dates() {
        assert_eq!(super::stamp_of(0), "19700101T000000Z");
        // 2000-02-29 12:34:56 UTC, a leap day.
        assert_eq!(super::stamp_of(951_827_696), "20000229T123456Z");
        assert_eq!(super::stamp_of(1_795_000_000), "20261118T110640Z");
    }
}
