//! The text forms of the vocabulary types: what users, older reports and link messages write
//! must parse, print back the same, and bad text must be refused naming what is accepted.

use std::time::{Duration, Instant};

use tcpx_model::*;

fn round_trip<T>(text: &str)
where
    T: std::str::FromStr + std::fmt::Display + serde::Serialize + serde::de::DeserializeOwned,
    T::Err: std::fmt::Debug,
{
    let v: T = text.parse().unwrap();
    assert_eq!(v.to_string(), text);
    let json = serde_json::to_string(&v).unwrap();
    assert_eq!(json, format!("\"{text}\""));
    let back: T = serde_json::from_str(&json).unwrap();
    assert_eq!(back.to_string(), text);
}

#[test]
fn backends_keep_the_transport_names() {
    for n in ["socket", "netplugin", "nccl", "cudap2p"] {
        round_trip::<Backend>(n);
    }
    assert_eq!(Backend::default(), Backend::Socket);
    assert_eq!(Backend::ALL.map(Backend::name), Backend::NAMES);
    let e = "carrier-pigeon".parse::<Backend>().unwrap_err().to_string();
    assert_eq!(
        e,
        "unknown transport `carrier-pigeon`: choose one of socket, netplugin, nccl, cudap2p"
    );
    assert!(serde_json::from_str::<Backend>("\"Socket\"").is_err());
    assert!(Backend::NetPlugin == "netplugin");
}

#[test]
fn memory_takes_host_cuda_and_a_gpu_pair() {
    for m in ["host", "cuda", "cuda:0,1", "cuda:0,0", "cuda:12,3"] {
        round_trip::<Memory>(m);
    }
    assert_eq!(
        "cuda: 0 , 4".parse::<Memory>(),
        Ok(Memory::CudaPair { send: 0, recv: 4 })
    );
    assert_eq!(Memory::Cuda.gpu_bases(), Some((0, 0)));
    assert_eq!(Memory::Host.gpu_bases(), None);
    assert_eq!(
        Memory::CudaPair { send: 2, recv: 6 }.flow_gpus(3, 8),
        Some((5, 1))
    );
    assert_eq!(Memory::Cuda.flow_gpus(0, 0), None);
    for bad in ["gpu", "cuda:0", "cuda:a,b", "CUDA", "", "cuda:-1,0"] {
        let e = bad.parse::<Memory>().unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("memory `{bad}`: use host, cuda")) && e.contains("cuda:S,R"),
            "{e}"
        );
    }
}

#[test]
fn nic_policies_take_their_names_and_the_short_forms() {
    for p in ["round-robin", "numa-local", "closest-pci", "explicit"] {
        round_trip::<NicPolicy>(p);
    }
    assert_eq!("rr".parse(), Ok(NicPolicy::RoundRobin));
    assert_eq!("numa".parse(), Ok(NicPolicy::NumaLocal));
    assert_eq!("pci".parse(), Ok(NicPolicy::ClosestPci));
    assert_eq!(NicPolicy::default(), NicPolicy::RoundRobin);
    let e = "fastest".parse::<NicPolicy>().unwrap_err().to_string();
    assert!(e.contains("NIC policy `fastest` is unknown"), "{e}");
}

#[test]
fn cpu_sets_keep_their_text_and_refuse_bad_lists() {
    round_trip::<CpuSet>("8-21,112-125");
    round_trip::<CpuSet>("0");
    let s: CpuSet = " 3, 1-2 ".parse().unwrap();
    assert_eq!(s.as_str(), " 3, 1-2 ", "the text is kept as written");
    assert_eq!(s.cpus().iter().copied().collect::<Vec<_>>(), [1, 2, 3]);
    assert!("".parse::<CpuSet>().unwrap().is_empty());
    for (bad, why) in [
        ("3-1", "runs backwards"),
        ("1,,2", "empty item"),
        ("x", "not a CPU number"),
        ("9000", "above the Linux limit 8191"),
    ] {
        let e = bad.parse::<CpuSet>().unwrap_err().to_string();
        assert!(
            e.contains(why) && e.contains("expected e.g. \"0-3,8,10-11\""),
            "{bad}: {e}"
        );
    }
}

