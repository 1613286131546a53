//! The process-wide work of the Wasm flavour, run by the one VM the others elect: the
//! scraper and the picker state owner.
//!
//! Every picker root whose configuration carries a `scraper` is a candidate
//! ([`filters::election`](infergate_filters::election)): on each of its ticks it renews, takes
//! or observes the lease in the instance's shared data. The holder builds the scraper and
//! registers the owner's queue when it takes the lease, scrapes on its ticks and answers
//! every worker's picks; it drops both when it loses the lease and gives the lease back when
//! its root goes away (a configuration update, the VM's end). Nothing is done at
//! configuration: Envoy first configures a throwaway canary VM, which never ticks.
//!
//! A root whose configuration differs from the holder's and was loaded later takes the
//! lease at once: after an update delivered with the listener (Envoy Gateway, a bare
//! Envoy's LDS), the old filter chains drain for Envoy's drain time and their roots keep
//! ticking, so without this the old configuration's scraper would stay the owner's until
//! then. A VM restarted by `FAIL_RELOAD` while an old configuration still drains reloads it
//! too, and may hold the lease until the next newer root's tick takes it back.
//!
//! Where the work runs: on the elected VM's thread. Envoy also runs a VM of each plugin on
//! its main thread, which serves no request but ticks like the others and often ticks first.
//! With several workers it keeps the lease: the owner's work has that thread to itself
//! (`bench overhead` shows its CPU per request in the row "of which Envoy's main thread"),
//! answering every worker's picks by message (a queue wake-up per batch of messages) and
//! running the scrape rounds' callouts, while the workers only prepare their requests and
//! wait for the answer. With one worker, that worker is the only one that picks: once its
//! VM has served a request, it claims the lease from the main thread's VM at a moment none
//! of its requests is in flight (`filters::election`'s roster, counted in [`OWNER_CLAIMS`]),
//! and its picks are then answered in its own VM as they are made (`crate::owner`), with no
//! message and no wait.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use infergate_filters::election::{Configuration, Election, Role as ElectionRole};
use infergate_filters::host::{CalloutOutcome, CalloutToken, Stats};
use infergate_filters::scraper::Scraper;
use infergate_filters::stats::StatKey;
use serde_json::Value;

use crate::abi::LogLevel;
use crate::config::Names;
use crate::host::{log, SharedDataCells, VmShared, WasmHost};
use crate::owner::OwnerService;

/// Counter of lease takeovers by this process's VMs (each one a new owner).
pub const OWNER_TAKEOVERS: &str = "infergate.owner.takeovers";

/// Counter of leases the one worker that serves requests claimed from an idle holder.
pub const OWNER_CLAIMS: &str = "infergate.owner.claims";

/// How far apart the lease ids of two epochs' owners start (an owner issuing more leases
/// than this in its epoch would only make an old id look like one of its own).
const LEASE_IDS_PER_EPOCH: u64 = 1 << 40;

/// A candidate id for this root: random (the host's entropy, through std's hasher keys) and
/// mixed with the clock, so two VMs configured at the same instant still differ.
pub fn candidate_id() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(crate::abi::hostcalls::current_time_nanos().unwrap_or(0));
    hasher.finish().max(1)
}

/// The configuration a picker root loaded now: a fingerprint of its bytes (the picker's and
/// the scraper's) and the host's clock.
pub fn loaded_configuration(picker: &[u8], scraper: &Value) -> Configuration {
    use std::hash::{Hash, Hasher};
    // `DefaultHasher::new` has fixed keys: every VM of the process (one build of the
    // module) computes the same fingerprint for the same bytes.
    let mut hasher = std::hash::DefaultHasher::new();
    picker.hash(&mut hasher);
    scraper.to_string().hash(&mut hasher);
    Configuration {
        fingerprint: hasher.finish().max(1),
        loaded_ms: crate::abi::hostcalls::current_time_nanos().unwrap_or(0) / 1_000_000,
    }
}

thread_local! {
    /// Whether a root of this VM (a VM runs on one thread) holds the owner's lease.
    static SERVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether this VM has had a stream: a worker's, not the main thread's.
    static HAD_STREAM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This VM runs a stream: it is a worker's (the main thread's VM never gets one).
pub fn note_stream() {
    let _ = HAD_STREAM.try_with(|s| s.set(true));
}

