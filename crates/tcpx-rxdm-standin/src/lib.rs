//! tcpx-rxdm-standin: a stand-in for GPUDirect-TCPX's receive-datapath manager (rxdm), for
//! running Google's real net plugin where there is no TCPX NIC and no rxdm (loopback on a GPU
//! machine, or a test).
//!
//! The plugin talks to rxdm over Unix sockets under `NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX`: at
//! every accept it asks `rx_rule_manager` to install a flow-steering rule for the new data
//! connection, at every close it asks `rx_rule_uninstall` to remove it, and with
//! `NCCL_GPUDIRECTTCPX_REPORT_LIFECYCLE=1` its init registers at `rxdm_application_registry`.
//! Each request is one frame (see [`proto`]); the plugin accepts a rule answer only when it is
//! `raw_bytes = "Ok."`. This stand-in answers so (or, in [`Mode::Refuse`], refuses every install,
//! to test the plugin's error path) and records every request ([`Record`]). It programs nothing:
//! on loopback there is no NIC queue to steer to.
//!
//! [`Rxdm`] is the protocol logic (request bytes in, response bytes and a record out), tested
//! without sockets; [`server::Server`] is the thin Unix-socket driver.
//!
//! Not for: production (a real rxdm programs the NIC's flow steering and GPU receive queues), or
//! any message the plugin does not send.

#![forbid(unsafe_code)]

pub mod proto;
pub mod server;

use proto::{FlowSteerRuleRequest, Payload, UnixSocketProto};

/// The answer the plugin takes as success.
pub const OK: &[u8] = b"Ok.";

/// The Unix sockets rxdm serves under the prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `rx_rule_manager`: install a flow-steering rule.
    RuleManager,
    /// `rx_rule_uninstall`: remove one.
    RuleUninstall,
    /// `rxdm_application_registry`: a client registers at init and deregisters at exit.
    ApplicationRegistry,
}

impl Endpoint {
    pub const ALL: [Endpoint; 3] = [
        Endpoint::RuleManager,
        Endpoint::RuleUninstall,
        Endpoint::ApplicationRegistry,
    ];

    /// The socket's file name under the prefix.
    pub fn file_name(self) -> &'static str {
        match self {
            Endpoint::RuleManager => "rx_rule_manager",
            Endpoint::RuleUninstall => "rx_rule_uninstall",
            Endpoint::ApplicationRegistry => "rxdm_application_registry",
        }
    }
}

/// How the stand-in answers rule installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every well-formed request is answered `Ok.`.
    #[default]
    Accept,
    /// Every rule install is refused (removals and registrations still succeed).
    Refuse,
}

/// What a request asked for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    InstallRule(FlowSteerRuleRequest),
    RemoveRule(FlowSteerRuleRequest),
    Register,
    Deregister,
    QueueIdQuery {
        gpu_pci_addr: Option<String>,
    },
    /// Not a request this endpoint serves, or not a message at all.
    Malformed {
        reason: String,
    },
}

/// One request as served, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Record {
    pub endpoint: Endpoint,
    pub request: Request,
    /// Whether the answer was the success the plugin expects.
    pub ok: bool,
}

/// The protocol logic of the stand-in, without I/O.
#[derive(Debug, Default)]
pub struct Rxdm {
    mode: Mode,
    records: Vec<Record>,
}

impl Rxdm {
    pub fn new(mode: Mode) -> Self {
        Rxdm {
            mode,
            records: Vec::new(),
        }
    }

