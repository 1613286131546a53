//! Pool membership as Envoy's own cluster sees it: the load-balancer policy
//! `infergate-membership` (hooks in `hooks::lb`) and the process-wide registry it fills.
//!
//! A pool cluster's LB is Envoy's `override_host` policy (the picker's ordered list) with
//! this policy as its `fallback_policy`. Envoy creates one instance of it per worker thread
//! plus one on the main thread, each over that thread's copy of the cluster's hosts. Every
//! instance records the cluster's members (`ip:port` and health) here when it is created and
//! whenever Envoy reports a membership change (`on_lb_on_host_membership_update`: hosts added
//! or removed, e.g. an EDS update). Its `choose_host` is a round robin over the healthy hosts:
//! it only runs for a request that reaches the cluster with no list, or a retry past it.
//!
//! Health changes reach the registry the same way. Envoy registers the hook as the priority
//! set's member-update callback, and in Envoy 1.40 a health transition also runs it, with no
//! host added or removed (verified on 1.40.0 with an active HTTP health check flipping one
//! host of an EDS cluster each way: every instance, main thread and workers, got
//! `on_lb_on_host_membership_update(+0 -0)` within the check interval, and read the new
//! health). So the scraper, which asks [`Registry::members`] every tick, sees a host Envoy
//! marks unhealthy (a failed check, outlier ejection, EDS health) within one tick. The
//! registry keeps copies only: no Envoy pointer is used outside the hook that handed it in.
//!
//! The instances apply an update one thread after another, so for a moment they disagree: a
//! worker may still hold (or only now report) the hosts of an older update after the main
//! thread reported a newer one. The registry therefore keeps each instance's own view and
//! publishes, per cluster, what every live instance agrees on: a host is a member once every
//! instance has it and leaves as soon as any instance drops it, and its health is the worst
//! any instance reports (unhealthy if one says so, else degraded if one says so). A host
//! EDS removed never comes back through a late instance, and one EDS added is published
//! once the last instance has it.
//!
//! Health is told robustly against the header's two published orders of the health enum: a
//! host is `Healthy` if it is among the healthy hosts Envoy lists, `Degraded` if Envoy says
//! degraded (1 in both orders), `Unhealthy` otherwise.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use scheduler_core::snapshot::{Health, Member};

use crate::abi::callbacks as cb;
use crate::abi::{EnvoyBuffer, LbEnvoyPtr, HOST_HEALTH_DEGRADED};

/// The `lb_name` this module answers to.
pub const LB_POLICY_NAME: &str = "infergate-membership";

/// One live LB instance and the members it last read.
#[derive(Debug)]
struct Instance {
    id: u64,
    cluster: String,
    members: Vec<Member>,
}

#[derive(Debug)]
struct Inner {
    next_id: u64,
    /// Live instances, oldest first.
    instances: Vec<Instance>,
}

/// How bad a health is: the published health of a host is the worst any instance reports.
fn severity(health: Health) -> u8 {
    match health {
        Health::Healthy => 0,
        Health::Degraded => 1,
        Health::Unhealthy => 2,
    }
}

/// Which clusters have live LB instances, and each instance's members.
#[derive(Debug)]
pub struct Registry {
    inner: Mutex<Inner>,
}

