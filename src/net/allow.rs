//! `server.allow`: which peers may open `/snapshot` and `/changes`. Pure: parsing a CIDR list and matching an
//! address against it, so that the server's check is one call and every edge is a unit test.
//!
//! The relay hands the whole change stream, every row of the application's data, to whoever connects; the list
//! is the sidecar's own answer to "who may", for deployments where the network alone is not enough.

use std::fmt;
use std::net::IpAddr;

/// One `address/prefix` block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `10.0.0.0/8`, `fd00::/8`, or a bare address (a block of one). Host bits set below the prefix
    /// (`10.1.2.3/8`) are refused: such an entry is usually a typo for a narrower block, and silently widening
    /// it would let in peers the operator did not mean to.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address.parse().map_err(|_| {
            format!("{text:?} is not an IP address or a CIDR block like \"10.0.0.0/8\"")
        })?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            // Digits only: `u8::from_str` would take "+8".
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => n,
                _ => return Err(format!("{text:?}: the prefix length must be 0 to {max}")),
            },
        };
        let block = Cidr { network, prefix };
        if block.masked(network) != network {
            return Err(format!(
                "{text:?} has host bits set below /{prefix}: did you mean {}?",
                Cidr {
                    network: block.masked(network),
                    prefix
                }
            ));
        }
        Ok(block)
    }

    /// Whether `addr` is inside the block. An IPv4 peer reached over an IPv6 socket (`::ffff:10.0.0.1`) is
    /// matched as the IPv4 address it is.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = addr.to_canonical();
        addr.is_ipv4() == self.network.is_ipv4() && self.masked(addr) == self.network
    }

    fn masked(&self, addr: IpAddr) -> IpAddr {
        match addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// `server.allow`: empty lets everyone in (the network decides, as for Zero's own change-streamer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    blocks: Vec<Cidr>,
}

impl AllowList {
    /// Parses every entry, reporting all bad ones at once.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let mut blocks = Vec::with_capacity(entries.len());
        let mut errors = Vec::new();
        for entry in entries {
            match Cidr::parse(entry.as_ref()) {
                Ok(block) => blocks.push(block),
                Err(err) => errors.push(err),
            }
        }
        if errors.is_empty() {
            Ok(Self { blocks })
        } else {
            Err(errors.join("; "))
        }
    }

    /// Whether the list restricts anyone at all.
    pub fn is_open(&self) -> bool {
        self.blocks.is_empty()
    }

    pub fn allows(&self, addr: IpAddr) -> bool {
        self.is_open() || self.blocks.iter().any(|block| block.contains(addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn blocks_contain_their_addresses_only() {
        let private = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(private.contains(ip("10.0.0.0")));
        assert!(private.contains(ip("10.255.255.255")));
        assert!(!private.contains(ip("11.0.0.0")));
        assert!(!private.contains(ip("9.255.255.255")));
        // An IPv4 peer on a dual-stack socket.
        assert!(private.contains(ip("::ffff:10.1.2.3")));
        assert!(
            !private.contains(ip("::a01:203")),
            "IPv4-compatible is IPv6"
        );

        let one = Cidr::parse("192.168.1.7").unwrap();
        assert!(one.contains(ip("192.168.1.7")));
        assert!(!one.contains(ip("192.168.1.8")));

        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        assert!(!all.contains(ip("::1")), "an IPv4 block holds no IPv6 peer");

        let ula = Cidr::parse("fd00::/8").unwrap();
        assert!(ula.contains(ip("fd12:3456::1")));
        assert!(!ula.contains(ip("fe80::1")));
        assert!(Cidr::parse("::1/128").unwrap().contains(ip("::1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("2001:db8::1")));

        assert!(Cidr::parse(" 172.16.0.0/12 ")
            .unwrap()
            .contains(ip("172.31.255.1")));
        assert!(!Cidr::parse("172.16.0.0/12")
            .unwrap()
            .contains(ip("172.32.0.1")));
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        for (text, says) in [
            ("", "is not an IP address"),
            ("localhost", "is not an IP address"),
            ("10.0.0.0/33", "0 to 32"),
            ("::/129", "0 to 128"),
            ("10.0.0.0/", "0 to 32"),
            ("10.0.0.0/+8", "0 to 32"),
            ("10.0.0.0/-1", "0 to 32"),
            ("10.0.0.0/8/8", "0 to 32"),
            ("10.1.2.3/8", "did you mean 10.0.0.0/8?"),
            ("fd00::1/8", "did you mean fd00::/8?"),
        ] {
            let err = Cidr::parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
        let err = AllowList::parse(&["10.0.0.0/8", "nope", "1.2.3.4/40"]).unwrap_err();
        assert!(
            err.contains("\"nope\"") && err.contains("\"1.2.3.4/40\""),
            "{err}"
        );
    }

    #[test]
    fn an_empty_list_allows_everyone_and_a_list_only_its_blocks() {
        let open = AllowList::parse::<&str>(&[]).unwrap();
        assert!(open.is_open() && open.allows(ip("203.0.113.9")));
        let list = AllowList::parse(&["127.0.0.0/8", "::1", "10.0.0.0/8"]).unwrap();
        assert!(!list.is_open());
        assert!(list.allows(ip("127.0.0.1")));
        assert!(list.allows(ip("::1")));
        assert!(list.allows(ip("::ffff:127.0.0.1")));
        assert!(list.allows(ip("10.9.8.7")));
        assert!(!list.allows(ip("192.168.0.1")));
        assert!(!list.allows(ip("::2")));
    }
}
