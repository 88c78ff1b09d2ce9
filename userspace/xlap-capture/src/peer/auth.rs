//! The peer link's authentication: a token both recorders were given,
//! never sent. The collector sends a random nonce; the peer answers with
//! its own nonce and HMAC-SHA256(token, "hello" ‖ collector nonce ‖ peer
//! nonce ‖ its hello); the collector answers with HMAC-SHA256(token,
//! "accept" ‖ peer nonce ‖ collector nonce), so each side knows the other
//! holds the token. MACs are compared in constant time (hmac's verify).
//! What follows the handshake is neither encrypted nor authenticated
//! frame by frame (docs/usage.md#two-hosts says so).

use anyhow::{Context, Result};
use hmac::{KeyInit, Mac};
use std::path::Path;
use xlap_exit::{failure, Code};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

pub const NONCE: usize = 32;
pub const TAG: usize = 32;

/// The shared secret, as read from `--token-file` or `--token`.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token given on the command line (visible in `ps`: the docs say so).
    pub fn from_text(text: &str) -> Result<Token> {
        let t = text.trim();
        if t.len() < 8 {
            return Err(failure(
                Code::Usage,
                "the peer token must be at least 8 characters",
            ));
        }
        Ok(Token(t.as_bytes().to_vec()))
    }

    /// The token file's contents, surrounding white space left out (a
    /// file written by `echo` ends with a newline).
    pub fn from_file(path: &Path) -> Result<Token> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("--token-file {}: cannot read it", path.display()))
            .map_err(|e| failure(Code::Usage, format!("{e:#}")))?;
        let text = String::from_utf8(bytes).map_err(|_| {
            failure(
                Code::Usage,
                format!("--token-file {}: not text", path.display()),
            )
        })?;
        Token::from_text(&text).map_err(|e| {
            failure(
                Code::Usage,
                format!("--token-file {}: {e:#}", path.display()),
            )
        })
    }

    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        for p in parts {
            m.update(p);
        }
        m
    }

    /// The peer's tag over its hello.
    pub fn hello_tag(&self, collector: &[u8], peer: &[u8], hello: &[u8]) -> [u8; TAG] {
        self.mac(&[b"xlap-peer-hello", collector, peer, hello])
            .finalize()
            .into_bytes()
            .into()
    }

    pub fn hello_ok(&self, collector: &[u8], peer: &[u8], hello: &[u8], tag: &[u8]) -> bool {
        self.mac(&[b"xlap-peer-hello", collector, peer, hello])
            .verify_slice(tag)
            .is_ok()
    }

    /// The collector's tag: it holds the token too.
    pub fn accept_tag(&self, peer: &[u8], collector: &[u8]) -> [u8; TAG] {
        self.mac(&[b"xlap-peer-accept", peer, collector])
            .finalize()
            .into_bytes()
            .into()
    }

    pub fn accept_ok(&self, peer: &[u8], collector: &[u8], tag: &[u8]) -> bool {
        self.mac(&[b"xlap-peer-accept", peer, collector])
            .verify_slice(tag)
            .is_ok()
    }
}

/// 32 bytes from the kernel's random generator.
pub fn nonce() -> std::io::Result<[u8; NONCE]> {
    let mut n = [0u8; NONCE];
    // SAFETY: getrandom writes at most n.len() bytes into n.
    let got = unsafe { libc::getrandom(n.as_mut_ptr().cast(), n.len(), 0) };
    if got != n.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test case 2: the MAC is HMAC-SHA256.
    #[test]
    fn the_tag_is_hmac_sha256() {
        let t = Token(b"Jefe".to_vec());
        let tag: [u8; 32] = t
            .mac(&[b"what do ya want ", b"for nothing?"])
            .finalize()
            .into_bytes()
            .into();
        let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_wrong_token_or_nonce_fails() {
        let a = Token::from_text("correct horse battery").unwrap();
        let b = Token::from_text("wrong horse battery").unwrap();
        let (c, p) = (nonce().unwrap(), nonce().unwrap());
        let tag = a.hello_tag(&c, &p, b"hello");
        assert!(a.hello_ok(&c, &p, b"hello", &tag));
        assert!(!b.hello_ok(&c, &p, b"hello", &tag));
        assert!(!a.hello_ok(&p, &c, b"hello", &tag));
        assert!(!a.hello_ok(&c, &p, b"hellp", &tag));
        assert!(a.accept_ok(&p, &c, &a.accept_tag(&p, &c)));
        assert!(!a.accept_ok(&p, &c, &b.accept_tag(&p, &c)));
        assert!(Token::from_text("short").is_err());
    }
}
