//! One owner among the VMs of a process, elected through a lease in compare-and-swap cells.
//!
//! The Wasm flavour keeps its process-wide work (the scraper, the picker state owner) in one
//! VM (a worker's, or the one Envoy runs on its main thread). No control plane installs a
//! singleton service for it (Istio applies no bootstrap extension), so the VMs of the
//! process elect that VM among themselves: the *lease* is one cell (proxy-wasm shared data)
//! holding the holder's id, an epoch and when the holder last renewed it. Every candidate
//! calls [`Election::tick`] from its timer:
//!
//! - the holder renews the lease (compare-and-swap on the version it read);
//! - a candidate takes a lease that is free, or that was not renewed for [`LEASE_TTL_MS`]
//!   (its holder died, was reloaded or stalled), with the epoch one higher;
//! - a candidate whose configuration differs from the holder's and was loaded after it
//!   takes the lease at once: a configuration update reaches the owner's work even where
//!   the old configuration's roots live on for a while (a listener update drains the old
//!   filter chains for Envoy's drain time before their roots end);
//! - a holder that finds the lease renewed by someone else (it stalled past the TTL, or a
//!   newer configuration took it) steps down; a holder that goes away gives the lease back
//!   ([`Election::resign`]) so the next tick of any other VM takes it at once.
//!
//! Where the owner's work runs matters for its cost: a pick answered in the worker's own VM
//! needs no message, while one answered elsewhere costs two cross-thread wake-ups. So every
//! candidate also announces itself on a *roster* (a second cell: its id, when it last
//! ticked, whether its VM serves requests), and a candidate whose VM serves requests
//! *claims* the lease ([`Election::claim_from_idle`]) when the roster shows exactly one
//! other candidate, which serves none and holds the lease: an Envoy with one worker, whose
//! idle main-thread VM would otherwise answer every pick of that worker by message. The
//! claimer waits [`CLAIM_SETTLE_MS`] after its first tick, so the roster holds every worker
//! (they start together), and calls it only while none of its requests is in flight at the
//! owner, so the
//! state the old owner kept (in-flight counts, flow-control queues) holds nothing of
//! anyone's; the old holder finds the lease renewed by another at its next tick and steps
//! down. With more workers (or more than one configuration during an update) nothing moves.
//!
//! Ticks only, never configuration: Envoy first runs each new configuration in a throwaway
//! canary VM, which never ticks, so it never holds the lease.
//!
//! The cell store may create a missing cell without a version check (proxy-wasm does): two
//! candidates that both found no cell may both believe they hold the lease for one tick. The
//! loser finds the version changed at its next renewal and steps down; nothing it did as
//! owner outlives that tick but answers its callers had already been sent (each owner
//! numbers its leases from its own epoch, so no answer is mistaken for another owner's).

use crate::quotas::{CasCells, CasWrite};

/// How long a lease lasts without renewal: after this, any candidate may take it over.
/// Renewal happens on every tick (tens of milliseconds), so only a dead or stalled holder
/// loses it; a failover completes within this plus one tick.
pub const LEASE_TTL_MS: u64 = 500;

/// How long a candidate stays on the roster after it last announced itself. Candidates
/// announce every [`LEASE_TTL_MS`] / 2 at their ticks; four times the lease's TTL keeps a
/// worker whose ticks run late under load on the roster (dropping it would let another
/// worker claim the lease while its requests are at the owner), and lets a candidate that
/// went away leave within two seconds.
pub const ROSTER_TTL_MS: u64 = 4 * LEASE_TTL_MS;

/// How long after its first tick a candidate may claim the lease: every VM of the process
/// announces itself at its first ticks, and the workers' VMs start together, so by then the
/// roster holds every worker. Claiming earlier, a worker of a four-worker Envoy could see
/// only the main-thread VM on the roster and take the lease into a VM that serves requests.
pub const CLAIM_SETTLE_MS: u64 = LEASE_TTL_MS;

/// How many candidates the roster keeps at most (more are not announced).
const ROSTER_MAX: usize = 256;

