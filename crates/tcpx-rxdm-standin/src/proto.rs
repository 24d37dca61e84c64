//! The messages GPUDirect-TCPX exchanges with rxdm, and their encoding: protobuf (proto2) wire
//! format, written by hand for exactly these messages, inside frames of a 2-byte big-endian length
//! followed by that many bytes of one serialized `UnixSocketProto`.
//!
//! Field numbers, after the plugin's `rx_buf_mgr_client/proto/unix_socket_proto.proto`:
//! `UnixSocketProto` is a oneof of `raw_bytes` (1, bytes), `flow_steer_rule_request` (2),
//! `queue_id_query` (3), `queue_id_response` (4) and `application_register_request` (6);
//! `FlowSteerRuleRequest` has `flow_steer_ntuple` (1), `queue_id` (2, int32) and `gpu_pci_addr`
//! (3, string); `FlowSteerNtupleProto` has `flow_type` (1, int32), `src` (2) and `dst` (3), each a
//! `SocketAddress` of `ip_address` (1, string) and `port` (2, int32); `QueueIdQuery` has
//! `gpu_pci_addr` (1); `QueueIdResponse` has repeated `queue_ids` (1, int32);
//! `ApplicationRegisterRequest` has `register_client` (1, bool). Unknown fields are skipped, as
//! protobuf does.

use std::fmt;

/// Largest frame payload: the length prefix is 16 bits.
pub const MAX_FRAME: usize = u16::MAX as usize;

/// What is wrong with bytes that should be a message or a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message ends inside a field ({0})")]
    Truncated(&'static str),
    #[error("varint longer than 10 bytes")]
    VarintTooLong,
    #[error("field {field} has wire type {wire_type}, expected {expected}")]
    WrongType {
        field: u64,
        wire_type: u8,
        expected: u8,
    },
    #[error("wire type {0} is not supported (groups are not used by these messages)")]
    BadWireType(u8),
    #[error("field {0} is not valid UTF-8")]
    NotUtf8(&'static str),
    #[error("a message of {0} bytes does not fit a frame (at most {MAX_FRAME})")]
    TooLong(usize),
}

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// An endpoint of a flow: IP address in presentation form and port.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SocketAddress {
    pub ip_address: Option<String>,
    pub port: Option<i32>,
}

impl fmt::Display for SocketAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ip = self.ip_address.as_deref().unwrap_or("?");
        let port = self.port.map_or("?".to_string(), |p| p.to_string());
        if ip.contains(':') {
            write!(f, "[{ip}]:{port}")
        } else {
            write!(f, "{ip}:{port}")
        }
    }
}

/// The flow a rule steers: its type (ethtool's `TCP_V4_FLOW` = 1, `TCP_V6_FLOW` = 5) and ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlowSteerNtuple {
    pub flow_type: Option<i32>,
    pub src: Option<SocketAddress>,
    pub dst: Option<SocketAddress>,
}

/// Install (on `rx_rule_manager`) or remove (on `rx_rule_uninstall`) the steering rule of a flow.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlowSteerRuleRequest {
    pub ntuple: Option<FlowSteerNtuple>,
    pub queue_id: Option<i32>,
    pub gpu_pci_addr: Option<String>,
}

/// What one `UnixSocketProto` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    RawBytes(Vec<u8>),
    FlowSteerRuleRequest(FlowSteerRuleRequest),
    QueueIdQuery { gpu_pci_addr: Option<String> },
    QueueIdResponse { queue_ids: Vec<i32> },
    ApplicationRegisterRequest { register_client: Option<bool> },
}

/// One message on the socket; `None`: an empty message (no field of the oneof set).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnixSocketProto {
    pub payload: Option<Payload>,
}