    /// Serves one request message (a frame's bytes) that arrived on `endpoint`; returns the
    /// response message (never empty: the plugin's reader cannot take an empty frame) and the
    /// record of it, which is also kept.
    pub fn handle(&mut self, endpoint: Endpoint, message: &[u8]) -> (Vec<u8>, Record) {
        let request = match UnixSocketProto::decode(message) {
            Err(e) => Request::Malformed {
                reason: format!("not a UnixSocketProto: {e}"),
            },
            Ok(m) => match (endpoint, m.payload) {
                (Endpoint::RuleManager, Some(Payload::FlowSteerRuleRequest(r))) => {
                    Request::InstallRule(r)
                }
                (Endpoint::RuleUninstall, Some(Payload::FlowSteerRuleRequest(r))) => {
                    Request::RemoveRule(r)
                }
                (
                    Endpoint::ApplicationRegistry,
                    Some(Payload::ApplicationRegisterRequest { register_client }),
                ) => {
                    if register_client.unwrap_or(false) {
                        Request::Register
                    } else {
                        Request::Deregister
                    }
                }
                (_, Some(Payload::QueueIdQuery { gpu_pci_addr })) => {
                    Request::QueueIdQuery { gpu_pci_addr }
                }
                (endpoint, other) => Request::Malformed {
                    reason: format!(
                        "{} does not serve {}",
                        endpoint.file_name(),
                        match other {
                            None => "an empty message".to_string(),
                            Some(p) => format!("{p:?}"),
                        }
                    ),
                },
            },
        };
        let (response, ok) = match &request {
            Request::InstallRule(r) if self.mode == Mode::Refuse => (
                UnixSocketProto::raw(
                    format!(
                        "Refused by tcpx-rxdm-standin (refuse mode): no rule for {}",
                        describe(r)
                    )
                    .as_bytes(),
                ),
                false,
            ),
            Request::InstallRule(_)
            | Request::RemoveRule(_)
            | Request::Register
            | Request::Deregister => (UnixSocketProto::raw(OK), true),
            // Loopback has no NIC queues to report.
            Request::QueueIdQuery { .. } => (
                UnixSocketProto {
                    payload: Some(Payload::QueueIdResponse { queue_ids: vec![] }),
                },
                true,
            ),
            Request::Malformed { reason } => (
                UnixSocketProto::raw(format!("Malformed request: {reason}").as_bytes()),
                false,
            ),
        };
        let record = Record {
            endpoint,
            request,
            ok,
        };
        self.records.push(record.clone());
        let mut bytes = response.encode();
        if bytes.is_empty() {
            // An empty QueueIdResponse serializes to nothing but its key and zero length; keep
            // the frame non-empty regardless.
            bytes = UnixSocketProto::raw(OK).encode();
        }
        (bytes, record)
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }
}

