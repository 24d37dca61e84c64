//! Byte sizes as people type them: `4096`, `512K`, `64M`, `1G`, `1MiB` (binary multiples, as in
//! nccl-tests), lists `1M,4M` and doubling ranges `1M..1G`.

pub use tcpx_model::{format_size, parse_size, parse_sizes};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_format() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("-5").unwrap_err().contains("negative"));
        assert!(parse_size("12Q").unwrap_err().contains("unknown unit"));
        assert!(parse_size("M").unwrap_err().contains("no number"));
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
        assert_eq!(
            parse_sizes("1M..8M,3"),
            Ok(vec![1 << 20, 2 << 20, 4 << 20, 8 << 20, 3])
        );
        assert!(parse_sizes("8M..1M").is_err());
        assert!(parse_sizes(",").is_err());
        for b in [1u64, 1536, 4096, 64 << 20, 3 << 30] {
            assert_eq!(parse_size(&format_size(b)), Ok(b));
        }
    }
}
