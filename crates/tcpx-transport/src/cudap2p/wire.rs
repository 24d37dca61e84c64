//! The control messages two processes of one `cudap2p` comm exchange over their Unix socket.
//!
//! Every frame is a 12-byte header — magic `CP2P`, version, message kind, two reserved zero bytes,
//! payload length (u32) — and the payload; integers are little endian. Frames are small (the
//! largest carries one 64-byte IPC handle and three u64s), so a length above [`MAX_PAYLOAD`] means
//! the stream is not this protocol and is refused rather than allocated for.

use std::io::Read;

use tcpx_gpu::{IpcMemHandle, IPC_HANDLE_BYTES};

use super::CopyMode;

pub(crate) const FRAME_MAGIC: &[u8; 4] = b"CP2P";
pub(crate) const WIRE_VERSION: u8 = 1;
pub(crate) const HEADER_BYTES: usize = 12;
/// Largest payload accepted; longer reason strings are cut to fit.
pub(crate) const MAX_PAYLOAD: usize = 4096;

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    /// Connector -> listener: which comm, in which copy mode, from which process.
    Hello {
        comm: u64,
        mode: CopyMode,
        pid: u32,
        nonce: u64,
    },
    /// Listener -> connector: the comm is set up.
    Welcome,
    /// Listener -> connector: the comm is refused, and why.
    Refuse { reason: String },
    /// The exporting side's request (see [`Offer`]).
    Offer(Offer),
    /// The copying side finished request `seq`, which moved `bytes`.
    Done { seq: u64, bytes: u64 },
    /// The exporting side deregistered the allocation: close your mapping of it.
    Unshare { handle: IpcMemHandle },
    /// The copying side no longer maps the allocation (its owner may free it).
    Released { handle: IpcMemHandle },
    /// The comm failed on the sender of this message; the reason says why.
    Fail { reason: String },
    /// The sender closed every mapping of the peer's memory and sends nothing more but `Bye`.
    Bye,
}

/// The exporting side's request `seq`: `len` bytes at `offset` of the allocation `handle` of
/// `alloc_len` bytes (the sender's data in read mode, the receiver's room in write mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) seq: u64,
    pub(crate) handle: IpcMemHandle,
    pub(crate) offset: u64,
    pub(crate) len: u64,
    pub(crate) alloc_len: u64,
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("frame starts with {0:02x?}, not the cudap2p magic \"CP2P\": the peer is not a cudap2p comm of tcpx")]
    Magic([u8; 4]),
    #[error("frame of wire version {0}, this side speaks {WIRE_VERSION}: run the same tcpx build on both sides")]
    Version(u8),
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("payload of {0} bytes is larger than the {MAX_PAYLOAD} a control message may have")]
    TooLong(usize),
    #[error("message kind {kind} with a payload of {got} bytes (expected {want})")]
    Length { kind: u8, got: usize, want: String },
    #[error("the stream ended inside a frame ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },
    #[error("copy mode byte {0} is neither read (0) nor write (1)")]
    Mode(u8),
}

const K_HELLO: u8 = 1;
const K_WELCOME: u8 = 2;
const K_REFUSE: u8 = 3;
const K_OFFER: u8 = 4;
const K_DONE: u8 = 5;
const K_UNSHARE: u8 = 6;
const K_RELEASED: u8 = 7;
const K_FAIL: u8 = 8;
const K_BYE: u8 = 9;

fn text_payload(s: &str) -> Vec<u8> {
    let mut end = s.len().min(MAX_PAYLOAD);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.as_bytes()[..end].to_vec()
}

impl Msg {
    fn kind(&self) -> u8 {
        match self {
            Msg::Hello { .. } => K_HELLO,
            Msg::Welcome => K_WELCOME,
            Msg::Refuse { .. } => K_REFUSE,
            Msg::Offer(_) => K_OFFER,
            Msg::Done { .. } => K_DONE,
            Msg::Unshare { .. } => K_UNSHARE,
            Msg::Released { .. } => K_RELEASED,
            Msg::Fail { .. } => K_FAIL,
            Msg::Bye => K_BYE,
        }
    }

