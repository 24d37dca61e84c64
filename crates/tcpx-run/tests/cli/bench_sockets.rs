//! Stragglers in `tcpx-run bench`: over loopback with 2 channels of 4 sockets, the `--json`
//! document carries each socket's bytes and GB/s on both sides and the spread of them wherever two
//! or more sockets had work, and the table (on stderr in JSON mode) has the spread's line for
//! those sizes. (Which sockets take the pieces of the dynamic layout is up to the kernel, so how
//! many are idle is read from the figures, not assumed.)

use std::time::Duration;

use crate::harness;

/// Longest the run may take (it moves 17 MiB 4 times); past it the run is killed and fails.
const RUN_DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn the_json_document_carries_every_sockets_bytes_and_their_spread() {
    let (stdout, stderr) = harness::tcpx_run()
        .args(["bench", "--transport", "socket", "--size", "1M,16M"])
        .args(["--iters", "3", "--warmup", "1", "--chunk", "1M"])
        .args(["--channels", "2", "--socks-per-channel", "4"])
        .args(["--timeout", "20", "--no-csv", "--json"])
        .env_remove("RUST_LOG")
        .deadline(RUN_DEADLINE)
        .ok();
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON document");
    let ms = doc["measurements"].as_array().expect("measurements");
    assert_eq!(ms.len(), 2, "{stdout}");
    let mut spreads = 0;
    for m in ms {
        let size = m["size"].as_u64().unwrap();
        let per_side = |side: &str| -> Vec<(u64, u64, u64, u64, bool)> {
            let socks = m[side]["sockets"]
                .as_array()
                .unwrap_or_else(|| panic!("{side} of size {size} has no per-socket figures: {m}"));
            socks
                .iter()
                .map(|s| {
                    assert!(s["gbs"].as_f64().unwrap() >= 0.0, "{s}");
                    let bytes = s["bytes"].as_u64().unwrap();
                    // A rate while busy exactly where the socket carried bytes.
                    let busy = s["busy_gbs"].as_f64().is_some();
                    assert_eq!(busy, bytes > 0, "{s}");
                    (
                        s["flow"].as_u64().unwrap(),
                        s["channel"].as_u64().unwrap(),
                        s["socket"].as_u64().unwrap(),
                        bytes,
                        busy,
                    )
                })
                .collect()
        };
        let (send, recv) = (per_side("send"), per_side("recv"));
        let names: Vec<(u64, u64, u64)> = recv.iter().map(|s| (s.0, s.1, s.2)).collect();
        let want: Vec<(u64, u64, u64)> = (0..2)
            .flat_map(|c| (0..4).map(move |i| (0, c, i)))
            .collect();
        assert_eq!(names, want, "every socket of both channels, in order");
        // The timed iterations only: 3 x the size, every payload byte counted once.
        let total: u64 = recv.iter().map(|s| s.3).sum();
        assert_eq!(total, 3 * size, "size {size}: {recv:?}");
        let bytes = |v: &[(u64, u64, u64, u64, bool)]| v.iter().map(|s| s.3).collect::<Vec<_>>();
        assert_eq!(
            bytes(&send),
            bytes(&recv),
            "each socket's bytes on both ends"
        );
        let idle = recv.iter().filter(|s| !s.4).count() as u64;
        let spread = &m["recv"]["socket_spread"];
        if 8 - idle < 2 {
            assert!(spread.is_null(), "nothing to compare: {m}");
            continue;
        }
        spreads += 1;
        assert_eq!(spread["sockets"].as_u64(), Some(8), "{m}");
        assert_eq!(spread["idle"].as_u64(), Some(idle), "{m}");
        let share = spread["slowest_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{spread}");
        let judged = spread["judged"].as_bool().unwrap();
        assert_eq!(
            judged,
            spread["median_pieces"].as_u64().unwrap() >= 10,
            "{spread}"
        );
        assert_eq!(
            spread["lags"].as_bool(),
            Some(judged && share < 0.8),
            "{spread}"
        );
    }
    assert!(
        spreads >= 1,
        "16 MiB gives at least two sockets work:\n{stdout}"
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("#   recv sockets: 8, "))
        .filter(|l| l.contains(" idle; GB/s per socket min "))
        .collect();
    assert_eq!(
        lines.len(),
        spreads,
        "a spread line per size with one:\n{stderr}"
    );
    assert!(
        lines.iter().all(|l| l.contains("% of the median: ")),
        "{lines:?}"
    );
}