/// One candidate on the roster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// The candidate's id.
    pub id: u64,
    /// When it last announced itself (ms, the host's wall clock).
    pub seen_ms: u64,
    /// Whether its VM has served a request.
    pub serves: bool,
}

impl Member {
    const LEN: usize = 24;

    fn live(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.seen_ms) < ROSTER_TTL_MS
    }
}

/// The roster cell's bytes: 24 bytes a member (id, seen, flags), little-endian.
fn encode_roster(members: &[Member]) -> Vec<u8> {
    let mut out = Vec::with_capacity(members.len() * Member::LEN);
    for member in members {
        out.extend_from_slice(&member.id.to_le_bytes());
        out.extend_from_slice(&member.seen_ms.to_le_bytes());
        out.extend_from_slice(&u64::from(member.serves).to_le_bytes());
    }
    out
}

/// The members in `bytes`; a cell that is not a roster (another writer's) holds none.
fn decode_roster(bytes: &[u8]) -> Vec<Member> {
    if !bytes.len().is_multiple_of(Member::LEN) {
        return Vec::new();
    }
    bytes
        .chunks_exact(Member::LEN)
        .take(ROSTER_MAX)
        .map(|chunk| {
            let word = |i: usize| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&chunk[i..i + 8]);
                u64::from_le_bytes(b)
            };
            Member {
                id: word(0),
                seen_ms: word(8),
                serves: word(16) & 1 == 1,
            }
        })
        .collect()
}

/// The lease cell's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The holder's candidate id (0: nobody; the lease was given back).
    pub holder: u64,
    /// Incremented at every change of holder.
    pub epoch: u64,
    /// When the holder last renewed it (ms, the host's wall clock).
    pub renewed_ms: u64,
    /// The holder's configuration ([`Election::with_configuration`]).
    pub config: Configuration,
}

/// Which configuration a candidate runs, and when it was loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Configuration {
    /// A fingerprint of the configuration (0: unknown; never supersedes).
    pub fingerprint: u64,
    /// When the candidate loaded it (ms, the host's wall clock).
    pub loaded_ms: u64,
}

impl Configuration {
    /// Whether a candidate running `self` should take the lease from a holder running
    /// `held`: a different configuration, loaded later.
    fn supersedes(&self, held: &Configuration) -> bool {
        self.fingerprint != 0
            && self.fingerprint != held.fingerprint
            && self.loaded_ms > held.loaded_ms
    }
}

impl Lease {
    const LEN: usize = 40;

    /// The cell's bytes.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        let words = [
            self.holder,
            self.epoch,
            self.renewed_ms,
            self.config.fingerprint,
            self.config.loaded_ms,
        ];
        for (chunk, word) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The lease in `bytes`; `None` if they are not one (another writer's cell).
    pub fn decode(bytes: &[u8]) -> Option<Lease> {
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(i..i + 8)?.try_into().ok()?))
        };
        if bytes.len() != Self::LEN {
            return None;
        }
        Some(Lease {
            holder: word(0)?,
            epoch: word(8)?,
            renewed_ms: word(16)?,
            config: Configuration {
                fingerprint: word(24)?,
                loaded_ms: word(32)?,
            },
        })
    }

    /// A lease nobody holds.
    fn free(epoch: u64) -> Lease {
        Lease {
            holder: 0,
            epoch,
            renewed_ms: 0,
            config: Configuration::default(),
        }
    }

    fn expired(&self, now_ms: u64) -> bool {
        self.holder == 0 || now_ms.saturating_sub(self.renewed_ms) >= LEASE_TTL_MS
    }
}

/// What a tick found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// This candidate holds the lease of `epoch`; `since_now` when it took it this tick.
    Owner {
        /// The lease's epoch.
        epoch: u64,
        /// Taken over at this tick (start the owner's work).
        since_now: bool,
    },
    /// Another candidate holds the lease of `epoch` (or nobody does: `holder` 0).
    Follower {
        /// The holder's id.
        holder: u64,
        /// The lease's epoch.
        epoch: u64,
    },
}

