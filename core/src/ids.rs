//! OpenAI-style resource identifiers (`file-…`, `ftjob-…`, `ftckpt-…`).

use rand::Rng;

const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A fresh identifier: `prefix` + `-` + 24 random alphanumeric characters (~142 bits).
pub fn new_id(prefix: &str) -> String {
    let mut rng = rand::rng();
    let body: String =
        (0..24).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect();
    format!("{prefix}-{body}")
}

/// A new job id (`ftjob-…`).
pub fn job_id() -> String {
    new_id("ftjob")
}

/// A new file id (`file-…`).
pub fn file_id() -> String {
    new_id("file")
}

/// A new checkpoint id (`ftckpt-…`).
pub fn checkpoint_id() -> String {
    new_id("ftckpt")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_prefix_and_are_unique() {
        let a = job_id();
        let b = job_id();
        assert!(a.starts_with("ftjob-") && a.len() == 30);
        assert_ne!(a, b);
    }
}
