//! The one rule for names that can become a path component (model ids, judge and tool names,
//! job and checkpoint names, cache keys), and the check that a path lies strictly inside a
//! folder. The API, the CLI and the worker's caches all use these.

use std::path::{Component, Path, PathBuf};

/// Longest name accepted, in bytes (a folder name may hold 255; the caches add a suffix).
pub const MAX_NAME_BYTES: usize = 200;

/// Why a name was refused; the message is safe to show (it never repeats the name).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty.
    #[error("must not be empty")]
    Empty,
    /// Longer than [`MAX_NAME_BYTES`].
    #[error("must be at most {MAX_NAME_BYTES} bytes")]
    TooLong,
    /// `.` or `..`.
    #[error("must not be . or ..")]
    DotSegment,
    /// Holds `/` or `\`.
    #[error("must not contain / or \\")]
    Separator,
    /// Holds NUL or another control character (tab, newline, …).
    #[error("must not contain control characters")]
    Control,
}

/// Checks `name` against the rule: 1 to [`MAX_NAME_BYTES`] bytes, not `.` or `..`, no `/` or
/// `\`, no NUL or other control characters.
pub fn check_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong);
    }
    if name == "." || name == ".." {
        return Err(NameError::DotSegment);
    }
    if name.contains(['/', '\\']) {
        return Err(NameError::Separator);
    }
    if name.chars().any(char::is_control) {
        return Err(NameError::Control);
    }
    Ok(())
}

/// The folder name for a checked `name`: ASCII letters, digits, `-`, `_` and `.` kept, every
/// other character `_`. Refuses what [`check_name`] refuses, so the result is never empty,
/// `.` or `..`.
pub fn folder_name(name: &str) -> Result<String, NameError> {
    check_name(name)?;
    Ok(name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
        .collect())
}

/// `root/{folder_name(name)}`, a path strictly inside `root`.
pub fn child_folder(root: &Path, name: &str) -> Result<PathBuf, NameError> {
    Ok(root.join(folder_name(name)?))
}

/// True when `path` lies strictly inside `root` (compared lexically): `path` is `root`
/// followed by one or more plain components, with no `.`, `..`, root or prefix components.
pub fn strictly_inside(root: &Path, path: &Path) -> bool {
    let Ok(rest) = path.strip_prefix(root) else {
        return false;
    };
    let mut components = rest.components().peekable();
    components.peek().is_some() && components.all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_separators_and_controls_are_refused() {
        assert_eq!(check_name(".."), Err(NameError::DotSegment));
        assert_eq!(check_name("."), Err(NameError::DotSegment));
        assert_eq!(check_name(""), Err(NameError::Empty));
        assert_eq!(check_name("a/b"), Err(NameError::Separator));
        assert_eq!(check_name("..\\x"), Err(NameError::Separator));
        assert_eq!(check_name("a\0b"), Err(NameError::Control));
        assert_eq!(check_name("a\nb"), Err(NameError::Control));
        assert_eq!(check_name(&"x".repeat(MAX_NAME_BYTES + 1)), Err(NameError::TooLong));
        for ok in ["smollm2", "ft:base:org:suffix:ftjob-1", "...", "a..b", ".hidden", "é"] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn folder_names_stay_inside_their_root() {
        let root = Path::new("/cache/models");
        for name in ["..", ".", "", "../x", "a/../../b"] {
            assert!(child_folder(root, name).is_err(), "{name}");
        }
        let dir = child_folder(root, "ft:base:org::ftjob-1:ckpt-step-2").unwrap();
        assert_eq!(dir, root.join("ft_base_org__ftjob-1_ckpt-step-2"));
        assert!(strictly_inside(root, &dir));
    }

    #[test]
    fn strictly_inside_refuses_the_root_itself_and_anything_that_climbs_out() {
        let root = Path::new("/cache/models");
        assert!(strictly_inside(root, Path::new("/cache/models/a/b")));
        assert!(!strictly_inside(root, Path::new("/cache/models")));
        assert!(!strictly_inside(root, Path::new("/cache/models/..")));
        assert!(!strictly_inside(root, Path::new("/cache/models/a/../..")));
        assert!(!strictly_inside(root, Path::new("/cache")));
        assert!(!strictly_inside(root, Path::new("/cache/models-other/a")));
        assert!(!strictly_inside(root, &root.join("..")));
    }
}