/// One candidate's view of the election.
#[derive(Debug)]
pub struct Election {
    key: String,
    me: u64,
    config: Configuration,
    /// The epoch this candidate holds, if it does.
    held: Option<u64>,
    /// Whether this candidate's VM has served a request ([`Election::set_serves`]).
    serves: bool,
    /// The live roster as this candidate's last tick saw it, itself included.
    roster: Vec<Member>,
    /// When this candidate first ticked (it claims nothing for [`CLAIM_SETTLE_MS`] after).
    first_tick_ms: Option<u64>,
}

impl Election {
    /// Candidate `me` (non-zero, unique in the process: a random draw) for the lease in
    /// cell `key`.
    pub fn new(key: String, me: u64) -> Election {
        Election {
            key,
            me: me.max(1),
            config: Configuration::default(),
            held: None,
            serves: false,
            roster: Vec::new(),
            first_tick_ms: None,
        }
    }

    /// This candidate's VM serves requests (it announces so on the roster).
    pub fn set_serves(&mut self, serves: bool) {
        self.serves = serves;
    }

    fn roster_key(&self) -> String {
        format!("{}.roster", self.key)
    }

    /// Put this candidate on the roster at `now_ms` and keep the live members. The cell is
    /// written only when this candidate's entry is missing, half its life old, or wrong
    /// about `serves`; a refused write leaves the roster as read.
    fn announce<C: CasCells + ?Sized>(&mut self, cells: &C, now_ms: u64) {
        let key = self.roster_key();
        for _ in 0..4 {
            let (members, version) = match cells.load(&key) {
                Some((bytes, version)) => (decode_roster(&bytes), version),
                None => (Vec::new(), 0),
            };
            let fresh = members.iter().any(|m| {
                m.id == self.me
                    && m.serves == self.serves
                    && now_ms.saturating_sub(m.seen_ms) < LEASE_TTL_MS / 2
            });
            let mut live: Vec<Member> = members
                .into_iter()
                .filter(|m| m.live(now_ms) && (fresh || m.id != self.me))
                .collect();
            if fresh {
                self.roster = live;
                return;
            }
            if live.len() >= ROSTER_MAX {
                self.roster = live;
                return;
            }
            live.push(Member {
                id: self.me,
                seen_ms: now_ms,
                serves: self.serves,
            });
            match cells.store(&key, &encode_roster(&live), version) {
                CasWrite::Conflict => continue,
                CasWrite::Stored | CasWrite::Failed => {
                    self.roster = live;
                    return;
                }
            }
        }
    }

    /// The live roster as the last tick saw it (this candidate included).
    pub fn roster(&self) -> &[Member] {
        &self.roster
    }

