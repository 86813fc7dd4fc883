//! Property tests (bounded fuzzing) of the parsers that read untrusted names and URLs: every
//! input either is refused or keeps the invariant the security model rests on (docs/security.md).

use proptest::prelude::*;
use std::path::Path;
use verity_core::names::{check_name, child_folder, folder_name, strictly_inside};
use verity_core::urls::{AllowList, OutboundUrl};

/// Text biased toward what path and URL tricks are made of.
fn tricky(max: usize) -> impl Strategy<Value = String> {
    let piece = prop::sample::select(vec![
        ".",
        "..",
        "/",
        "\\",
        "%2e",
        "%2E",
        "%2f",
        "%5c",
        "%00",
        "\0",
        "\n",
        "\t",
        "@",
        ":",
        "a",
        "v1",
        "é",
        "~",
        " ",
        "%",
        "%%",
        "?",
        "#",
        "internal",
        "127.0.0.1",
        "8080",
    ]);
    prop::collection::vec(piece, 0..max).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn an_accepted_name_is_one_plain_folder_strictly_inside_the_root(
        name in prop_oneof![tricky(12), any::<String>()],
    ) {
        let root = Path::new("/cache/models");
        match check_name(&name) {
            Ok(()) => {
                let folder = folder_name(&name).unwrap();
                prop_assert!(folder != "." && folder != ".." && !folder.is_empty());
                prop_assert!(!folder.contains(['/', '\\']));
                prop_assert!(strictly_inside(root, &child_folder(root, &name).unwrap()));
            }
            Err(_) => prop_assert!(child_folder(root, &name).is_err()),
        }
    }

    #[test]
    fn an_admitted_url_goes_to_the_entrys_host_and_under_its_path(
        scheme in prop::sample::select(vec!["http://", "https://", "ftp://", "", "HTTP://"]),
        host in prop::sample::select(vec![
            "127.0.0.1:8080", "127.0.0.1:8080@127.0.0.2:9", "user@127.0.0.1:8080",
            "127.0.0.1", "127.0.0.2:8080", "[::1]:8080", "",
        ]),
        path in tricky(10),
        entry in prop::sample::select(vec![
            "http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1", "http://127.0.0.1:8080",
        ]),
    ) {
        let url = format!("{scheme}{host}/{path}");
        let list = AllowList::parse(entry).unwrap();
        let allowed = OutboundUrl::parse(entry).unwrap();
        if let Ok(ok) = list.check(&url) {
            let sent = ok.url();
            prop_assert_eq!(sent.scheme(), "http");
            prop_assert_eq!(sent.host_str(), Some("127.0.0.1"));
            prop_assert_eq!(sent.port_or_known_default(), Some(8080));
            prop_assert!(sent.username().is_empty() && sent.password().is_none());
            // What the client sends, decoded, stays under the entry's path.
            let prefix = allowed.url().path().trim_end_matches('/');
            let decoded = percent_encoding::percent_decode_str(sent.path()).decode_utf8_lossy();
            prop_assert!(decoded.starts_with(prefix), "{} escapes {}", decoded, prefix);
            prop_assert!(!decoded.split('/').any(|s| s == ".." || s == "."), "{}", decoded);
        }
    }

    #[test]
    fn any_text_parses_or_is_refused_without_panicking(text in any::<String>()) {
        let _ = OutboundUrl::parse(&text);
        let _ = AllowList::parse(&text);
        let _ = check_name(&text);
    }
}