    /// The whole frame, header included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(96);
        match self {
            Msg::Hello {
                comm,
                mode,
                pid,
                nonce,
            } => {
                p.extend_from_slice(&comm.to_le_bytes());
                p.push(match mode {
                    CopyMode::Read => 0,
                    CopyMode::Write => 1,
                });
                p.extend_from_slice(&pid.to_le_bytes());
                p.extend_from_slice(&nonce.to_le_bytes());
            }
            Msg::Welcome | Msg::Bye => {}
            Msg::Refuse { reason } | Msg::Fail { reason } => p = text_payload(reason),
            Msg::Offer(o) => {
                p.extend_from_slice(&o.seq.to_le_bytes());
                p.extend_from_slice(&o.handle.0);
                p.extend_from_slice(&o.offset.to_le_bytes());
                p.extend_from_slice(&o.len.to_le_bytes());
                p.extend_from_slice(&o.alloc_len.to_le_bytes());
            }
            Msg::Done { seq, bytes } => {
                p.extend_from_slice(&seq.to_le_bytes());
                p.extend_from_slice(&bytes.to_le_bytes());
            }
            Msg::Unshare { handle } | Msg::Released { handle } => p.extend_from_slice(&handle.0),
        }
        let mut f = Vec::with_capacity(HEADER_BYTES + p.len());
        f.extend_from_slice(FRAME_MAGIC);
        f.push(WIRE_VERSION);
        f.push(self.kind());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&(p.len() as u32).to_le_bytes());
        f.extend_from_slice(&p);
        f
    }

    /// Checks a header; returns the message kind and the payload length that follows.
    pub(crate) fn parse_header(h: &[u8; HEADER_BYTES]) -> Result<(u8, usize), WireError> {
        let magic: [u8; 4] = h[..4].try_into().expect("4 bytes");
        if &magic != FRAME_MAGIC {
            return Err(WireError::Magic(magic));
        }
        if h[4] != WIRE_VERSION {
            return Err(WireError::Version(h[4]));
        }
        let len = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
        if len > MAX_PAYLOAD {
            return Err(WireError::TooLong(len));
        }
        Ok((h[5], len))
    }

    /// Decodes the payload of a message of `kind`.
    pub(crate) fn decode_payload(kind: u8, p: &[u8]) -> Result<Msg, WireError> {
        let exact = |want: usize| {
            if p.len() == want {
                Ok(())
            } else {
                Err(WireError::Length {
                    kind,
                    got: p.len(),
                    want: want.to_string(),
                })
            }
        };
        let u64_at = |at: usize| u64::from_le_bytes(p[at..at + 8].try_into().expect("8 bytes"));
        let handle_at =
            |at: usize| IpcMemHandle(p[at..at + IPC_HANDLE_BYTES].try_into().expect("64 bytes"));
        let text = || String::from_utf8_lossy(p).into_owned();
        Ok(match kind {
            K_HELLO => {
                exact(21)?;
                let mode = match p[8] {
                    0 => CopyMode::Read,
                    1 => CopyMode::Write,
                    m => return Err(WireError::Mode(m)),
                };
                Msg::Hello {
                    comm: u64_at(0),
                    mode,
                    pid: u32::from_le_bytes(p[9..13].try_into().expect("4 bytes")),
                    nonce: u64_at(13),
                }
            }
            K_WELCOME => {
                exact(0)?;
                Msg::Welcome
            }
            K_BYE => {
                exact(0)?;
                Msg::Bye
            }
            K_REFUSE => Msg::Refuse { reason: text() },
            K_FAIL => Msg::Fail { reason: text() },
            K_OFFER => {
                exact(8 + IPC_HANDLE_BYTES + 24)?;
                Msg::Offer(Offer {
                    seq: u64_at(0),
                    handle: handle_at(8),
                    offset: u64_at(8 + IPC_HANDLE_BYTES),
                    len: u64_at(16 + IPC_HANDLE_BYTES),
                    alloc_len: u64_at(24 + IPC_HANDLE_BYTES),
                })
            }
            K_DONE => {
                exact(16)?;
                Msg::Done {
                    seq: u64_at(0),
                    bytes: u64_at(8),
                }
            }
            K_UNSHARE => {
                exact(IPC_HANDLE_BYTES)?;
                Msg::Unshare {
                    handle: handle_at(0),
                }
            }
            K_RELEASED => {
                exact(IPC_HANDLE_BYTES)?;
                Msg::Released {
                    handle: handle_at(0),
                }
            }
            k => return Err(WireError::Kind(k)),
        })
    }

    /// Decodes one frame from the front of `buf`: `Ok(None)` while `buf` holds only part of it,
    /// else the message and the bytes it took.
    #[cfg(test)]
    pub(crate) fn decode(buf: &[u8]) -> Result<Option<(Msg, usize)>, WireError> {
        let Some(h) = buf.get(..HEADER_BYTES) else {
            return Ok(None);
        };
        let (kind, len) = Msg::parse_header(h.try_into().expect("12 bytes"))?;
        let Some(p) = buf.get(HEADER_BYTES..HEADER_BYTES + len) else {
            return Ok(None);
        };
        Ok(Some((Msg::decode_payload(kind, p)?, HEADER_BYTES + len)))
    }
}

/// What reading one frame from a stream gave.
#[derive(Debug)]
pub(crate) enum ReadOutcome {
    Msg(Msg),
    /// The stream ended cleanly between frames.
    Closed,
    /// Not a frame of this protocol.
    Bad(WireError),
    /// The socket failed (reset, timeout).
    Io(std::io::Error),
}

