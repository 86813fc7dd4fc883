//! Outbound URLs and the allow-lists that guard them (`VERITY_TOOL_HTTP_ALLOW`,
//! `VERITY_JUDGE_ENDPOINTS`): one parser and one matcher, comparing parsed URLs rather than
//! strings. A URL is refused when it has userinfo (`http://a@b/`), a scheme other than http or
//! https, no host, or a path segment that decodes to `.`, `..` or holds a separator; literal `.`
//! and `..` segments are resolved by the parser first, exactly as the HTTP client will send
//! them. An allow-list entry matches a URL with the same scheme, host and port whose decoded
//! path segments start with the entry's.

use percent_encoding::percent_decode_str;
use url::Url;

/// Why a URL or an allow-list entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Not a URL at all.
    #[error("not a URL: {0}")]
    Parse(String),
    /// Neither http nor https.
    #[error("the scheme must be http or https")]
    Scheme,
    /// `user:password@` before the host.
    #[error("user names and passwords in the URL are refused")]
    Userinfo,
    /// No host.
    #[error("the URL has no host")]
    NoHost,
    /// A path segment that decodes to `.` or `..`, or holds `/`, `\`, NUL or a control
    /// character once decoded.
    #[error("the path must not contain encoded dot segments, separators or control characters")]
    Path,
    /// A query or fragment in an allow-list entry (entries are prefixes of paths).
    #[error("an allow-list entry must not have a query or fragment")]
    EntryQuery,
    /// Well formed, but no allow-list entry admits it.
    #[error("no entry of the allow-list admits this URL")]
    NotAllowed,
}

/// A checked outbound URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundUrl {
    url: Url,
    segments: Vec<String>,
}

impl OutboundUrl {
    /// Parses and checks `text` (see the module documentation).
    pub fn parse(text: &str) -> Result<Self, UrlError> {
        let url = Url::parse(text.trim()).map_err(|e| UrlError::Parse(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(UrlError::Scheme);
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(UrlError::Userinfo);
        }
        if url.host().is_none() {
            return Err(UrlError::NoHost);
        }
        let mut segments = Vec::new();
        for raw in url.path_segments().into_iter().flatten() {
            let decoded = percent_decode_str(raw).decode_utf8().map_err(|_| UrlError::Path)?;
            if decoded == "."
                || decoded == ".."
                || decoded.contains(['/', '\\'])
                || decoded.chars().any(char::is_control)
            {
                return Err(UrlError::Path);
            }
            segments.push(decoded.into_owned());
        }
        // `/v1/` and `/v1` name the same folder; the empty last segment says nothing.
        if segments.last().is_some_and(String::is_empty) {
            segments.pop();
        }
        Ok(OutboundUrl { url, segments })
    }

    /// The URL as the HTTP client will send it.
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// The parsed URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Whether `self`, as an allow-list entry, admits `url`: same scheme, host and port
    /// (default ports filled in), and `url`'s decoded path segments start with `self`'s.
    pub fn admits(&self, url: &OutboundUrl) -> bool {
        self.url.scheme() == url.url.scheme()
            && self.url.host() == url.url.host()
            && self.url.port_or_known_default() == url.url.port_or_known_default()
            && url.segments.starts_with(&self.segments)
    }
}

/// An operator's allow-list of outbound URL prefixes; empty allows none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<OutboundUrl>);

impl AllowList {
    /// A list from comma-separated entries; the first malformed entry is an error naming it.
    pub fn parse(list: &str) -> Result<Self, (String, UrlError)> {
        let mut entries = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parsed = OutboundUrl::parse(entry).map_err(|e| (entry.to_string(), e))?;
            if parsed.url.query().is_some() || parsed.url.fragment().is_some() {
                return Err((entry.to_string(), UrlError::EntryQuery));
            }
            entries.push(parsed);
        }
        Ok(AllowList(entries))
    }