/// `src -> dst` of a rule, for messages.
pub fn describe(r: &FlowSteerRuleRequest) -> String {
    match &r.ntuple {
        None => "no flow".into(),
        Some(n) => format!(
            "{} -> {}",
            n.src.as_ref().map_or("?".into(), |a| a.to_string()),
            n.dst.as_ref().map_or("?".into(), |a| a.to_string())
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::proto::*;
    use super::*;

    /// A rule request as the plugin sends it, written out field by field from the published
    /// message definitions (not through this crate's encoder).
    fn plugin_install_bytes() -> Vec<u8> {
        let src = [&[0x0a, 9][..], b"127.0.0.1", &[0x10, 0xb9, 0x60]].concat(); // port 12345
        let dst = [&[0x0a, 9][..], b"127.0.0.2", &[0x10, 0xd0, 0x86, 0x03]].concat(); // 50000
        let ntuple = [
            &[0x08, 0x01][..], // flow_type = TCP_V4_FLOW
            &[0x12, src.len() as u8],
            &src,
            &[0x1a, dst.len() as u8],
            &dst,
        ]
        .concat();
        let pci = b"0000:04:00.0";
        let rule = [
            &[0x0a, ntuple.len() as u8][..],
            &ntuple,
            &[0x1a, pci.len() as u8],
            pci,
        ]
        .concat();
        [&[0x12, rule.len() as u8][..], &rule].concat()
    }

    #[test]
    fn a_plugin_rule_request_decodes_field_by_field() {
        let m = UnixSocketProto::decode(&plugin_install_bytes()).unwrap();
        let Some(Payload::FlowSteerRuleRequest(r)) = m.payload else {
            panic!("{m:?}")
        };
        let n = r.ntuple.as_ref().unwrap();
        assert_eq!(n.flow_type, Some(1));
        assert_eq!(
            n.src.as_ref().unwrap().ip_address.as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(n.src.as_ref().unwrap().port, Some(12345));
        assert_eq!(n.dst.as_ref().unwrap().port, Some(50000));
        assert_eq!(r.gpu_pci_addr.as_deref(), Some("0000:04:00.0"));
        assert_eq!(r.queue_id, None);
        assert_eq!(describe(&r), "127.0.0.1:12345 -> 127.0.0.2:50000");
        // And this crate's encoder writes the same bytes.
        assert_eq!(
            UnixSocketProto {
                payload: Some(Payload::FlowSteerRuleRequest(r))
            }
            .encode(),
            plugin_install_bytes()
        );
    }

    #[test]
    fn negative_int32_takes_ten_bytes_and_unknown_fields_are_skipped() {
        let r = FlowSteerRuleRequest {
            queue_id: Some(-1),
            ..Default::default()
        };
        let b = r.encode();
        assert_eq!(b.len(), 1 + 10);
        // An unknown varint field (9), fixed64 (10) and fixed32 (11) before the known one.
        let mut with_unknown = vec![0x48, 0x05, 0x51, 1, 2, 3, 4, 5, 6, 7, 8, 0x5d, 1, 2, 3, 4];
        with_unknown.extend_from_slice(&b);
        assert_eq!(FlowSteerRuleRequest::decode(&with_unknown).unwrap(), r);
    }

    #[test]
    fn broken_messages_are_errors_not_panics() {
        let good = plugin_install_bytes();
        for cut in 1..good.len() {
            // Every prefix either decodes (cut at a field boundary) or says what is wrong.
            let _ = UnixSocketProto::decode(&good[..cut]);
        }
        assert_eq!(
            UnixSocketProto::decode(&[0x12, 0x05, 0x0a]),
            Err(WireError::Truncated("value"))
        );
        assert_eq!(
            UnixSocketProto::decode(&[0x0b]),
            Err(WireError::BadWireType(3))
        );
        assert_eq!(
            UnixSocketProto::decode(&[0x10, 0x01]),
            Err(WireError::WrongType {
                field: 2,
                wire_type: 0,
                expected: 2
            })
        );
        let mut long = vec![0x08];
        long.extend([0xff; 10]);
        long.push(0x01);
        assert_eq!(
            UnixSocketProto::decode(&long),
            Err(WireError::VarintTooLong)
        );
    }

    #[test]
    fn frames_survive_any_split_of_the_stream() {
        let a = frame(&plugin_install_bytes()).unwrap();
        let b = frame(&UnixSocketProto::raw(OK).encode()).unwrap();
        let stream = [a.clone(), b.clone()].concat();
        for split in 0..=stream.len() {
            let mut d = FrameDecoder::default();
            let mut got = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                d.push(part);
                while let Some(f) = d.next_frame() {
                    got.push(f);
                }
            }
            assert_eq!(got, vec![a[2..].to_vec(), b[2..].to_vec()], "split {split}");
            assert_eq!(d.pending(), 0);
        }
        assert_eq!(
            frame(&vec![0; MAX_FRAME + 1]),
            Err(WireError::TooLong(MAX_FRAME + 1))
        );
    }

    #[test]
    fn installs_are_answered_ok_or_refused_by_mode_and_recorded() {
        let ok = UnixSocketProto::decode(&UnixSocketProto::raw(OK).encode()).unwrap();
        let mut rxdm = Rxdm::new(Mode::Accept);
        let (resp, rec) = rxdm.handle(Endpoint::RuleManager, &plugin_install_bytes());
        assert_eq!(UnixSocketProto::decode(&resp).unwrap(), ok);
        assert!(rec.ok);
        assert!(matches!(rec.request, Request::InstallRule(_)));
        let (resp, rec) = rxdm.handle(Endpoint::RuleUninstall, &plugin_install_bytes());
        assert_eq!(UnixSocketProto::decode(&resp).unwrap(), ok);
        assert!(matches!(rec.request, Request::RemoveRule(_)));
        assert_eq!(rxdm.records().len(), 2);

        let mut refusing = Rxdm::new(Mode::Refuse);
        let (resp, rec) = refusing.handle(Endpoint::RuleManager, &plugin_install_bytes());
        assert!(!rec.ok);
        let Some(Payload::RawBytes(text)) = UnixSocketProto::decode(&resp).unwrap().payload else {
            panic!("refusal is raw bytes")
        };
        assert_ne!(text, OK);
        assert!(String::from_utf8(text).unwrap().contains("127.0.0.1:12345"));
        // Removals still succeed, so a plugin closing after a refused install is not stuck.
        let (_, rec) = refusing.handle(Endpoint::RuleUninstall, &plugin_install_bytes());
        assert!(rec.ok);
    }

    #[test]
    fn registry_and_wrong_endpoint_requests() {
        let mut rxdm = Rxdm::new(Mode::Accept);
        let register = UnixSocketProto {
            payload: Some(Payload::ApplicationRegisterRequest {
                register_client: Some(true),
            }),
        }
        .encode();
        assert_eq!(register, vec![0x32, 0x02, 0x08, 0x01]);
        let (_, rec) = rxdm.handle(Endpoint::ApplicationRegistry, &register);
        assert_eq!(rec.request, Request::Register);
        let deregister = [0x32, 0x02, 0x08, 0x00];
        let (_, rec) = rxdm.handle(Endpoint::ApplicationRegistry, &deregister);
        assert_eq!(rec.request, Request::Deregister);
        // A rule request on the registry, and garbage anywhere: refused, recorded, answered.
        let (resp, rec) = rxdm.handle(Endpoint::ApplicationRegistry, &plugin_install_bytes());
        assert!(!rec.ok);
        assert!(!resp.is_empty());
        let (resp, rec) = rxdm.handle(Endpoint::RuleManager, &[0xff]);
        assert!(matches!(rec.request, Request::Malformed { .. }));
        assert!(!resp.is_empty());
        let (resp, _) = rxdm.handle(
            Endpoint::RuleManager,
            &UnixSocketProto {
                payload: Some(Payload::QueueIdQuery {
                    gpu_pci_addr: Some("0000:04:00.0".into()),
                }),
            }
            .encode(),
        );
        assert!(!resp.is_empty());
        assert_eq!(rxdm.records().len(), 5);
    }
}
