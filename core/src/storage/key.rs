//! Object key rules shared by every backend.

use super::StorageError;

/// Accepts relative `/`-separated keys of printable characters, without `.`/`..` or empty
/// segments, at most 1024 bytes; anything else could escape a local store's root.
pub fn validate_key(key: &str) -> Result<(), StorageError> {
    let invalid = |reason| Err(StorageError::InvalidKey { key: key.to_string(), reason });
    if key.is_empty() {
        return invalid("empty");
    }
    if key.len() > 1024 {
        return invalid("longer than 1024 bytes");
    }
    if key.starts_with('/') {
        return invalid("absolute");
    }
    if key.chars().any(|c| c.is_control() || c == '\\') {
        return invalid("control character or backslash");
    }
    for segment in key.split('/') {
        match segment {
            "" => return invalid("empty path segment"),
            "." | ".." => return invalid("relative path segment"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_escapes_and_accepts_plain_keys() {
        for bad in ["", "/etc/passwd", "a/../b", "..", "a//b", "a/./b", "a\\b", "a\nb", "a/"] {
            assert!(validate_key(bad).is_err(), "{bad:?} accepted");
        }
        for good in
            ["a", "jobs/ftjob-1/checkpoints/step-3/model.safetensors", "files/file-x.jsonl", "a..b"]
        {
            assert!(validate_key(good).is_ok(), "{good:?} rejected");
        }
    }
}