fn had_stream() -> bool {
    HAD_STREAM.try_with(std::cell::Cell::get).unwrap_or(false)
}

/// Whether this VM runs the process-wide work now.
pub fn serving_here() -> bool {
    SERVING.try_with(std::cell::Cell::get).unwrap_or(false)
}

fn set_serving(on: bool) {
    let _ = SERVING.try_with(|s| s.set(on));
}

/// What the elected VM runs.
struct Serving {
    scraper: Box<Scraper>,
    /// Shared with this root's picker link, which hands it its own messages directly.
    owner: Option<Rc<RefCell<OwnerService>>>,
    next_scrape_ms: u64,
}

/// A picker root's candidacy for the process-wide work, and that work while it holds it.
pub struct Duty {
    election: Election,
    scraper_config: Value,
    owner_queue: String,
    interval_ms: u64,
    serving: Option<Serving>,
    takeovers: StatKey,
    claims: StatKey,
}

impl Duty {
    /// A candidate running `scraper_config` (checked now) when elected, under `names`;
    /// `me` is its random candidate id, `config` the configuration its root loaded (a
    /// different one loaded later takes the lease from it).
    pub fn new(
        names: &Names,
        scraper_config: Value,
        me: u64,
        config: Configuration,
    ) -> Result<Duty, String> {
        let scraper_config = admin_membership_by_default(scraper_config)?;
        let interval_ms = Scraper::from_json(scraper_config.clone())?.tick_period_ms();
        Ok(Duty {
            election: Election::new(names.owner_lease(), me).with_configuration(config),
            scraper_config,
            owner_queue: names.owner_queue(),
            interval_ms,
            serving: None,
            takeovers: StatKey::new(OWNER_TAKEOVERS, &[]),
            claims: StatKey::new(OWNER_CLAIMS, &[]),
        })
    }

    /// The scraper's interval: the root ticks at least this often.
    pub fn interval_ms(&self) -> u64 {
        self.interval_ms
    }

    /// One tick at `now_ms`: renew or take the lease (starting the work on a takeover,
    /// dropping it on a loss), then a scrape round when one is due and the owner's timer.
    /// Returns the lease's holder and epoch as this tick saw them.
    pub fn tick(&mut self, vm: &Rc<VmShared>, now_ms: u64) -> (u64, u64) {
        self.election.set_serves(had_stream());
        let role = self.election.tick(&SharedDataCells, now_ms);
        let seen = match role {
            ElectionRole::Owner { epoch, since_now } => {
                if since_now || self.serving.is_none() {
                    self.take_over(vm, epoch);
                }
                (self.election.me(), epoch)
            }
            ElectionRole::Follower { holder, epoch } => {
                if self.serving.take().is_some() {
                    set_serving(false);
                    // A VM that serves no requests loses it to the worker that claimed it.
                    let level = if had_stream() {
                        LogLevel::Warn
                    } else {
                        LogLevel::Info
                    };
                    log(
                        level,
                        &format!(
                            "infergate: this worker lost the owner's lease to {holder:016x} \
                             (epoch {epoch}): it no longer scrapes nor owns the picker state"
                        ),
                    );
                }
                (holder, epoch)
            }
        };
        if let Some(serving) = &mut self.serving {
            crate::test_stages::trap_owner_if_asked();
            let mut host = WasmHost::new(vm);
            if now_ms >= serving.next_scrape_ms {
                serving.next_scrape_ms = now_ms.saturating_add(self.interval_ms);
                serving.scraper.on_tick(&mut host);
            }
            // After the round, so a snapshot it published can lift saturation.
            if let Some(mut owner) = serving.owner.as_ref().and_then(|o| o.try_borrow_mut().ok()) {
                owner.on_tick(vm);
            }
        }
        seen
    }

    /// Claim the lease for this VM when it serves requests and the only other candidate is
    /// an idle holder (`Election::claim_from_idle`); the caller has no request in flight at
    /// the owner. The lease's holder and epoch if it did.
    pub fn claim(&mut self, vm: &Rc<VmShared>, now_ms: u64) -> Option<(u64, u64)> {
        self.election.set_serves(had_stream());
        let epoch = self.election.claim_from_idle(&SharedDataCells, now_ms)?;
        WasmHost::new(vm).counter_add(&self.claims, 1);
        log(
            LogLevel::Info,
            "infergate: this worker serves requests and the only other VM does not: it claims \
             the owner's lease, so its picks are answered here with no message",
        );
        self.take_over(vm, epoch);
        Some((self.election.me(), epoch))
    }

