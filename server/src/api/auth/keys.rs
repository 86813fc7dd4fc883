//! API keys (`vt-…`) and passwords: generation and argon2 hashing.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use rand::Rng;

/// Every API key starts with this.
pub const KEY_PREFIX: &str = "vt-";
/// Characters of the key (prefix included) stored in clear to find its row.
pub const LOOKUP_LEN: usize = 11;
const SECRET_LEN: usize = 40;
const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A freshly generated key: the whole key (shown once) and its lookup prefix.
#[derive(Debug, Clone)]
pub struct NewKey {
    /// The key to hand to the user.
    pub key: String,
    /// Its first [`LOOKUP_LEN`] characters.
    pub lookup: String,
}

/// `len` random letters and digits (~5.95 bits each).
pub fn random_chars(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

/// A new random API key.
pub fn generate_key() -> NewKey {
    let key = format!("{KEY_PREFIX}{}", random_chars(SECRET_LEN));
    NewKey { lookup: key[..LOOKUP_LEN].to_string(), key }
}

/// The lookup prefix of something shaped like an API key.
pub fn lookup_of(key: &str) -> Option<&str> {
    let well_formed = key.starts_with(KEY_PREFIX)
        && key.len() == KEY_PREFIX.len() + SECRET_LEN
        && key[KEY_PREFIX.len()..].bytes().all(|b| b.is_ascii_alphanumeric());
    well_formed.then(|| &key[..LOOKUP_LEN])
}

/// Argon2id PHC string of `secret`.
pub fn hash_secret(secret: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())?;
    Ok(Argon2::default().hash_password(secret.as_bytes(), &salt)?.to_string())
}

/// True when `secret` matches the PHC string `hash`.
pub fn verify_secret(secret: &str, hash: &str) -> bool {
    PasswordHash::new(hash)
        .map(|parsed| Argon2::default().verify_password(secret.as_bytes(), &parsed).is_ok())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hash_and_verify() {
        let k = generate_key();
        assert_eq!(lookup_of(&k.key), Some(k.lookup.as_str()));
        assert!(lookup_of("vt-short").is_none());
        let h = hash_secret(&k.key).unwrap();
        assert!(verify_secret(&k.key, &h));
        assert!(!verify_secret(&generate_key().key, &h));
        assert!(!verify_secret(&k.key, "not a hash"));
    }
}