    /// Take the lease at `now_ms` from a holder that serves no requests, when this candidate
    /// serves them and the roster holds exactly one other live candidate, that holder, running
    /// the same configuration (module doc). The caller has nothing in flight at the owner.
    /// The epoch taken, or `None` (nothing changed).
    pub fn claim_from_idle<C: CasCells + ?Sized>(&mut self, cells: &C, now_ms: u64) -> Option<u64> {
        if !self.serves || self.held.is_some() {
            return None;
        }
        // The roster may not hold every worker yet.
        let settled = self
            .first_tick_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= CLAIM_SETTLE_MS);
        if !settled {
            return None;
        }
        // The last tick's view rules most callers out without a read (several workers).
        if self.roster.iter().filter(|m| m.id != self.me).count() > 1 {
            return None;
        }
        let (roster, _) = cells.load(&self.roster_key())?;
        let others: Vec<Member> = decode_roster(&roster)
            .into_iter()
            .filter(|m| m.id != self.me && m.live(now_ms))
            .collect();
        let [other] = others.as_slice() else {
            return None;
        };
        let (bytes, version) = cells.load(&self.key)?;
        let held = Lease::decode(&bytes)?;
        let idle_holder = !other.serves && held.holder == other.id && !held.expired(now_ms);
        if !idle_holder || held.config.fingerprint != self.config.fingerprint {
            return None;
        }
        let next = Lease {
            holder: self.me,
            epoch: held.epoch.wrapping_add(1).max(1),
            renewed_ms: now_ms,
            config: self.config,
        };
        match cells.store(&self.key, &next.encode(), version) {
            CasWrite::Stored => {
                self.held = Some(next.epoch);
                Some(next.epoch)
            }
            CasWrite::Conflict | CasWrite::Failed => None,
        }
    }

    /// This candidate runs `config`: it takes the lease from a holder running an older,
    /// different one.
    pub fn with_configuration(mut self, config: Configuration) -> Election {
        self.config = config;
        self
    }

    /// This candidate's id.
    pub fn me(&self) -> u64 {
        self.me
    }

    /// Whether this candidate held the lease at its last tick.
    pub fn holds(&self) -> bool {
        self.held.is_some()
    }

    /// Renew, take or observe the lease at `now_ms`. A host that refuses the cell leaves
    /// the candidate a follower of nobody (it keeps no owner's work it cannot prove).
    pub fn tick<C: CasCells + ?Sized>(&mut self, cells: &C, now_ms: u64) -> Role {
        self.first_tick_ms.get_or_insert(now_ms);
        self.announce(cells, now_ms);
        for _ in 0..4 {
            let (current, version) = match cells.load(&self.key) {
                Some((bytes, version)) => (Lease::decode(&bytes), version),
                None => (None, 0),
            };
            let current = current.unwrap_or(Lease::free(0));
            let mine = current.holder == self.me && self.held == Some(current.epoch);
            let may_take = current.expired(now_ms) || self.config.supersedes(&current.config);
            if !mine && !may_take {
                self.held = None;
                return Role::Follower {
                    holder: current.holder,
                    epoch: current.epoch,
                };
            }
            let next = Lease {
                holder: self.me,
                epoch: if mine {
                    current.epoch
                } else {
                    current.epoch.wrapping_add(1).max(1)
                },
                renewed_ms: now_ms,
                config: self.config,
            };
            match cells.store(&self.key, &next.encode(), version) {
                CasWrite::Stored => {
                    self.held = Some(next.epoch);
                    return Role::Owner {
                        epoch: next.epoch,
                        since_now: !mine,
                    };
                }
                CasWrite::Conflict => continue,
                // A holder whose renewal the host refused still holds the lease it renewed
                // last, until that expires.
                CasWrite::Failed if mine && !current.expired(now_ms) => {
                    return Role::Owner {
                        epoch: current.epoch,
                        since_now: false,
                    };
                }
                CasWrite::Failed => break,
            }
        }
        self.held = None;
        Role::Follower {
            holder: 0,
            epoch: 0,
        }
    }

    /// Give the lease back if this candidate holds it (it is going away), so the next tick
    /// of another candidate takes it without waiting for [`LEASE_TTL_MS`].
    pub fn resign<C: CasCells + ?Sized>(&mut self, cells: &C) {
        let Some(epoch) = self.held.take() else {
            return;
        };
        let Some((bytes, version)) = cells.load(&self.key) else {
            return;
        };
        if Lease::decode(&bytes).is_some_and(|l| l.holder == self.me && l.epoch == epoch) {
            let _ = cells.store(&self.key, &Lease::free(epoch).encode(), version);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeCells;
    use std::sync::Arc;

    type Cells = Arc<FakeCells>;

    fn owner(role: Role) -> Option<u64> {
        match role {
            Role::Owner { epoch, .. } => Some(epoch),
            Role::Follower { .. } => None,
        }
    }

    #[test]
    fn the_first_ticker_takes_the_lease_and_the_others_follow_it() {
        let cells = Cells::default();
        let mut a = Election::new("k".into(), 1);
        let mut b = Election::new("k".into(), 2);
        assert_eq!(
            a.tick(&cells, 1000),
            Role::Owner {
                epoch: 1,
                since_now: true
            }
        );
        assert_eq!(
            b.tick(&cells, 1010),
            Role::Follower {
                holder: 1,
                epoch: 1
            }
        );
        // Renewals keep it, and are not a new takeover.
        for t in (1050..3000).step_by(50) {
            assert_eq!(
                a.tick(&cells, t),
                Role::Owner {
                    epoch: 1,
                    since_now: false
                }
            );
            assert_eq!(owner(b.tick(&cells, t + 1)), None);
        }
    }

    #[test]
    fn a_lease_not_renewed_for_its_ttl_is_taken_over_with_a_new_epoch() {
        let cells = Cells::default();
        let mut a = Election::new("k".into(), 1);
        let mut b = Election::new("k".into(), 2);
        assert_eq!(owner(a.tick(&cells, 1000)), Some(1));
        // a dies: b waits out the TTL, not a moment less.
        assert_eq!(owner(b.tick(&cells, 1000 + LEASE_TTL_MS - 1)), None);
        assert_eq!(
            b.tick(&cells, 1000 + LEASE_TTL_MS),
            Role::Owner {
                epoch: 2,
                since_now: true
            }
        );
        // a comes back from a stall: it finds the lease renewed by b and steps down.
        assert_eq!(
            a.tick(&cells, 1000 + LEASE_TTL_MS + 10),
            Role::Follower {
                holder: 2,
                epoch: 2
            }
        );
        assert!(!a.holds());
        assert!(b.holds());
    }

    #[test]
    fn a_resigned_lease_is_taken_at_the_next_tick_without_waiting() {
        let cells = Cells::default();
        let mut a = Election::new("k".into(), 1);
        let mut b = Election::new("k".into(), 2);
        assert_eq!(owner(a.tick(&cells, 1000)), Some(1));
        a.resign(&cells);
        assert_eq!(owner(b.tick(&cells, 1001)), Some(2));
        // Resigning what one does not hold changes nothing.
        a.resign(&cells);
        assert_eq!(owner(b.tick(&cells, 1002)), Some(2));
    }

    #[test]
    fn two_creators_of_the_cell_end_with_one_holder_within_a_tick() {
        let cells = Cells::default();
        let mut a = Election::new("k".into(), 1);
        let mut b = Election::new("k".into(), 2);
        // Both find no cell; both create it (no version check on creation).
        assert_eq!(owner(a.tick(&cells, 1000)), Some(1));
        assert_eq!(owner(b.tick(&cells, 1000)), None);
        // Even if both had written, the next renewals leave exactly one holder.
        let both = [a.tick(&cells, 1050), b.tick(&cells, 1050)];
        assert_eq!(both.iter().filter(|r| owner(**r).is_some()).count(), 1);
    }

    /// Cells whose writes the host refuses.
    struct Refusing<'a>(&'a Cells);

    impl CasCells for Refusing<'_> {
        fn load(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.0.load(key)
        }
        fn store(&self, _: &str, _: &[u8], _: u32) -> CasWrite {
            CasWrite::Failed
        }
    }

    #[test]
    fn a_refused_renewal_keeps_the_lease_until_it_expires() {
        let cells = Cells::default();
        let mut a = Election::new("k".into(), 1);
        assert_eq!(owner(a.tick(&cells, 1000)), Some(1));
        let refusing = Refusing(&cells);
        assert_eq!(owner(a.tick(&refusing, 1000 + LEASE_TTL_MS - 1)), Some(1));
        assert_eq!(owner(a.tick(&refusing, 1000 + LEASE_TTL_MS)), None);
        // A candidate that never held it cannot take it through a refusing host.
        let mut b = Election::new("k".into(), 2);
        assert_eq!(owner(b.tick(&refusing, 5000)), None);
    }

    #[test]
    fn a_foreign_or_torn_cell_is_treated_as_free() {
        let cells = Cells::default();
        let _ = cells.store("k", b"another plugin's bytes", 0);
        let mut a = Election::new("k".into(), 7);
        assert_eq!(owner(a.tick(&cells, 5)), Some(1));
        let lease = Lease {
            holder: 7,
            epoch: 9,
            renewed_ms: 123,
            config: Configuration {
                fingerprint: 5,
                loaded_ms: 6,
            },
        };
        assert_eq!(Lease::decode(&lease.encode()), Some(lease));
        assert_eq!(Lease::decode(&lease.encode()[..39]), None);
    }

    fn running(fingerprint: u64, loaded_ms: u64) -> Configuration {
        Configuration {
            fingerprint,
            loaded_ms,
        }
    }

    #[test]
    fn a_newer_configuration_takes_the_lease_at_once_and_the_old_holder_steps_down() {
        let cells = Cells::default();
        let mut old = Election::new("k".into(), 1).with_configuration(running(11, 100));
        let mut old_peer = Election::new("k".into(), 2).with_configuration(running(11, 100));
        assert_eq!(owner(old.tick(&cells, 1000)), Some(1));
        // The update: new roots with another configuration, loaded later, while the old
        // ones still tick (their listener drains).
        let mut new = Election::new("k".into(), 3).with_configuration(running(22, 900));
        let mut new_peer = Election::new("k".into(), 4).with_configuration(running(22, 901));
        assert_eq!(
            new.tick(&cells, 1010),
            Role::Owner {
                epoch: 2,
                since_now: true
            }
        );
        // The new configuration's other roots follow; so do the old ones, the old holder
        // included, and none of them takes it back.
        for t in (1020..3000).step_by(50) {
            assert_eq!(owner(new_peer.tick(&cells, t)), None);
            assert_eq!(owner(old.tick(&cells, t + 1)), None);
            assert_eq!(owner(old_peer.tick(&cells, t + 2)), None);
            assert_eq!(owner(new.tick(&cells, t + 3)), Some(2));
        }
        assert!(!old.holds());
    }

    #[test]
    fn the_same_configuration_loaded_later_does_not_take_the_lease() {
        let cells = Cells::default();
        let mut a = Election::new("k".into(), 1).with_configuration(running(11, 100));
        assert_eq!(owner(a.tick(&cells, 1000)), Some(1));
        // A VM restarted by FAIL_RELOAD loads the same configuration again; one that does
        // not know its configuration (0) never supersedes.
        let mut reloaded = Election::new("k".into(), 2).with_configuration(running(11, 900));
        let mut unknown = Election::new("k".into(), 3);
        for t in (1010..2000).step_by(50) {
            assert_eq!(owner(reloaded.tick(&cells, t)), None);
            assert_eq!(owner(unknown.tick(&cells, t + 1)), None);
            assert_eq!(owner(a.tick(&cells, t + 2)), Some(1));
        }
    }

    /// The main thread's VM (idle) and `workers` worker VMs that serve requests, all
    /// ticking once at `t`; the main one first, as it often does.
    fn tick_all(cells: &Cells, all: &mut [Election], t: u64) -> Vec<Option<u64>> {
        all.iter_mut()
            .enumerate()
            .map(|(i, e)| owner(e.tick(cells, t + i as u64)))
            .collect()
    }

    fn candidates(workers: usize) -> Vec<Election> {
        (0..=workers)
            .map(|i| {
                let mut e = Election::new("k".into(), 100 + i as u64);
                e.set_serves(i > 0);
                e
            })
            .collect()
    }

    #[test]
    fn the_one_worker_that_serves_requests_claims_the_lease_from_the_idle_main_vm() {
        let cells = Cells::default();
        let mut all = candidates(1);
        all[1].set_serves(false);
        tick_all(&cells, &mut all, 1000);
        assert!(all[0].holds());
        // Before its first request the worker claims nothing.
        assert_eq!(all[1].claim_from_idle(&cells, 1010), None);
        all[1].set_serves(true);
        // Nor before the roster has settled.
        assert_eq!(all[1].claim_from_idle(&cells, 1020), None);
        tick_all(&cells, &mut all, 1000 + CLAIM_SETTLE_MS);
        assert_eq!(
            all[1].claim_from_idle(&cells, 1010 + CLAIM_SETTLE_MS),
            Some(2)
        );
        assert!(all[1].holds());
        // The main VM finds the lease renewed by another at its next tick and steps down;
        // from then on the lease stays with the worker.
        for t in (1550..5000).step_by(50) {
            assert_eq!(tick_all(&cells, &mut all, t), vec![None, Some(2)]);
            assert_eq!(all[1].claim_from_idle(&cells, t + 5), None, "held already");
        }
        assert!(!all[0].holds());
    }

    #[test]
    fn with_more_workers_or_a_serving_holder_nothing_is_claimed() {
        for workers in [2, 4] {
            let cells = Cells::default();
            let mut all = candidates(workers);
            for t in (1000..2000).step_by(50) {
                tick_all(&cells, &mut all, t);
                for e in all.iter_mut().skip(1) {
                    assert_eq!(e.claim_from_idle(&cells, t + 10), None, "{workers} workers");
                }
                assert!(all[0].holds());
            }
        }
        // One worker holding the lease itself; or a main VM that serves (it never does, but
        // the rule is about serving, not threads).
        let cells = Cells::default();
        let mut all = candidates(1);
        all[0].set_serves(true);
        tick_all(&cells, &mut all, 1000);
        assert_eq!(all[1].claim_from_idle(&cells, 1010), None);
    }

    /// Four workers whose VMs tick a little after the first one's: the first sees only the
    /// main-thread VM on the roster at first, and must not claim then.
    #[test]
    fn a_worker_claims_nothing_before_the_others_are_on_the_roster() {
        let cells = Cells::default();
        let mut all = candidates(4);
        let _ = all[0].tick(&cells, 1000);
        let _ = all[1].tick(&cells, 1010);
        assert_eq!(
            all[1].roster().len(),
            2,
            "only the main VM and itself so far"
        );
        assert_eq!(all[1].claim_from_idle(&cells, 1015), None);
        for t in (1050..3000).step_by(50) {
            tick_all(&cells, &mut all, t);
            for e in all.iter_mut().skip(1) {
                assert_eq!(e.claim_from_idle(&cells, t + 10), None, "at {t}");
            }
        }
        assert!(all[0].holds());
    }

    #[test]
    fn a_candidate_that_stops_ticking_leaves_the_roster() {
        let cells = Cells::default();
        let mut all = candidates(2);
        tick_all(&cells, &mut all, 1000);
        tick_all(&cells, &mut all, 1050);
        assert_eq!(all[0].roster().len(), 3);
        assert_eq!(all[1].claim_from_idle(&cells, 1060), None, "two workers");
        // Worker 2 goes away (its root ended): it stays on the roster for its TTL, late
        // ticks included, and the remaining worker claims nothing meanwhile; then it is
        // off, and the remaining worker may claim.
        all.pop();
        let gone = 1050 + ROSTER_TTL_MS;
        for t in (1100..gone).step_by(50) {
            tick_all(&cells, &mut all, t);
            assert_eq!(all[1].claim_from_idle(&cells, t + 5), None, "at {t}");
        }
        for t in (gone..gone + 100).step_by(50) {
            tick_all(&cells, &mut all, t);
        }
        assert_eq!(all[0].roster().len(), 2);
        assert!(all[1].claim_from_idle(&cells, gone + 110).is_some());
    }

    #[test]
    fn a_claim_needs_the_same_configuration() {
        let cells = Cells::default();
        let mut main = Election::new("k".into(), 1).with_configuration(running(11, 100));
        let mut worker = Election::new("k".into(), 2).with_configuration(running(22, 50));
        worker.set_serves(true);
        assert!(owner(main.tick(&cells, 1000)).is_some());
        assert_eq!(owner(worker.tick(&cells, 1001)), None);
        assert_eq!(worker.claim_from_idle(&cells, 1002), None);
    }

    #[test]
    fn a_roster_cell_of_another_writer_reads_as_empty() {
        assert!(decode_roster(b"not a roster").is_empty());
        let members = [Member {
            id: 7,
            seen_ms: 9,
            serves: true,
        }];
        assert_eq!(decode_roster(&encode_roster(&members)), members);
    }
}
