//! The run token: a secret both ends of the leader/follower link share, proved in both
//! directions during the greeting and never sent.
//!
//! Each side sends a fresh random nonce; the leader answers the follower's greeting with
//! HMAC-SHA256(token, "leader", follower nonce, leader nonce, run), the follower answers with the
//! same over "follower". A side that cannot show the token cannot drive the other (the follower
//! runs as root to set IRQ policies), a recorded greeting is worthless for the next connection
//! (fresh nonces), and one side's proof cannot be reflected as the other's (the role is in it).
//!
//! Where the token comes from is the caller's business (the binary reads [`TOKEN_ENV`] or
//! `--token-file`); without one both sides prove an empty key, which authenticates nothing and
//! is allowed on loopback only ([`require_token`]).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The variable a launcher's environment carries the run token in (read by the binary; set by
/// the leader for the follower it starts in a fabric's node B).
pub const TOKEN_ENV: &str = "TCPX_RUN_TOKEN";
/// Shortest token accepted, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest token accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 1024;
/// Bytes in a nonce (sent as hex).
pub const NONCE_LEN: usize = 16;
/// Longest `run` text a greeting may carry.
pub const MAX_RUN_LEN: usize = 512;

/// A run token. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct RunToken(Vec<u8>);

impl std::fmt::Debug for RunToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunToken(<{} bytes>)", self.0.len())
    }
}

impl RunToken {
    /// A token from text (surrounding whitespace dropped); `source` names where it came from
    /// (`TCPX_RUN_TOKEN`, `--token-file /path`) in the error.
    pub fn parse(text: &str, source: &str) -> Result<RunToken, String> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "{source}: the run token has {} bytes, fewer than the {MIN_TOKEN_LEN} this tool accepts: generate one with `openssl rand -hex 16` and give the same to both sides",
                t.len()
            ));
        }
        if t.len() > MAX_TOKEN_LEN {
            return Err(format!(
                "{source}: the run token has {} bytes, more than the {MAX_TOKEN_LEN} this tool accepts",
                t.len()
            ));
        }
        Ok(RunToken(t.as_bytes().to_vec()))
    }

    /// A fresh random token (hex of 16 random bytes), for runs that start both sides themselves.
    pub fn generate() -> std::io::Result<RunToken> {
        Ok(RunToken(random_hex(16)?.into_bytes()))
    }

    /// The token as text, to hand to a follower this process starts (through [`TOKEN_ENV`]).
    pub fn as_text(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

/// The run token a side was given: the text of `file` (`--token-file`), else `env` (the value of
/// [`TOKEN_ENV`] as the caller read it); `None` when neither is given. The file must be a regular
/// one (a FIFO is refused at once, not waited on) and one longer than a token can be is refused,
/// never cut to a shorter token.
pub fn given_token(
    file: Option<&std::path::Path>,
    env: Option<&std::ffi::OsStr>,
) -> Result<Option<RunToken>, String> {
    if let Some(path) = file {
        let source = format!("--token-file {}", path.display());
        let text = tcpx_topo::read_bounded(path, MAX_TOKEN_LEN as u64 + 4096)
            .map_err(|e| format!("{source}: reading the run token: {e}"))?;
        return RunToken::parse(&text, &source).map(Some);
    }
    match env.map(|v| v.to_str()) {
        None => Ok(None),
        Some(Some(t)) => RunToken::parse(t, TOKEN_ENV).map(Some),
        Some(None) => Err(format!(
            "{TOKEN_ENV} is not valid UTF-8: give both sides the same text token, e.g. from `openssl rand -hex 16`"
        )),
    }
}

/// `n` random bytes from the kernel, as lowercase hex.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(hex(&b))
}

/// A fresh nonce for one greeting.
pub fn nonce() -> std::io::Result<String> {
    random_hex(NONCE_LEN)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// Whether `n` looks like a nonce this protocol sends (hex of [`NONCE_LEN`] bytes).
pub fn valid_nonce(n: &str) -> bool {
    n.len() == 2 * NONCE_LEN && unhex(n).is_some()
}

/// Which side proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Leader,
    Follower,
}

fn mac(
    token: Option<&RunToken>,
    role: Role,
    follower_nonce: &str,
    leader_nonce: &str,
    run: &str,
) -> Hmac<Sha256> {
    let key: &[u8] = token.map_or(&[], |t| &t.0);
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    let role = match role {
        Role::Leader => "leader",
        Role::Follower => "follower",
    };
    // Length-prefixed fields, so no two different inputs give the same message.
    for part in ["tcpx-link-auth-1", role, follower_nonce, leader_nonce, run] {
        m.update(&(part.len() as u64).to_le_bytes());
        m.update(part.as_bytes());
    }
    m
}

/// `role`'s proof of the token over both nonces and the run, as hex.
pub fn prove(
    token: Option<&RunToken>,
    role: Role,
    follower_nonce: &str,
    leader_nonce: &str,
    run: &str,
) -> String {
    hex(&mac(token, role, follower_nonce, leader_nonce, run)
        .finalize()
        .into_bytes())
}

