//! The stand-in over real Unix sockets, as the plugin's clients use it: one connection per rule
//! request, the registry's two requests on one connection, and the binary started, used and
//! stopped with SIGTERM.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tcpx_rxdm_standin::proto::{
    frame, FlowSteerNtuple, FlowSteerRuleRequest, FrameDecoder, Payload, SocketAddress,
    UnixSocketProto,
};
use tcpx_rxdm_standin::server::Server;
use tcpx_rxdm_standin::{Endpoint, Mode, Request, OK};

fn rule(src_port: i32) -> UnixSocketProto {
    let addr = |port| SocketAddress {
        ip_address: Some("127.0.0.1".into()),
        port: Some(port),
    };
    UnixSocketProto {
        payload: Some(Payload::FlowSteerRuleRequest(FlowSteerRuleRequest {
            ntuple: Some(FlowSteerNtuple {
                flow_type: Some(1),
                src: Some(addr(src_port)),
                dst: Some(addr(50000)),
            }),
            queue_id: None,
            gpu_pci_addr: Some("0000:04:00.0".into()),
        })),
    }
}

/// Sends one framed request and reads one framed answer, as the plugin's client does.
fn ask(stream: &mut UnixStream, m: &UnixSocketProto) -> UnixSocketProto {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(&frame(&m.encode()).unwrap()).unwrap();
    let mut d = FrameDecoder::default();
    let mut buf = [0u8; 256];
    loop {
        if let Some(f) = d.next_frame() {
            return UnixSocketProto::decode(&f).unwrap();
        }
        let n = stream.read(&mut buf).expect("an answer within 10 s");
        assert!(n > 0, "the stand-in closed without answering");
        d.push(&buf[..n]);
    }
}

fn connect(prefix: &Path, e: Endpoint) -> UnixStream {
    UnixStream::connect(prefix.join(e.file_name())).unwrap()
}

#[test]
fn rules_are_answered_and_recorded_and_stop_removes_the_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("rules.jsonl");
    let mut server = Server::start(dir.path(), Mode::Accept, Some(&log)).unwrap();
    for port in [40000, 40001] {
        let answer = ask(&mut connect(dir.path(), Endpoint::RuleManager), &rule(port));
        assert_eq!(answer, UnixSocketProto::raw(OK));
    }
    let answer = ask(
        &mut connect(dir.path(), Endpoint::RuleUninstall),
        &rule(40000),
    );
    assert_eq!(answer, UnixSocketProto::raw(OK));
    let mut reg = connect(dir.path(), Endpoint::ApplicationRegistry);
    for register in [true, false] {
        let m = UnixSocketProto {
            payload: Some(Payload::ApplicationRegisterRequest {
                register_client: Some(register),
            }),
        };
        assert_eq!(ask(&mut reg, &m), UnixSocketProto::raw(OK));
    }
    let records = server.records();
    let kinds: Vec<_> = records
        .iter()
        .map(|r| match &r.request {
            Request::InstallRule(r) => format!(
                "install {}",
                r.ntuple
                    .as_ref()
                    .unwrap()
                    .src
                    .as_ref()
                    .unwrap()
                    .port
                    .unwrap()
            ),
            Request::RemoveRule(_) => "remove".into(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "install 40000",
            "install 40001",
            "remove",
            "Register",
            "Deregister"
        ]
    );
    let lines = std::fs::read_to_string(&log).unwrap();
    assert_eq!(lines.lines().count(), 5, "{lines}");
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert_eq!(first["endpoint"], "rule_manager");
    assert_eq!(first["request"]["kind"], "install_rule");
    assert_eq!(first["ok"], true);
    server.stop();
    for e in Endpoint::ALL {
        assert!(
            !dir.path().join(e.file_name()).exists(),
            "{e:?} left behind"
        );
    }
}

#[test]
fn refuse_mode_answers_installs_with_a_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), Mode::Refuse, None).unwrap();
    let answer = ask(
        &mut connect(dir.path(), Endpoint::RuleManager),
        &rule(40000),
    );
    let Some(Payload::RawBytes(text)) = answer.payload else {
        panic!("{answer:?}")
    };
    assert_ne!(text, OK);
    assert!(!server.records()[0].ok);
}

#[test]
fn a_client_that_sends_half_a_frame_and_leaves_does_not_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), Mode::Accept, None).unwrap();
    {
        let mut s = connect(dir.path(), Endpoint::RuleManager);
        s.write_all(&[0x00, 0x40, 0x12]).unwrap();
    }
    let answer = ask(&mut connect(dir.path(), Endpoint::RuleManager), &rule(1));
    assert_eq!(answer, UnixSocketProto::raw(OK));
    assert_eq!(server.records().len(), 1);
}

#[test]
fn the_binary_serves_until_sigterm_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("rules.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tcpx-rxdm-standin"))
        .arg("--prefix")
        .arg(dir.path())
        .arg("--record")
        .arg(&log)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The sockets exist once the binary says it serves; read that line (with a deadline).
    let mut err = child.stderr.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    let mut b = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains("serving") {
        assert!(Instant::now() < deadline, "no 'serving' line");
        assert_eq!(err.read(&mut b).unwrap(), 1, "stand-in exited early");
        seen.push(b[0]);
    }
    let answer = ask(&mut connect(dir.path(), Endpoint::RuleManager), &rule(7));
    assert_eq!(answer, UnixSocketProto::raw(OK));
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success());
    let code = child.wait().unwrap();
    assert!(code.success(), "{code:?}");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped after 1 request(s)"), "{rest}");
    assert!(!dir.path().join("rx_rule_manager").exists());
    assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 1);
}