impl UnixSocketProto {
    pub fn raw(bytes: &[u8]) -> Self {
        UnixSocketProto {
            payload: Some(Payload::RawBytes(bytes.to_vec())),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match &self.payload {
            None => {}
            Some(Payload::RawBytes(b)) => put_bytes(&mut out, 1, b),
            Some(Payload::FlowSteerRuleRequest(r)) => put_bytes(&mut out, 2, &r.encode()),
            Some(Payload::QueueIdQuery { gpu_pci_addr }) => {
                let mut m = Vec::new();
                if let Some(a) = gpu_pci_addr {
                    put_bytes(&mut m, 1, a.as_bytes());
                }
                put_bytes(&mut out, 3, &m);
            }
            Some(Payload::QueueIdResponse { queue_ids }) => {
                let mut m = Vec::new();
                for q in queue_ids {
                    put_int32(&mut m, 1, *q);
                }
                put_bytes(&mut out, 4, &m);
            }
            Some(Payload::ApplicationRegisterRequest { register_client }) => {
                let mut m = Vec::new();
                if let Some(r) = register_client {
                    put_varint_field(&mut m, 1, u64::from(*r));
                }
                put_bytes(&mut out, 6, &m);
            }
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut payload = None;
        for field in Fields::new(bytes) {
            let field = field?;
            // A oneof: the last member on the wire wins.
            match field.number {
                1 => payload = Some(Payload::RawBytes(field.bytes("raw_bytes")?.to_vec())),
                2 => {
                    payload = Some(Payload::FlowSteerRuleRequest(FlowSteerRuleRequest::decode(
                        field.bytes("flow_steer_rule_request")?,
                    )?))
                }
                3 => {
                    let mut gpu_pci_addr = None;
                    for f in Fields::new(field.bytes("queue_id_query")?) {
                        let f = f?;
                        if f.number == 1 {
                            gpu_pci_addr = Some(f.string("gpu_pci_addr")?);
                        }
                    }
                    payload = Some(Payload::QueueIdQuery { gpu_pci_addr });
                }
                4 => {
                    let mut queue_ids = Vec::new();
                    for f in Fields::new(field.bytes("queue_id_response")?) {
                        let f = f?;
                        if f.number == 1 {
                            queue_ids.extend(f.int32s("queue_ids")?);
                        }
                    }
                    payload = Some(Payload::QueueIdResponse { queue_ids });
                }
                6 => {
                    let mut register_client = None;
                    for f in Fields::new(field.bytes("application_register_request")?) {
                        let f = f?;
                        if f.number == 1 {
                            register_client = Some(f.varint("register_client")? != 0);
                        }
                    }
                    payload = Some(Payload::ApplicationRegisterRequest { register_client });
                }
                _ => {}
            }
        }
        Ok(UnixSocketProto { payload })
    }
}

impl FlowSteerRuleRequest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if let Some(n) = &self.ntuple {
            let mut m = Vec::new();
            if let Some(t) = n.flow_type {
                put_int32(&mut m, 1, t);
            }
            for (number, addr) in [(2, &n.src), (3, &n.dst)] {
                if let Some(a) = addr {
                    let mut s = Vec::new();
                    if let Some(ip) = &a.ip_address {
                        put_bytes(&mut s, 1, ip.as_bytes());
                    }
                    if let Some(p) = a.port {
                        put_int32(&mut s, 2, p);
                    }
                    put_bytes(&mut m, number, &s);
                }
            }
            put_bytes(&mut out, 1, &m);
        }
        if let Some(q) = self.queue_id {
            put_int32(&mut out, 2, q);
        }
        if let Some(a) = &self.gpu_pci_addr {
            put_bytes(&mut out, 3, a.as_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let mut r = FlowSteerRuleRequest::default();
        for f in Fields::new(bytes) {
            let f = f?;
            match f.number {
                1 => {
                    // A repeated occurrence of a message field merges into the earlier one.
                    let n = r.ntuple.get_or_insert_with(Default::default);
                    for g in Fields::new(f.bytes("flow_steer_ntuple")?) {
                        let g = g?;
                        match g.number {
                            1 => n.flow_type = Some(g.int32("flow_type")?),
                            2 | 3 => {
                                let slot = if g.number == 2 {
                                    &mut n.src
                                } else {
                                    &mut n.dst
                                };
                                let a = slot.get_or_insert_with(Default::default);
                                for h in Fields::new(g.bytes("socket_address")?) {
                                    let h = h?;
                                    match h.number {
                                        1 => a.ip_address = Some(h.string("ip_address")?),
                                        2 => a.port = Some(h.int32("port")?),
                                        _ => {}
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                2 => r.queue_id = Some(f.int32("queue_id")?),
                3 => r.gpu_pci_addr = Some(f.string("gpu_pci_addr")?),
                _ => {}
            }
        }
        Ok(r)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, number: u32, wire_type: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

fn put_varint_field(out: &mut Vec<u8>, number: u32, v: u64) {
    put_key(out, number, VARINT);
    put_varint(out, v);
}

/// int32 is a varint of the value sign-extended to 64 bits (10 bytes when negative).
fn put_int32(out: &mut Vec<u8>, number: u32, v: i32) {
    put_varint_field(out, number, i64::from(v) as u64);
}

fn put_bytes(out: &mut Vec<u8>, number: u32, b: &[u8]) {
    put_key(out, number, LEN);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn get_varint(bytes: &[u8], at: &mut usize, what: &'static str) -> Result<u64, WireError> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let b = *bytes.get(*at).ok_or(WireError::Truncated(what))?;
        *at += 1;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(WireError::VarintTooLong)
}

/// One field as found on the wire.
struct Field<'a> {
    number: u64,
    wire_type: u8,
    varint: u64,
    data: &'a [u8],
}

impl<'a> Field<'a> {
    fn expect(&self, wire_type: u8) -> Result<(), WireError> {
        if self.wire_type == wire_type {
            Ok(())
        } else {
            Err(WireError::WrongType {
                field: self.number,
                wire_type: self.wire_type,
                expected: wire_type,
            })
        }
    }

    fn bytes(&self, _what: &'static str) -> Result<&'a [u8], WireError> {
        self.expect(LEN)?;
        Ok(self.data)
    }

    fn string(&self, what: &'static str) -> Result<String, WireError> {
        String::from_utf8(self.bytes(what)?.to_vec()).map_err(|_| WireError::NotUtf8(what))
    }

    fn varint(&self, _what: &'static str) -> Result<u64, WireError> {
        self.expect(VARINT)?;
        Ok(self.varint)
    }

    fn int32(&self, what: &'static str) -> Result<i32, WireError> {
        // Truncation to the low 32 bits is how protobuf reads an int32.
        Ok(self.varint(what)? as i32)
    }

    /// A repeated int32: one varint, or several packed into a length-delimited field.
    fn int32s(&self, what: &'static str) -> Result<Vec<i32>, WireError> {
        if self.wire_type == VARINT {
            return Ok(vec![self.varint as i32]);
        }
        let data = self.bytes(what)?;
        let mut at = 0;
        let mut out = Vec::new();
        while at < data.len() {
            out.push(get_varint(data, &mut at, what)? as i32);
        }
        Ok(out)
    }
}

/// The fields of one serialized message, in wire order.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Fields {
            bytes,
            at: 0,
            failed: false,
        }
    }

    fn next_field(&mut self) -> Result<Field<'a>, WireError> {
        let key = get_varint(self.bytes, &mut self.at, "key")?;
        let number = key >> 3;
        let wire_type = (key & 7) as u8;
        let mut field = Field {
            number,
            wire_type,
            varint: 0,
            data: &[],
        };
        let take = |at: &mut usize, n: usize| -> Result<&'a [u8], WireError> {
            let end = at
                .checked_add(n)
                .filter(|&e| e <= self.bytes.len())
                .ok_or(WireError::Truncated("value"))?;
            let s = &self.bytes[*at..end];
            *at = end;
            Ok(s)
        };
        match wire_type {
            VARINT => field.varint = get_varint(self.bytes, &mut self.at, "varint")?,
            I64 => field.data = take(&mut self.at, 8)?,
            I32 => field.data = take(&mut self.at, 4)?,
            LEN => {
                let n = get_varint(self.bytes, &mut self.at, "length")?;
                let n = usize::try_from(n).map_err(|_| WireError::Truncated("length"))?;
                field.data = take(&mut self.at, n)?;
            }
            other => return Err(WireError::BadWireType(other)),
        }
        Ok(field)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.at >= self.bytes.len() {
            return None;
        }
        let r = self.next_field();
        self.failed = r.is_err();
        Some(r)
    }
}

/// Puts the 2-byte big-endian length in front of `message`.
pub fn frame(message: &[u8]) -> Result<Vec<u8>, WireError> {
    let len = u16::try_from(message.len()).map_err(|_| WireError::TooLong(message.len()))?;
    let mut out = Vec::with_capacity(2 + message.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Ok(out)
}

/// Splits a byte stream into frames, however the stream was cut into reads.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame's message, if one has arrived.
    pub fn next_frame(&mut self) -> Option<Vec<u8>> {
        if self.buf.len() < 2 {
            return None;
        }
        let len = usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]));
        if self.buf.len() < 2 + len {
            return None;
        }
        let message = self.buf[2..2 + len].to_vec();
        self.buf.drain(..2 + len);
        Some(message)
    }

    /// Bytes received that do not make a whole frame yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}