/// The process's registry: filled by the LB instances, read by the scraper.
pub static REGISTRY: Registry = Registry::new();

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    /// An empty registry.
    pub const fn new() -> Registry {
        Registry {
            inner: Mutex::new(Inner {
                next_id: 1,
                instances: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind: still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a new instance of `cluster`, which sees `members` now; returns its id.
    pub fn add(&self, cluster: &str, members: Vec<Member>) -> u64 {
        let mut inner = self.lock();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.instances.push(Instance {
            id,
            cluster: cluster.to_owned(),
            members,
        });
        id
    }

    /// Instance `id` saw its cluster change to `members`.
    pub fn update(&self, id: u64, members: Vec<Member>) {
        let mut inner = self.lock();
        if let Some(instance) = inner.instances.iter_mut().find(|i| i.id == id) {
            instance.members = members;
        }
    }

    /// Instance `id` is gone, and its view with it (the last instance of a cluster takes
    /// the cluster's members with it).
    pub fn remove(&self, id: u64) {
        self.lock().instances.retain(|i| i.id != id);
    }

    /// The members of `cluster` every live instance of it agrees on (see the module doc), in
    /// the order of its oldest instance; `None` when no instance of `cluster` exists.
    pub fn members(&self, cluster: &str) -> Option<Vec<Member>> {
        let inner = self.lock();
        let mut views = inner.instances.iter().filter(|i| i.cluster == cluster);
        let first = views.next()?;
        let mut agreed: BTreeMap<&str, Health> = first
            .members
            .iter()
            .map(|m| (m.address.as_str(), m.health))
            .collect();
        for view in views {
            let seen: BTreeMap<&str, Health> = view
                .members
                .iter()
                .map(|m| (m.address.as_str(), m.health))
                .collect();
            agreed.retain(|address, health| match seen.get(address) {
                Some(h) => {
                    if severity(*h) > severity(*health) {
                        *health = *h;
                    }
                    true
                }
                None => false,
            });
        }
        Some(
            first
                .members
                .iter()
                .filter_map(|m| {
                    agreed.get(m.address.as_str()).map(|h| Member {
                        address: m.address.clone(),
                        health: *h,
                    })
                })
                .collect(),
        )
    }

    /// How many live instances `cluster` has (tests, diagnostics).
    pub fn instances(&self, cluster: &str) -> usize {
        self.lock()
            .instances
            .iter()
            .filter(|i| i.cluster == cluster)
            .count()
    }
}

/// Copies an Envoy string view.
///
/// # Safety
/// `buf` must be a view Envoy just produced and that is still valid.
unsafe fn owned(buf: &EnvoyBuffer) -> String {
    // SAFETY: per the contract; copied at once.
    String::from_utf8_lossy(unsafe { buf.as_bytes() }).into_owned()
}

/// The name of the cluster `lb` balances.
///
/// # Safety
/// `lb` must be a live `LbEnvoyPtr`, used on the thread that owns it.
pub unsafe fn cluster_name(lb: LbEnvoyPtr) -> String {
    let mut name = EnvoyBuffer::EMPTY;
    // SAFETY: per the contract; `name` is writable.
    unsafe { cb::envoy_dynamic_module_callback_lb_get_cluster_name(lb, &mut name) };
    // SAFETY: Envoy just filled `name`.
    unsafe { owned(&name) }
}

/// Every host of `lb`'s cluster, every priority, with its health (see the module doc).
///
/// # Safety
/// `lb` must be a live `LbEnvoyPtr`, used on the thread that owns it.
pub unsafe fn read_members(lb: LbEnvoyPtr) -> Vec<Member> {
    let mut members = Vec::new();
    // SAFETY (every call below): per the contract; each out-buffer is a writable local and
    // is copied before the next call.
    let priorities = unsafe { cb::envoy_dynamic_module_callback_lb_get_priority_set_size(lb) };
    for p in 0..priorities {
        let Ok(priority) = u32::try_from(p) else {
            break;
        };
        let healthy_count =
            unsafe { cb::envoy_dynamic_module_callback_lb_get_healthy_hosts_count(lb, priority) };
        let mut healthy = HashSet::with_capacity(healthy_count);
        for i in 0..healthy_count {
            let mut addr = EnvoyBuffer::EMPTY;
            if unsafe {
                cb::envoy_dynamic_module_callback_lb_get_healthy_host_address(
                    lb, priority, i, &mut addr,
                )
            } {
                healthy.insert(unsafe { owned(&addr) });
            }
        }
        let count = unsafe { cb::envoy_dynamic_module_callback_lb_get_hosts_count(lb, priority) };
        for i in 0..count {
            let mut addr = EnvoyBuffer::EMPTY;
            if !unsafe {
                cb::envoy_dynamic_module_callback_lb_get_host_address(lb, priority, i, &mut addr)
            } {
                continue;
            }
            let address = unsafe { owned(&addr) };
            let health = if healthy.contains(&address) {
                Health::Healthy
            } else if unsafe {
                cb::envoy_dynamic_module_callback_lb_get_host_health(lb, priority, i)
            } == HOST_HEALTH_DEGRADED
            {
                Health::Degraded
            } else {
                Health::Unhealthy
            };
            if !members.iter().any(|m: &Member| m.address == address) {
                members.push(Member { address, health });
            }
        }
    }
    members
}

/// `ip:port health, ...` for a log line.
pub fn describe(members: &[Member]) -> String {
    let parts: Vec<String> = members
        .iter()
        .map(|m| format!("{} {:?}", m.address, m.health))
        .collect();
    format!("[{}]", parts.join(", "))
}

/// The round robin of one instance's `choose_host`: the next healthy host of the first
/// priority that has any, as (priority, index among its healthy hosts).
///
/// # Safety
/// `lb` must be a live `LbEnvoyPtr`, used on the thread that owns it.
pub unsafe fn next_healthy(lb: LbEnvoyPtr, cursor: &mut usize) -> Option<(u32, u32)> {
    // SAFETY (both calls): per the contract.
    let priorities = unsafe { cb::envoy_dynamic_module_callback_lb_get_priority_set_size(lb) };
    for p in 0..priorities {
        let priority = u32::try_from(p).ok()?;
        let n =
            unsafe { cb::envoy_dynamic_module_callback_lb_get_healthy_hosts_count(lb, priority) };
        if n == 0 {
            continue;
        }
        let index = *cursor % n;
        *cursor = cursor.wrapping_add(1);
        return Some((priority, u32::try_from(index).ok()?));
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fake_envoy::FakeLb;

    fn member(address: &str, health: Health) -> Member {
        Member {
            address: address.into(),
            health,
        }
    }

    #[test]
    fn hosts_read_with_health_from_the_healthy_list_and_degraded_value() {
        let lb = FakeLb::new(
            "pool-0",
            vec![vec![
                ("10.0.0.1:80", true, 2),
                ("10.0.0.2:80", false, 1),
                ("10.0.0.3:80", false, 0),
            ]],
        );
        // SAFETY: a fake instance, alive for the test.
        let got = unsafe { read_members(lb.ptr()) };
        assert_eq!(
            got,
            vec![
                member("10.0.0.1:80", Health::Healthy),
                member("10.0.0.2:80", Health::Degraded),
                member("10.0.0.3:80", Health::Unhealthy),
            ]
        );
        // SAFETY: as above.
        assert_eq!(unsafe { cluster_name(lb.ptr()) }, "pool-0");
    }

    #[test]
    fn round_robin_cycles_the_healthy_hosts_of_the_first_priority_with_any() {
        let lb = FakeLb::new(
            "p",
            vec![
                vec![("10.0.0.9:80", false, 0)],
                vec![("10.0.0.1:80", true, 2), ("10.0.0.2:80", true, 2)],
            ],
        );
        let mut cursor = 0;
        // SAFETY: a fake instance, alive for the test.
        let picks: Vec<_> = (0..3)
            .map(|_| unsafe { next_healthy(lb.ptr(), &mut cursor) })
            .collect();
        assert_eq!(picks, vec![Some((1, 0)), Some((1, 1)), Some((1, 0))]);
        let none = FakeLb::new("q", vec![vec![("10.0.0.9:80", false, 0)]]);
        // SAFETY: as above.
        assert_eq!(unsafe { next_healthy(none.ptr(), &mut cursor) }, None);
    }

    #[test]
    fn a_late_instance_never_brings_back_a_removed_host_and_a_new_one_waits_for_all() {
        let (h1, h2, h3) = ("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80");
        let registry = Registry::new();
        let both = vec![member(h1, Health::Healthy), member(h2, Health::Healthy)];
        let main = registry.add("pool-a", both.clone());
        let worker = registry.add("pool-a", both.clone());
        let other = registry.add("pool-b", vec![member(h3, Health::Healthy)]);
        // EDS drops h2 and adds h3: the main thread applies it first.
        let newer = vec![member(h1, Health::Healthy), member(h3, Health::Healthy)];
        registry.update(main, newer.clone());
        assert_eq!(
            registry.members("pool-a"),
            Some(vec![member(h1, Health::Healthy)]),
            "h2 left with the first instance that dropped it; h3 waits for the worker"
        );
        // The worker reports the older list again (a late hook): h2 stays out.
        registry.update(worker, both.clone());
        assert_eq!(
            registry.members("pool-a"),
            Some(vec![member(h1, Health::Healthy)])
        );
        registry.update(worker, newer.clone());
        assert_eq!(registry.members("pool-a"), Some(newer.clone()));
        // Health: the worst any instance reports.
        registry.update(
            worker,
            vec![member(h1, Health::Degraded), member(h3, Health::Healthy)],
        );
        registry.update(
            main,
            vec![member(h1, Health::Healthy), member(h3, Health::Unhealthy)],
        );
        assert_eq!(
            registry.members("pool-a"),
            Some(vec![
                member(h1, Health::Degraded),
                member(h3, Health::Unhealthy)
            ])
        );
        // A destroyed instance's view no longer counts.
        registry.remove(main);
        assert_eq!(
            registry.members("pool-a"),
            Some(vec![
                member(h1, Health::Degraded),
                member(h3, Health::Healthy)
            ])
        );
        assert_eq!(
            registry.members("pool-b"),
            Some(vec![member(h3, Health::Healthy)]),
            "another cluster's instances are not part of the agreement"
        );
        registry.remove(worker);
        registry.remove(other);
        assert_eq!(registry.members("pool-a"), None);
    }

    #[test]
    fn instances_record_their_clusters_members_and_the_last_one_takes_them() {
        let registry = Registry::new();
        let a = registry.add("pool-a", vec![member("10.0.0.1:80", Health::Healthy)]);
        let b = registry.add("pool-a", vec![member("10.0.0.1:80", Health::Healthy)]);
        assert_eq!(registry.instances("pool-a"), 2);
        // A health change (the hook with nothing added or removed) replaces the members.
        registry.update(b, vec![member("10.0.0.1:80", Health::Unhealthy)]);
        assert_eq!(
            registry.members("pool-a"),
            Some(vec![member("10.0.0.1:80", Health::Unhealthy)])
        );
        assert_eq!(registry.members("pool-b"), None);
        registry.update(999, vec![]);
        registry.remove(a);
        assert!(registry.members("pool-a").is_some(), "one instance is left");
        registry.remove(b);
        assert_eq!(registry.members("pool-a"), None);
        assert_eq!(registry.instances("pool-a"), 0);
    }
}