/// Whether `proof` is `role`'s proof of the token (compared in constant time).
pub fn verify(
    token: Option<&RunToken>,
    role: Role,
    follower_nonce: &str,
    leader_nonce: &str,
    run: &str,
    proof: &str,
) -> bool {
    let Some(p) = unhex(proof) else {
        return false;
    };
    mac(token, role, follower_nonce, leader_nonce, run)
        .verify_slice(&p)
        .is_ok()
}

/// Refuses to run the link without a token where the peer is not on this machine: `ip` is
/// the address the link uses, `side` says which side this is for the message.
pub fn require_token(
    token: Option<&RunToken>,
    ip: std::net::IpAddr,
    side: &str,
) -> Result<(), String> {
    if token.is_some() || ip.is_loopback() {
        return Ok(());
    }
    Err(format!(
        "{side} on {ip}, beyond this machine, needs a run token so that only your follower and leader can use the link: \
         give both sides the same secret, in the environment (export {TOKEN_ENV}=$(openssl rand -hex 16), e.g. in the launcher's job environment) \
         or as --token-file FILE on both command lines"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(s: &str) -> RunToken {
        RunToken::parse(s, "test").unwrap()
    }

    #[test]
    fn a_given_token_comes_from_the_file_else_the_variable_and_is_refused_whole() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "0123456789abcdef0123\n").unwrap();
        let env = OsStr::new("fedcba9876543210fedc");
        // The file wins over the variable.
        assert_eq!(
            given_token(Some(&file), Some(env)).unwrap(),
            Some(token("0123456789abcdef0123"))
        );
        assert_eq!(
            given_token(None, Some(env)).unwrap(),
            Some(token("fedcba9876543210fedc"))
        );
        assert_eq!(given_token(None, None).unwrap(), None);
        let e =
            given_token(None, Some(OsStr::from_bytes(b"\xff\xfe0123456789abcdef"))).unwrap_err();
        assert!(e.starts_with("TCPX_RUN_TOKEN is not valid UTF-8"), "{e}");
        // Longer than any token: refused, not cut.
        std::fs::write(&file, "a".repeat(MAX_TOKEN_LEN + 8192)).unwrap();
        let e = given_token(Some(&file), None).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "--token-file {}: reading the run token: ",
                file.display()
            )),
            "{e}"
        );
        let e = given_token(Some(&dir.path().join("absent")), None).unwrap_err();
        assert!(e.contains("reading the run token"), "{e}");
    }

    #[test]
    fn proofs_bind_the_token_the_role_both_nonces_and_the_run() {
        let t = token("0123456789abcdef0123");
        let (f, l) = ("aa".repeat(16), "bb".repeat(16));
        let p = prove(Some(&t), Role::Leader, &f, &l, "plan x");
        assert!(verify(Some(&t), Role::Leader, &f, &l, "plan x", &p));
        // Another token, no token, the other role, swapped or other nonces, another run: no.
        assert!(!verify(
            Some(&token("0123456789abcdef0124")),
            Role::Leader,
            &f,
            &l,
            "plan x",
            &p
        ));
        assert!(!verify(None, Role::Leader, &f, &l, "plan x", &p));
        assert!(!verify(Some(&t), Role::Follower, &f, &l, "plan x", &p));
        assert!(!verify(Some(&t), Role::Leader, &l, &f, "plan x", &p));
        assert!(!verify(
            Some(&t),
            Role::Leader,
            &f,
            &"cc".repeat(16),
            "plan x",
            &p
        ));
        assert!(!verify(Some(&t), Role::Leader, &f, &l, "plan y", &p));
        assert!(!verify(Some(&t), Role::Leader, &f, &l, "plan x", "zz"));
        assert!(!verify(Some(&t), Role::Leader, &f, &l, "plan x", ""));
    }

    #[test]
    fn tokens_are_bounded_and_never_printed() {
        let e = RunToken::parse("short", "TCPX_RUN_TOKEN").unwrap_err();
        assert!(
            e.starts_with("TCPX_RUN_TOKEN: the run token has 5 bytes"),
            "{e}"
        );
        let e = RunToken::parse(&"x".repeat(2000), "--token-file t").unwrap_err();
        assert!(e.contains("more than the 1024"), "{e}");
        let t = token("  secret-secret-secret\n");
        assert_eq!(t.as_text(), "secret-secret-secret");
        assert!(!format!("{t:?}").contains("secret"));
        assert_ne!(RunToken::generate().unwrap(), RunToken::generate().unwrap());
        assert!(valid_nonce(&nonce().unwrap()));
        assert!(!valid_nonce("xyz"));
    }

    #[test]
    fn a_link_beyond_this_machine_needs_a_token() {
        let any: std::net::IpAddr = "0.0.0.0".parse().unwrap();
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        assert!(require_token(None, lo, "listening").is_ok());
        let e = require_token(None, any, "listening for the follower").unwrap_err();
        assert!(
            e.contains("TCPX_RUN_TOKEN") && e.contains("--token-file"),
            "{e}"
        );
        assert!(require_token(Some(&token("0123456789abcdef")), any, "x").is_ok());
    }
}
