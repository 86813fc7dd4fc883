//! Signed, expiring download URLs for the local backend (served by `verity serve`).

use hmac::{Hmac, Mac};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::Sha256;

/// Characters escaped in a URL path segment (everything but RFC 3986 unreserved ones).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

type HmacSha256 = Hmac<Sha256>;

/// Signs and checks `{base}/v1/objects/{key}?expires=…&signature=…` URLs.
#[derive(Clone)]
pub struct UrlSigner {
    base_url: String,
    secret: Vec<u8>,
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlSigner").field("base_url", &self.base_url).finish_non_exhaustive()
    }
}

impl UrlSigner {
    /// A signer for URLs under `base_url` keyed by `secret`.
    pub fn new(base_url: &str, secret: &[u8]) -> UrlSigner {
        UrlSigner { base_url: base_url.trim_end_matches('/').to_string(), secret: secret.to_vec() }
    }

    fn mac(&self, key: &str, expires: i64) -> HmacSha256 {
        // new_from_slice accepts keys of any length for HMAC.
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(key.as_bytes());
        mac.update(b"\n");
        mac.update(expires.to_string().as_bytes());
        mac
    }

    /// The URL for `key`, valid until the Unix time `expires`.
    pub fn sign(&self, key: &str, expires: i64) -> String {
        let signature = hex::encode(self.mac(key, expires).finalize().into_bytes());
        let path: Vec<String> =
            key.split('/').map(|s| utf8_percent_encode(s, SEGMENT).to_string()).collect();
        let path = path.join("/");
        format!("{}/v1/objects/{path}?expires={expires}&signature={signature}", self.base_url)
    }

    /// True when `signature` is this signer's for `key` and `expires` is in the future.
    pub fn verify(&self, key: &str, expires: i64, signature: &str, now: i64) -> bool {
        let Ok(raw) = hex::decode(signature) else { return false };
        expires > now && self.mac(key, expires).verify_slice(&raw).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_only_unaltered_and_unexpired() {
        let signer = UrlSigner::new("http://localhost:8080/", b"secret");
        let url = signer.sign("jobs/a b/x", 2000);
        assert!(url
            .starts_with("http://localhost:8080/v1/objects/jobs/a%20b/x?expires=2000&signature="));
        let sig = url.rsplit("signature=").next().unwrap();
        assert!(signer.verify("jobs/a b/x", 2000, sig, 1000));
        assert!(!signer.verify("jobs/a b/y", 2000, sig, 1000));
        assert!(!signer.verify("jobs/a b/x", 2001, sig, 1000));
        assert!(!signer.verify("jobs/a b/x", 2000, sig, 3000));
        assert!(!UrlSigner::new("http://x", b"other").verify("jobs/a b/x", 2000, sig, 1000));
    }
}