/// Fills `buf` completely; `Ok(n < buf.len())` when the stream ended first.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Reads one frame (blocking, under the stream's own read timeout).
pub(crate) fn read_msg(r: &mut impl Read) -> ReadOutcome {
    let mut h = [0u8; HEADER_BYTES];
    match read_full(r, &mut h) {
        Ok(0) => return ReadOutcome::Closed,
        Ok(n) if n < HEADER_BYTES => {
            return ReadOutcome::Bad(WireError::Truncated {
                got: n,
                want: HEADER_BYTES,
            })
        }
        Ok(_) => {}
        Err(e) => return ReadOutcome::Io(e),
    }
    let (kind, len) = match Msg::parse_header(&h) {
        Ok(x) => x,
        Err(e) => return ReadOutcome::Bad(e),
    };
    let mut p = vec![0u8; len];
    match read_full(r, &mut p) {
        Ok(n) if n < len => ReadOutcome::Bad(WireError::Truncated {
            got: HEADER_BYTES + n,
            want: HEADER_BYTES + len,
        }),
        Ok(_) => match Msg::decode_payload(kind, &p) {
            Ok(m) => ReadOutcome::Msg(m),
            Err(e) => ReadOutcome::Bad(e),
        },
        Err(e) => ReadOutcome::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(seed: u8) -> IpcMemHandle {
        let mut b = [0u8; IPC_HANDLE_BYTES];
        for (i, x) in b.iter_mut().enumerate() {
            *x = seed.wrapping_mul(31).wrapping_add(i as u8);
        }
        IpcMemHandle(b)
    }

    fn all() -> Vec<Msg> {
        vec![
            Msg::Hello {
                comm: 0x1234_5678_9abc,
                mode: CopyMode::Write,
                pid: 4242,
                nonce: u64::MAX - 3,
            },
            Msg::Welcome,
            Msg::Refuse {
                reason: "copy modes differ".into(),
            },
            Msg::Offer(Offer {
                seq: 7,
                handle: handle(3),
                offset: 4096,
                len: 64 << 20,
                alloc_len: (64 << 20) + 8192,
            }),
            Msg::Done {
                seq: 7,
                bytes: 64 << 20,
            },
            Msg::Unshare { handle: handle(4) },
            Msg::Released { handle: handle(5) },
            Msg::Fail {
                reason: "size mismatch ü".into(),
            },
            Msg::Bye,
        ]
    }

    #[test]
    fn every_message_survives_encode_and_decode() {
        for m in all() {
            let f = m.encode();
            let (back, used) = Msg::decode(&f).unwrap().unwrap();
            assert_eq!(back, m);
            assert_eq!(used, f.len());
        }
        // Frames back to back on one stream come apart again.
        let stream: Vec<u8> = all().iter().flat_map(|m| m.encode()).collect();
        let mut r = &stream[..];
        for m in all() {
            match read_msg(&mut r) {
                ReadOutcome::Msg(got) => assert_eq!(got, m),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(read_msg(&mut r), ReadOutcome::Closed));
    }

    #[test]
    fn truncated_frames_are_incomplete_or_errors() {
        let f = Msg::Offer(Offer {
            seq: 1,
            handle: handle(9),
            offset: 0,
            len: 4096,
            alloc_len: 8192,
        })
        .encode();
        for cut in [1, HEADER_BYTES - 1, HEADER_BYTES, f.len() - 1] {
            assert_eq!(Msg::decode(&f[..cut]).unwrap(), None, "cut at {cut}");
            let mut r = &f[..cut];
            match read_msg(&mut r) {
                ReadOutcome::Bad(WireError::Truncated { got, want }) => {
                    assert_eq!(got, cut);
                    assert!(want > got);
                }
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }

    #[test]
    fn wrong_magic_version_kind_and_lengths_are_refused() {
        let mut f = Msg::Bye.encode();
        f[0] = b'X';
        assert!(matches!(Msg::decode(&f), Err(WireError::Magic(_))));
        let e = Msg::decode(&f).unwrap_err().to_string();
        assert!(e.contains("not the cudap2p magic"), "{e}");

        let mut f = Msg::Bye.encode();
        f[4] = 99;
        assert_eq!(Msg::decode(&f), Err(WireError::Version(99)));

        let mut f = Msg::Bye.encode();
        f[5] = 200;
        assert_eq!(Msg::decode(&f), Err(WireError::Kind(200)));

        let mut f = Msg::Bye.encode();
        f[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        assert!(matches!(Msg::decode(&f), Err(WireError::TooLong(_))));

        // A Done frame whose payload is one byte short.
        let mut f = Msg::Done { seq: 1, bytes: 2 }.encode();
        f.pop();
        f[8..12].copy_from_slice(&15u32.to_le_bytes());
        assert!(matches!(
            Msg::decode(&f),
            Err(WireError::Length {
                kind: K_DONE,
                got: 15,
                ..
            })
        ));

        let mut f = Msg::Hello {
            comm: 1,
            mode: CopyMode::Read,
            pid: 1,
            nonce: 1,
        }
        .encode();
        f[HEADER_BYTES + 8] = 7;
        assert_eq!(Msg::decode(&f), Err(WireError::Mode(7)));
    }

    #[test]
    fn long_reasons_are_cut_on_a_char_boundary() {
        let reason = "é".repeat(MAX_PAYLOAD);
        let f = Msg::Fail { reason }.encode();
        let (m, _) = Msg::decode(&f).unwrap().unwrap();
        let Msg::Fail { reason } = m else {
            panic!("{m:?}")
        };
        assert!(reason.len() <= MAX_PAYLOAD && reason.chars().all(|c| c == 'é'));
    }
}