    fn take_over(&mut self, vm: &Rc<VmShared>, epoch: u64) {
        let mut scraper = match Scraper::from_json(self.scraper_config.clone()) {
            Ok(scraper) => scraper,
            Err(e) => {
                // Checked at configuration: not reached.
                log(
                    LogLevel::Critical,
                    &format!("infergate: scraper config: {e}"),
                );
                return;
            }
        };
        // Every scraper stat exists from the start (at 0), as in the native flavour.
        for (kind, key) in scraper.stat_keys() {
            vm.define_metric(key, kind);
        }
        // A previous owner's snapshot stays until this scraper has scraped every endpoint.
        if epoch > 1 {
            scraper.hold_first_publish();
        }
        let first_lease = epoch.wrapping_mul(LEASE_IDS_PER_EPOCH);
        let owner = OwnerService::register(&self.owner_queue, first_lease)
            .map(|owner| Rc::new(RefCell::new(owner)));
        WasmHost::new(vm).counter_add(&self.takeovers, 1);
        log(
            LogLevel::Info,
            &format!(
                "infergate: this worker took the owner's lease (epoch {epoch}): it scrapes and \
                 owns the picker state of every worker"
            ),
        );
        self.serving = Some(Serving {
            scraper: Box::new(scraper),
            owner,
            next_scrape_ms: 0,
        });
        set_serving(true);
    }

    /// `proxy_on_queue_ready` for the owner's queue; false if `queue` is not this duty's.
    pub fn on_queue_ready(&mut self, vm: &Rc<VmShared>, queue: u32) -> bool {
        let Some(owner) = self.serving.as_ref().and_then(|s| s.owner.as_ref()) else {
            return false;
        };
        let Ok(mut owner) = owner.try_borrow_mut() else {
            return false;
        };
        if owner.queue() != queue {
            return false;
        }
        owner.on_queue_ready(vm, queue);
        true
    }

    /// The picker state owner while this duty holds the lease (`Weak::new()` otherwise).
    pub fn local_owner(&self) -> Weak<RefCell<OwnerService>> {
        self.serving
            .as_ref()
            .and_then(|s| s.owner.as_ref())
            .map(Rc::downgrade)
            .unwrap_or_default()
    }

    /// The scraper of the serving duty, to deliver a callout's answer to.
    pub fn scraper_mut(&mut self) -> Option<&mut Scraper> {
        self.serving.as_mut().map(|s| s.scraper.as_mut())
    }

    /// Deliver a callout answer to the serving scraper (dropped when this VM no longer
    /// serves).
    pub fn on_callout_done(
        &mut self,
        vm: &Rc<VmShared>,
        token: CalloutToken,
        outcome: CalloutOutcome,
    ) {
        if let Some(serving) = &mut self.serving {
            let mut host = WasmHost::new(vm);
            serving.scraper.on_callout_done(&mut host, token, outcome);
        }
    }
}

impl Drop for Duty {
    fn drop(&mut self) {
        // The next tick of another VM takes it at once instead of after the lease's TTL.
        if self.serving.take().is_some() {
            set_serving(false);
        }
        self.election.resign(&SharedDataCells);
    }
}

/// The scraper's config with membership mode `admin` when it follows clusters and names
/// no mode: proxy-wasm cannot see a cluster's hosts (see `crate::host`), so the admin
/// callout is the only way here, and mode `host` is refused by name.
pub fn admin_membership_by_default(mut rest: Value) -> Result<Value, String> {
    let Some(object) = rest.as_object_mut() else {
        return Ok(rest);
    };
    let follows = object
        .get("clusters")
        .and_then(Value::as_array)
        .is_some_and(|c| !c.is_empty());
    match object.get("membership").and_then(Value::as_str) {
        Some("host") if follows => Err("scraper config: membership: `host` is not possible in \
                                        proxy-wasm, which cannot see a cluster's hosts; use \
                                        `admin` (the default here)"
            .to_owned()),
        None if follows => {
            object.insert("membership".to_owned(), Value::from("admin"));
            Ok(rest)
        }
        _ => Ok(rest),
    }
}