    /// Whether no entry is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `url` checked and admitted by an entry, or why not.
    pub fn check(&self, url: &str) -> Result<OutboundUrl, UrlError> {
        let parsed = OutboundUrl::parse(url)?;
        if self.0.iter().any(|entry| entry.admits(&parsed)) {
            Ok(parsed)
        } else {
            Err(UrlError::NotAllowed)
        }
    }

    /// Whether `url` passes [`AllowList::check`].
    pub fn allows(&self, url: &str) -> bool {
        self.check(url).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ENTRY: &str = "http://127.0.0.1:8080/v1/";

    #[test]
    fn the_probes_of_issue_43_are_refused() {
        // `..` and its encodings are resolved first: the client would POST to /internal.
        let dotted = [
            "http://127.0.0.1:8080/v1/../internal",
            "http://127.0.0.1:8080/v1/%2e%2e/internal2",
            "http://127.0.0.1:8080/v1/%2E%2e/internal2",
            "http://127.0.0.1:8080/v1/.%2e/internal2",
            "http://127.0.0.1:8080/v1/x/../../internal",
        ];
        for entry in [ENTRY, "http://127.0.0.1:8080/v1"] {
            let list = AllowList::parse(entry).unwrap();
            for url in dotted {
                assert_eq!(list.check(url), Err(UrlError::NotAllowed), "{entry} {url}");
            }
        }
        let whole_host = AllowList::parse("http://127.0.0.1:8080").unwrap();
        assert!(dotted.iter().all(|url| whole_host.allows(url)), "the entry allows the whole host");
        for entry in [ENTRY, "http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"] {
            let list = AllowList::parse(entry).unwrap();
            for encoded in [
                "http://127.0.0.1:8080/v1/a%2f..%2f..%2finternal",
                "http://127.0.0.1:8080/v1/a%5c..",
                "http://127.0.0.1:8080/v1/a%00b",
            ] {
                assert_eq!(list.check(encoded), Err(UrlError::Path), "{entry} {encoded}");
            }
            let userinfo = list.check("http://127.0.0.1:8080@127.0.0.2:9/");
            assert_eq!(userinfo.unwrap_err(), UrlError::Userinfo, "{entry}");
            assert_eq!(
                list.check("http://u:p@127.0.0.1:8080/v1/x").unwrap_err(),
                UrlError::Userinfo
            );
        }
    }

    #[test]
    fn scheme_host_port_and_whole_segments_must_match() {
        let list = AllowList::parse(&format!("{ENTRY}, https://tools.example/api")).unwrap();
        for ok in [
            "http://127.0.0.1:8080/v1/",
            "http://127.0.0.1:8080/v1",
            "http://127.0.0.1:8080/v1/search?q=1",
            "http://127.0.0.1:8080/v1/a/./b",
            "http://127.0.0.1:8080/v1/a/../b",
            "https://tools.example:443/api/x",
            "https://TOOLS.example/api/x",
        ] {
            assert!(list.allows(ok), "{ok}");
        }
        for refused in [
            "http://127.0.0.1:8081/v1/x",
            "https://127.0.0.1:8080/v1/x",
            "http://127.0.0.2:8080/v1/x",
            "http://127.0.0.1:8080/v10/x",
            "http://127.0.0.1:8080/",
            "http://tools.example/api/x",
            "https://tools.example.evil/api/x",
            "https://tools.example/apix",
            "file:///etc/passwd",
            "not a url",
        ] {
            assert!(!list.allows(refused), "{refused}");
        }
        assert!(!AllowList::default().allows("http://127.0.0.1:8080/v1/"));
    }

    #[test]
    fn malformed_entries_are_named() {
        for entry in [
            "127.0.0.1:8080/v1",
            "ftp://127.0.0.1/",
            "http://u@127.0.0.1/",
            "http://h/a%2fb/",
            "http://h/?q",
        ] {
            let (named, _) = AllowList::parse(&format!("http://ok/, {entry}")).unwrap_err();
            assert_eq!(named, entry);
        }
    }
}
