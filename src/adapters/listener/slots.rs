//! Who may hold a connection to the listener: a table of the connections open, by peer, and the
//! rule that admits one more. Pure (no sockets, no clock), so the rule is tested by itself;
//! the listener keeps one table behind a lock and asks it at each accept.
//!
//! The rule:
//! - A peer holds at most `per_peer` connections, whatever is free: one client (or one
//!   address behind a NAT or a proxy) cannot take the listener from everyone else.
//! - At most `general` connections are open for any use.
//! - Past that, `reserve` more are kept for the probes and the scrape: a connection admitted
//!   there is answered only for `/healthz`, `/readyz` and `/metrics`, with a short time to send
//!   its request, one request each; a peer holds at most [`RESERVE_PER_PEER`] of them. So when
//!   many clients fill the listener, the kubelet and Prometheus still get in.
//!
//! A peer is an IPv4 address, or an IPv6 /64 (one host usually has a whole /64 to pick
//! addresses from). An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`, a dual-stack
//! listener's view of IPv4 clients) is the IPv4 address.

use std::collections::HashMap;
use std::net::IpAddr;

/// Reserve connections one peer may hold at once: the kubelet's liveness and readiness probes
/// may overlap.
pub const RESERVE_PER_PEER: usize = 2;

/// Where a connection was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// For any request.
    General,
    /// For the probes and the scrape only.
    Reserve,
}

/// The key a peer's connections are counted under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerKey {
    V4([u8; 4]),
    /// The first 64 bits.
    V6([u8; 8]),
}

impl PeerKey {
    pub fn of(ip: IpAddr) -> PeerKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => PeerKey::V4(v4.octets()),
            IpAddr::V6(v6) => {
                let octets = v6.octets();
                let mut prefix = [0u8; 8];
                for (to, from) in prefix.iter_mut().zip(octets) {
                    *to = from;
                }
                PeerKey::V6(prefix)
            }
        }
    }
}

/// The connections open, and the limits they are admitted under.
#[derive(Debug)]
pub struct SlotTable {
    general_limit: usize,
    per_peer: usize,
    reserve_limit: usize,
    general: usize,
    reserve: usize,
    /// Per peer: (general, reserve) connections open.
    peers: HashMap<PeerKey, (usize, usize)>,
}

impl SlotTable {
    pub fn new(general_limit: usize, per_peer: usize, reserve_limit: usize) -> SlotTable {
        SlotTable { general_limit, per_peer, reserve_limit, general: 0, reserve: 0, peers: HashMap::new() }
    }

    /// Admits one more connection from `peer`, or says no (`None`: close it at once).
    pub fn admit(&mut self, peer: PeerKey) -> Option<Admission> {
        let (general, reserve) = self.peers.get(&peer).copied().unwrap_or((0, 0));
        if general + reserve >= self.per_peer {
            return None;
        }
        let admission = if self.general < self.general_limit {
            self.general += 1;
            Admission::General
        } else if self.reserve < self.reserve_limit && reserve < RESERVE_PER_PEER {
            self.reserve += 1;
            Admission::Reserve
        } else {
            return None;
        };
        let counts = self.peers.entry(peer).or_default();
        match admission {
            Admission::General => counts.0 += 1,
            Admission::Reserve => counts.1 += 1,
        }
        Some(admission)
    }

    /// A connection admitted as `admission` closed.
    pub fn release(&mut self, peer: PeerKey, admission: Admission) {
        let Some(counts) = self.peers.get_mut(&peer) else { return };
        match admission {
            Admission::General => {
                counts.0 = counts.0.saturating_sub(1);
                self.general = self.general.saturating_sub(1);
            }
            Admission::Reserve => {
                counts.1 = counts.1.saturating_sub(1);
                self.reserve = self.reserve.saturating_sub(1);
            }
        }
        if *counts == (0, 0) {
            self.peers.remove(&peer);
        }
    }

    /// Connections open: (general, reserve).
    pub fn open(&self) -> (usize, usize) {
        (self.general, self.reserve)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(text: &str) -> PeerKey {
        PeerKey::of(text.parse().unwrap())
    }

    #[test]
    fn one_peer_cannot_take_every_slot() {
        let mut table = SlotTable::new(8, 3, 2);
        let greedy = peer("10.0.0.1");
        let admitted: Vec<_> = (0..10).map(|_| table.admit(greedy)).collect();
        assert_eq!(admitted.iter().flatten().count(), 3, "{admitted:?}");
        assert_eq!(table.admit(peer("10.0.0.2")), Some(Admission::General), "another peer still gets in");
    }

    #[test]
    fn past_the_general_slots_the_reserve_takes_two_per_peer_and_then_nothing() {
        let mut table = SlotTable::new(2, 10, 3);
        assert_eq!(table.admit(peer("10.0.0.1")), Some(Admission::General));
        assert_eq!(table.admit(peer("10.0.0.2")), Some(Admission::General));
        let kubelet = peer("10.0.0.9");
        assert_eq!(table.admit(kubelet), Some(Admission::Reserve));
        assert_eq!(table.admit(kubelet), Some(Admission::Reserve));
        assert_eq!(table.admit(kubelet), None, "two reserve connections per peer");
        assert_eq!(table.admit(peer("10.0.0.8")), Some(Admission::Reserve));
        assert_eq!(table.admit(peer("10.0.0.7")), None, "the reserve is full");
        assert_eq!(table.open(), (2, 3));
        table.release(peer("10.0.0.1"), Admission::General);
        assert_eq!(table.admit(peer("10.0.0.7")), Some(Admission::General), "a general slot freed");
        table.release(kubelet, Admission::Reserve);
        table.release(kubelet, Admission::Reserve);
        assert_eq!(table.open(), (2, 1));
        assert!(!table.peers.contains_key(&kubelet), "a peer with nothing open is forgotten");
    }

    #[test]
    fn mapped_ipv4_is_ipv4_and_an_ipv6_host_is_its_64() {
        assert_eq!(peer("::ffff:127.0.0.1"), peer("127.0.0.1"));
        assert_eq!(peer("2001:db8:1:2::1"), peer("2001:db8:1:2:ffff::9"));
        assert_ne!(peer("2001:db8:1:2::1"), peer("2001:db8:1:3::1"));
        let mut table = SlotTable::new(100, 2, 0);
        assert!(table.admit(peer("2001:db8::1")).is_some());
        assert!(table.admit(peer("2001:db8::2")).is_some());
        assert_eq!(table.admit(peer("2001:db8::3")), None, "one /64 is one peer");
    }

    #[test]
    fn releasing_what_was_never_admitted_changes_nothing() {
        let mut table = SlotTable::new(1, 1, 1);
        table.release(peer("10.0.0.1"), Admission::General);
        assert_eq!(table.open(), (0, 0));
        assert_eq!(table.admit(peer("10.0.0.1")), Some(Admission::General));
    }
}