#[test]
fn byte_counts_parse_format_and_travel_as_numbers() {
    assert_eq!("512K".parse::<Bytes>(), Ok(Bytes(512 << 10)));
    assert_eq!(Bytes(64 << 20).to_string(), "64M");
    assert_eq!(Bytes(1536).to_string(), "1536");
    assert_eq!(serde_json::to_string(&Bytes(4096)).unwrap(), "4096");
    assert_eq!(serde_json::from_str::<Bytes>("4096").unwrap(), Bytes(4096));
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

#[test]
fn sides_are_send_and_recv() {
    assert_eq!(serde_json::to_string(&Side::Send).unwrap(), "\"send\"");
    assert_eq!(
        serde_json::from_str::<Side>("\"recv\"").unwrap(),
        Side::Recv
    );
    assert_eq!(Side::Send.peer(), Side::Recv);
    assert_eq!("recv".parse::<Side>(), Ok(Side::Recv));
    assert!("both".parse::<Side>().is_err());
}

#[test]
fn peers_are_checked_before_any_lookup() {
    for (text, host, port) in [
        ("127.0.0.1:5310", "127.0.0.1", Some(5310)),
        ("[::1]:5310", "::1", Some(5310)),
        ("localhost:1", "localhost", Some(1)),
        ("node-a.example:65535", "node-a.example", Some(65535)),
        ("127.0.0.1", "127.0.0.1", None),
        ("::1", "::1", None),
        ("localhost", "localhost", None),
    ] {
        let p: Peer = text.parse().unwrap();
        assert_eq!((p.host.as_str(), p.port), (host, port), "{text}");
    }
    assert_eq!("::1".parse::<Peer>().unwrap().with_port(7), "[::1]:7");
    assert_eq!(
        "127.0.0.1".parse::<Peer>().unwrap().socket_addr(7),
        Some("127.0.0.1:7".parse().unwrap())
    );
    round_trip::<Peer>("[::1]:5310");
    round_trip::<Peer>("node-a:9");
    for bad in [
        "::::",
        "127.0.0.1:99999",
        "127.0.0.1:80:0",
        "999.1.1.1:5",
        "a b:1",
        "host:",
        ":5",
        "-a:5",
        "a..b:5",
        "h\n:5",
        "a b",
        "",
    ] {
        assert!(bad.parse::<Peer>().is_err(), "{bad:?}");
    }
    let e = Peer::parse_host_port("host").unwrap_err().to_string();
    assert_eq!(e, "`host` has no port: give HOST:PORT");
    let e = "h\n:5".parse::<Peer>().unwrap_err().to_string();
    assert!(e.contains("h\\n:5") && !e.contains('\n'), "{e}");
}

#[test]
fn backoff_doubles_to_its_cap_and_never_waits_past_a_deadline() {
    let mut b = Backoff::doubling(Duration::from_millis(5), Duration::from_millis(20));
    let pauses: Vec<_> = (0..5).map(|_| b.next_pause().as_millis()).collect();
    assert_eq!(pauses, [5, 10, 20, 20, 20]);
    let mut s = Backoff::spin_then_sleep(2, Duration::from_micros(50));
    let pauses: Vec<_> = (0..4).map(|_| s.next_pause().as_micros()).collect();
    assert_eq!(pauses, [0, 0, 50, 50]);
    // A deadline already passed: no wait at all.
    let mut long = Backoff::doubling(Duration::from_secs(3600), Duration::from_secs(3600));
    assert!(!long.wait(Instant::now()));
    assert_eq!(remaining(Instant::now()), None);
    assert!(remaining(Instant::now() + Duration::from_secs(60)).is_some());
}
