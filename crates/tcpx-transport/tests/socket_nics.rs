//! The socket backend bound to chosen NICs: several loopback addresses stand in for several NICs
//! (127.0.0.2, 127.0.0.3, ... all reach `lo` on Linux), so each channel's listener and connection
//! can be checked to use exactly the address it was given.

mod common;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tcpx_sched::{Assignment, SchedConfig};
use tcpx_transport::socket::{SocketConfig, SocketTransport};
use tcpx_transport::{Transport, TransportError};

use common::soon;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn each_channel_listens_and_connects_on_its_own_address() {
    let t = Arc::new(
        SocketTransport::new(SocketConfig {
            socks: 2,
            ..SocketConfig::default()
        })
        .unwrap(),
    );
    // Channel c: receiver NIC recv[c], sender NIC send[c].
    let recv_nics = [ip("127.0.0.2"), ip("127.0.0.4")];
    let send_nics = [ip("127.0.0.3"), ip("127.0.0.5")];
    let mut listeners: Vec<_> = recv_nics.iter().map(|&a| t.listen_on(a).unwrap()).collect();
    let handles: Vec<_> = listeners.iter().map(|l| l.handle()).collect();
    let (send, recv) = std::thread::scope(|s| {
        let acc = s.spawn(|| {
            listeners
                .iter_mut()
                .map(|l| l.accept(soon()).unwrap())
                .collect::<Vec<_>>()
        });
        let send: Vec<_> = handles
            .iter()
            .zip(send_nics)
            .map(|(h, a)| t.connect_from(h, a, soon()).unwrap())
            .collect();
        (send, acc.join().unwrap())
    });
    for c in 0..2 {
        assert!(
            send[c].peer().starts_with(&format!("{}:", recv_nics[c])),
            "channel {c} sends to {}",
            send[c].peer()
        );
        assert!(
            recv[c].peer().starts_with(&format!("{}:", send_nics[c])),
            "channel {c} receives from {}",
            recv[c].peer()
        );
    }
    // And the bytes arrive intact over both NICs.
    let cfg = SchedConfig {
        size: 3 << 20,
        chunk: 256 << 10,
        window: 4,
        channels: 2,
        assignment: Assignment::RoundRobin,
    };
    common::transfer((&*t, &*t), (send, recv), cfg, Duration::from_secs(10)).unwrap();
}

#[test]
fn an_address_this_machine_lacks_is_refused_with_what_to_check() {
    let t = SocketTransport::new(SocketConfig::default()).unwrap();
    // 198.51.100.0/24 is TEST-NET-2: never assigned to a real interface.
    let e = t.listen_on(ip("198.51.100.7")).err().unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("binding a data listener to 198.51.100.7") && msg.contains("ip addr"),
        "{msg}"
    );
    let l = t.listen_on(ip("127.0.0.2")).unwrap();
    let e = t
        .connect_from(&l.handle(), ip("198.51.100.7"), soon())
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("binding a data connection to local address 198.51.100.7"),
        "{e}"
    );
}

#[test]
fn backends_without_nic_binding_say_so() {
    /// A backend that only implements the required methods: the defaults must refuse NIC binding.
    struct Plain;
    impl Transport for Plain {
        fn name(&self) -> &str {
            "plain"
        }
        fn limits(&self) -> tcpx_transport::Limits {
            tcpx_transport::Limits {
                max_requests: 1,
                max_request_bytes: 1,
                memory: vec![],
            }
        }
        fn listen(&self) -> tcpx_transport::Result<Box<dyn tcpx_transport::Listener>> {
            Err(TransportError::Failed("not used".into()))
        }
        fn connect(
            &self,
            _: &tcpx_transport::Handle,
            _: Instant,
        ) -> tcpx_transport::Result<Box<dyn tcpx_transport::SendComm>> {
            Err(TransportError::Failed("not used".into()))
        }
    }
    let e = Plain.listen_on(ip("127.0.0.2")).err().unwrap();
    assert!(
        matches!(e, TransportError::Unavailable { ref name, .. } if name == "plain"),
        "{e}"
    );
    assert!(e.to_string().contains("leave --nics out"), "{e}");
}

/// GPU memory over the socket backend goes through `CudaStaging`; a channel bound to a NIC must
/// keep its NIC through that wrapper (it used to refuse `listen_on` as if it were a plugin).
#[test]
fn staging_for_gpu_memory_keeps_each_channel_on_its_nic() {
    let inner: Arc<dyn Transport> =
        Arc::new(SocketTransport::new(SocketConfig::default()).unwrap());
    let t = tcpx_transport::cuda_staging::CudaStaging::new(inner);
    let mut listener = t.listen_on(ip("127.0.0.2")).unwrap();
    let handle = listener.handle();
    let (send, recv) = std::thread::scope(|s| {
        let acc = s.spawn(|| listener.accept(soon()).unwrap());
        let send = t.connect_from(&handle, ip("127.0.0.3"), soon()).unwrap();
        (send, acc.join().unwrap())
    });
    assert!(send.peer().starts_with("127.0.0.2:"), "{}", send.peer());
    assert!(recv.peer().starts_with("127.0.0.3:"), "{}", recv.peer());
}
