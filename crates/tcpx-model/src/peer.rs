//! Where the other side of a run is, as `--peer` gives it.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// The other side's control address as a user writes it: an IP address, `[v6]:port`,
/// `ip:port`, a host name, or `host:port`. Checked before any lookup, so malformed text never
/// reaches a resolver; resolving is the caller's business.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Peer {
    /// An IP address (no brackets) or a host name of letters, digits, `-` and `.`.
    pub host: String,
    /// The port, when the text named one.
    pub port: Option<u16>,
}

/// Why a peer text was refused; the text is shown with control characters escaped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error("`{0}` has no port: give HOST:PORT")]
    NoPort(String),
    #[error("`{0}` is not an address: write IPv6 in brackets with a port ([::1]:5310)")]
    BareIpv6(String),
    #[error("`{text}`: the port `{port}` is not a number 1..=65535")]
    BadPort { text: String, port: String },
    #[error("`{0}` is not HOST:PORT: HOST must be an IP address or a host name of letters, digits, `-` and `.`")]
    BadHost(String),
}

impl Peer {
    /// Parses `HOST:PORT` strictly: the port must be there.
    pub fn parse_host_port(text: &str) -> Result<Peer, PeerError> {
        if let Ok(a) = text.parse::<SocketAddr>() {
            return Ok(Peer::from(a));
        }
        let shown = text.escape_debug().to_string();
        let Some((host, port)) = text.rsplit_once(':') else {
            return Err(PeerError::NoPort(shown));
        };
        if host.contains(':') || host.starts_with('[') {
            return Err(PeerError::BareIpv6(shown));
        }
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(PeerError::BadPort {
                    text: shown,
                    port: port.escape_debug().to_string(),
                })
            }
        };
        if !host_name_ok(host) {
            return Err(PeerError::BadHost(shown));
        }
        Ok(Peer {
            host: host.to_string(),
            port: Some(port),
        })
    }

    /// The peer as `HOST:PORT` text, taking `default_port` when none was given (IPv6 in
    /// brackets).
    pub fn with_port(&self, default_port: u16) -> String {
        let port = self.port.unwrap_or(default_port);
        if self.host.contains(':') {
            format!("[{}]:{port}", self.host)
        } else {
            format!("{}:{port}", self.host)
        }
    }

    /// The socket address when the host is an IP address (no lookup needed).
    pub fn socket_addr(&self, default_port: u16) -> Option<SocketAddr> {
        let ip: IpAddr = self.host.parse().ok()?;
        Some(SocketAddr::new(ip, self.port.unwrap_or(default_port)))
    }
}

/// A host name of letters, digits, `-` and `.` (labels of 1..=63, 253 bytes in all) that is no
/// malformed IPv4 address (`999.1.1.1` is a typo, not a name).
fn host_name_ok(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && !l.starts_with('-') && !l.ends_with('-'))
        && host
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'.')
        && !host.bytes().all(|c| c.is_ascii_digit() || c == b'.')
}

impl From<SocketAddr> for Peer {
    fn from(a: SocketAddr) -> Self {
        Peer {
            host: a.ip().to_string(),
            port: Some(a.port()),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => f.write_str(&self.with_port(p)),
            None => f.write_str(&self.host),
        }
    }
}

impl FromStr for Peer {
    type Err = PeerError;

    /// `HOST:PORT` as [`Peer::parse_host_port`] takes it, or a host (IP address or name) alone.
    fn from_str(text: &str) -> Result<Self, PeerError> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(Peer {
                host: ip.to_string(),
                port: None,
            });
        }
        if !text.contains(':') {
            if !host_name_ok(text) {
                return Err(PeerError::BadHost(text.escape_debug().to_string()));
            }
            return Ok(Peer {
                host: text.to_string(),
                port: None,
            });
        }
        Peer::parse_host_port(text)
    }
}

crate::serde_as_text!(Peer, "HOST or HOST:PORT");
