//! The client address of a request: the TCP peer, or — when the peer is a trusted proxy — the
//! last address in `X-Forwarded-For` that is not itself a trusted proxy.

use axum::extract::ConnectInfo;
use axum::http::{Extensions, HeaderMap};
use ipnet::IpNet;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

/// Proxies whose `X-Forwarded-For` is believed (`VERITY_TRUSTED_PROXIES`).
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

/// An entry of `VERITY_TRUSTED_PROXIES` that is neither an address nor a network.
#[derive(Debug, thiserror::Error)]
#[error("VERITY_TRUSTED_PROXIES: {0:?} is not an IP address or network (e.g. 10.0.0.0/8)")]
pub struct BadProxy(String);

impl TrustedProxies {
    /// Parses a comma-separated list of addresses and networks (`10.0.0.0/8,::1`); empty: none.
    pub fn parse(list: &str) -> Result<TrustedProxies, BadProxy> {
        let mut nets = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let net = match entry.parse::<IpNet>() {
                Ok(net) => net,
                Err(_) => {
                    entry.parse::<IpAddr>().map(IpNet::from).map_err(|_| BadProxy(entry.into()))?
                }
            };
            nets.push(net);
        }
        Ok(TrustedProxies(nets))
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&canonical(ip)))
    }

    /// The client address of a request (`None` when the server did not record its peer).
    pub fn client_addr(&self, extensions: &Extensions, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = canonical(extensions.get::<ConnectInfo<SocketAddr>>()?.0.ip());
        if !self.trusts(peer) {
            return Some(peer);
        }
        // Each proxy appends the address it received from; read from the right, skipping the
        // trusted ones. An unparsable entry ends the walk: everything left of it is forgeable.
        let mut client = peer;
        let hops = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .collect::<Vec<_>>();
        for hop in hops.into_iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) => {
                    client = canonical(ip);
                    if !self.trusts(client) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        Some(client)
    }
}

/// An IPv4-mapped IPv6 address as IPv4; others unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The throttling bucket of an address: IPv4 as is, IPv6 by its /64 (one host's usual share),
/// `unknown` when the peer was not recorded.
pub fn address_bucket(addr: Option<IpAddr>) -> String {
    match addr.map(canonical) {
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            format!("{}/64", Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        Some(IpAddr::V4(v4)) => v4.to_string(),
        None => "unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(peer: &str, forwarded: &[&str]) -> (Extensions, HeaderMap) {
        let mut extensions = Extensions::new();
        extensions.insert(ConnectInfo(format!("{peer}:4000").parse::<SocketAddr>().unwrap()));
        let mut headers = HeaderMap::new();
        for value in forwarded {
            headers.append("x-forwarded-for", value.parse().unwrap());
        }
        (extensions, headers)
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let proxies = TrustedProxies::parse("10.0.0.0/8, 127.0.0.1").unwrap();
        let addr = |peer, fwd: &[&str]| {
            let (e, h) = request(peer, fwd);
            proxies.client_addr(&e, &h).unwrap().to_string()
        };
        // An untrusted peer's header is ignored.
        assert_eq!(addr("192.0.2.7", &["198.51.100.1"]), "192.0.2.7");
        // Through two trusted proxies: the first untrusted hop from the right.
        assert_eq!(addr("127.0.0.1", &["203.0.113.9, 198.51.100.1, 10.1.2.3"]), "198.51.100.1");
        assert_eq!(addr("127.0.0.1", &["203.0.113.9", "10.1.2.3"]), "203.0.113.9");
        // A trusted peer without the header is the client; garbage stops the walk.
        assert_eq!(addr("10.9.9.9", &[]), "10.9.9.9");
        assert_eq!(addr("10.9.9.9", &["1.2.3.4, junk, 10.0.0.2"]), "10.0.0.2");
        assert_eq!(
            TrustedProxies::default().client_addr(&Extensions::new(), &HeaderMap::new()),
            None
        );
        assert!(TrustedProxies::parse("10.0.0.0/8,nonsense").is_err());
        assert!(TrustedProxies::parse("").unwrap().0.is_empty());
    }

    #[test]
    fn ipv6_addresses_share_a_bucket_per_64() {
        let a = "2001:db8:1:2:aaaa::1".parse().ok();
        let b = "2001:db8:1:2:bbbb::2".parse().ok();
        assert_eq!(address_bucket(a), address_bucket(b));
        assert_eq!(address_bucket("::ffff:192.0.2.1".parse().ok()), "192.0.2.1");
        assert_eq!(address_bucket(None), "unknown");
    }
}
