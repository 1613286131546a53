//! The `admin_clusters` target: the parser of Envoy's admin `GET /clusters?format=json`
//! (`infergate_filters::membership::parse_admin_clusters`), on any bytes.
//!
//! It never panics; whatever parses lists each cluster once, and in each cluster members
//! that are `ip:port`s, each once, within the parser's bounds; the filtered parse keeps
//! exactly the accepted clusters of the full one. The memory bound is wider than the
//! other targets' ([`ADMIN_MEMORY_PER_BYTE`]): the parse holds a typed record per JSON
//! object, and `{},` (3 bytes) is a whole host record.

use std::collections::HashSet;
use std::net::SocketAddr;

use infergate_filters::membership::{
    parse_admin_clusters, parse_admin_clusters_where, MAX_CLUSTERS, MAX_HOSTS_PER_CLUSTER,
};

use crate::meter::peak_during;

/// The most bytes the parse may hold at once per input byte (a host record of some 64
/// bytes per `{},`, and a vector's doubling).
pub const ADMIN_MEMORY_PER_BYTE: usize = 64;

/// Any bytes: see the module doc.
pub fn admin_clusters(data: &[u8]) {
    let (parsed, peak) = peak_during(|| parse_admin_clusters(data));
    let bound = ADMIN_MEMORY_PER_BYTE * data.len() + 64 * 1024;
    assert!(
        peak <= bound,
        "admin_clusters: {peak} bytes allocated at once for {} input bytes (bound {bound})",
        data.len()
    );
    let Ok(clusters) = parsed else {
        return;
    };
    assert!(clusters.len() <= MAX_CLUSTERS);
    let mut names = HashSet::new();
    for cluster in &clusters {
        assert!(
            names.insert(cluster.cluster.as_str()),
            "cluster listed twice"
        );
        assert!(cluster.members.len() <= MAX_HOSTS_PER_CLUSTER);
        let mut seen = HashSet::new();
        for m in &cluster.members {
            assert!(
                m.address.parse::<SocketAddr>().is_ok(),
                "member `{}` is no ip:port",
                m.address
            );
            assert!(seen.insert(m.address.as_str()), "member listed twice");
        }
    }
    // The filtered parse is the full one restricted to what the filter accepts.
    let odd = |name: &str| name.len() % 2 == 1;
    let filtered = parse_admin_clusters_where(data, odd);
    let expected: Vec<_> = clusters.into_iter().filter(|c| odd(&c.cluster)).collect();
    assert_eq!(filtered.ok(), Some(expected));
}
