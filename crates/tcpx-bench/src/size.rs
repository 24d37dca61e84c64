//! Byte sizes as people type them: `4096`, `512K`, `64M`, `1G`, `1MiB` (binary multiples, as in
//! nccl-tests), lists `1M,4M` and doubling ranges `1M..1G`.

pub use tcpx_model::{format_size, parse_size, parse_sizes};
