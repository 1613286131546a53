//! The root context: reads the plugin configuration and builds the role: a filter role's
//! request pipeline (the filters crate's builder makes the router's or the picker's from
//! the role's configuration; the picker's store holds its link to the process's picker
//! state owner, `crate::owner`), and a picker's candidacy for the
//! process-wide work (`crate::elected`: the scraper and the state owner, run by the one
//! worker VM the candidates elect). It creates the HTTP contexts, runs the ticks (election,
//! scrape rounds, owner timeouts and lease give-backs) and callout responses, and hands
//! queue messages to the owner or the link.
//!
//! The scraper follows clusters by Envoy's admin (`membership: admin`, the default here
//! when `clusters` is given; `host` is refused: see `crate::host`). Its admin callout is
//! one more callout of this root, answered through the same callback as the scrapes.
//!
//! The scraper survives its own failures: Envoy re-arms the tick timer whatever a tick
//! does, and nothing on the tick or callout path can panic (hostcall failures are values,
//! the scraper state is owned here, not behind a `RefCell`). A callout the host refuses, fails,
//! answers without headers or with an unreadable status or body counts as one failed scrape
//! of its endpoint (`infergate.scraper.scrapes.…result.failed`, and the endpoint's
//! `consecutive_failures` gauge); a callout never answered expires after twice its
//! timeout, so no endpoint stays "outstanding" forever and the next round scrapes it again.
//!
//! When the router and the picker roots of one worker share a VM, their configs meet here:
//! [`LOADED`] holds what each configured root declares, and a picker that leaves a loaded
//! router's base model without a pool is refused at configuration, as in the native flavour.
//! They may also run in different VMs (Istio gives each `WasmPlugin` its own): the router
//! then hands its parse over without the picker's block size, and the picker hashes the
//! prompt itself.

use std::cell::RefCell;
use std::rc::Rc;

use infergate_filters::consistency::{ConfigId, LoadedConfigs, PickerDeclaration};
use infergate_filters::host::{CalloutOutcome, CalloutToken};
use infergate_filters::picker::PickerShared;
use infergate_filters::router::{BlockSizeSource, Router};
use infergate_filters::scraper::Scraper;

use crate::abi::{hostcalls, BufferType, HttpHooks, LogLevel, MapType};
use crate::config::{self, Names, PluginConfig, RoleKind, DEFAULT_SNAPSHOT_KEY};
use crate::elected::Duty;
use crate::host::{log, SharedDataCells, VmShared, WasmHost, METRICS_FLUSH_MS};

use crate::http::{FailClosedContext, HeadersContext, HeadersMode, PipelineContext, WasmPipeline};
use crate::owner::{Link, WasmPickerStore, WorkerLink, TIMEOUT_TICK_MS};
use crate::test_stages;
use infergate_filters::host::Clock;
use infergate_filters::quotas::{CasQuotas, QuotaStore};
use infergate_filters::stages::{picker_pipeline, router_pipeline, PickerRole, RouterRole};
use infergate_filters::tenants::Tenants;
use scheduler_core::types::Millis;
use std::sync::Arc;

/// What this module instance runs, with its per-VM state.
enum Role {
    /// A gateway filter (body router or picker): the pipeline its requests run through, a
    /// picker's link to the process's state owner, and its candidacy for the process-wide
    /// work when it carries the scraper.
    Filter {
        pipeline: Rc<WasmPipeline>,
        link: Option<Link>,
        duty: Option<Box<Duty>>,
        mode: HeadersMode,
    },
    /// Applies the router's header edits (see `crate::config`).
    Headers,
    /// Holds and reads each request's body, nothing else (`crate::probe`; bench builds).
    #[cfg(feature = "probe")]
    Probe,
}

thread_local! {
    /// The configs of this VM's roots (a VM runs on one thread).
    static LOADED: RefCell<LoadedConfigs> = const { RefCell::new(LoadedConfigs::new()) };
}

/// The block sizes of the loaded picker pools, for the router's handoffs
/// (`blockSizeTokens` is configured once, in the picker): this VM's pickers, else what a
/// picker of the instance declared in shared data (the router and the picker may run in
/// different VMs, as Istio's `WasmPlugin`s do).
struct VmBlockSizes(Names);

impl BlockSizeSource for VmBlockSizes {
    fn block_size_tokens(&self, base_model: &str) -> Option<u32> {
        LOADED
            .try_with(|l| l.try_borrow().ok()?.block_size_tokens(base_model))
            .ok()
            .flatten()
            .or_else(|| {
                let (bytes, _) = hostcalls::get_shared_data(&self.0.block_size(base_model))
                    .ok()
                    .flatten()?;
                Some(u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?))
            })
    }
}

/// Declare `shared`'s block sizes per base model in shared data, for routers in other VMs.
fn declare_block_sizes(names: &Names, shared: &PickerShared) {
    for pool in PickerDeclaration::of(&shared.plans()).pools {
        if let Some(size) = pool.block_size_tokens {
            let key = names.block_size(&pool.base_model);
            let _ = hostcalls::set_shared_data(&key, &size.to_le_bytes(), 0);
        }
    }
}

/// A root's entry in [`LOADED`], removed when the root is reconfigured or dropped.
struct Registration(ConfigId);

impl Registration {
    fn router(router: &Router) -> Registration {
        let bases = router
            .base_models()
            .into_iter()
            .map(str::to_owned)
            .collect();
        Registration(LOADED.with(|l| l.borrow_mut().add_router(bases)))
    }

    fn picker(shared: &PickerShared) -> Result<Registration, String> {
        let declaration = PickerDeclaration::of(&shared.plans());
        LOADED
            .with(|l| l.borrow_mut().add_picker(declaration))
            .map(Registration)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        LOADED.with(|l| l.borrow_mut().remove(self.0));
    }
}

/// The root context of every role.
pub struct Root {
    context_id: u32,
    vm: Rc<VmShared>,
    role: Option<Role>,
    _registration: Option<Registration>,
}

impl Root {
    /// A root context before configuration.
    pub fn new(context_id: u32) -> Self {
        Root {
            context_id,
            vm: Rc::new(VmShared::new(
                DEFAULT_SNAPSHOT_KEY.to_owned(),
                u64::from(context_id),
            )),
            role: None,
            _registration: None,
        }
    }

    fn configure(&mut self, cfg: PluginConfig) -> Result<(), String> {
        self.vm = Rc::new(VmShared::new(
            cfg.snapshot_key.clone(),
            u64::from(self.context_id),
        ));
        // The old config leaves the registry before the new one is checked against it.
        self._registration = None;
        self.role = Some(match cfg.role {
            RoleKind::Router => {
                let mut rest = cfg.rest;
                let tests = test_stages::take(&mut rest)?;
                let vm = &self.vm;
                let role = RouterRole::from_json(
                    rest,
                    tests,
                    |tenants| quota_cells(tenants, &cfg.names, WasmHost::new(vm).now()),
                    Arc::new(VmBlockSizes(cfg.names.clone())),
                )?;
                self._registration = Some(Registration::router(role.router()));
                Role::Filter {
                    pipeline: Rc::new(router_pipeline(role)),
                    link: None,
                    duty: None,
                    mode: if cfg.stop_at_headers {
                        HeadersMode::Stop
                    } else {
                        HeadersMode::Pass
                    },
                }
            }
            RoleKind::Picker => {
                let mut rest = cfg.rest;
                let tests = test_stages::take(&mut rest)?;
                // What the owner is sent: the state is named by these bytes, the same in
                // every worker of the plugin.
                let config_bytes = serde_json::to_vec(&rest).unwrap_or_default();
                let shared = PickerShared::from_json(rest).map_err(|e| e.to_string())?;
                if shared.has_precise() {
                    // Its index is fed by a thread following every engine's KV events, which
                    // a Wasm VM cannot run: refused rather than silently never matching.
                    return Err("picker config: precise-prefix-cache-producer needs the \
                                native flavour (the Envoy dynamic module); the Wasm flavour \
                                keeps approx-prefix-cache-producer"
                        .into());
                }
                self._registration = Some(Registration::picker(&shared)?);
                declare_block_sizes(&cfg.names, &shared);
                let duty = match cfg.scraper {
                    Some(scraper) => {
                        let loaded = crate::elected::loaded_configuration(&config_bytes, &scraper);
                        Some(Box::new(Duty::new(
                            &cfg.names,
                            scraper,
                            crate::elected::candidate_id(),
                            loaded,
                        )?))
                    }
                    None => None,
                };
                let link = WorkerLink::new(&self.vm, &cfg.names, config_bytes);
                // The election and the scrape rounds tick at the scraper's interval; test
                // stages tick faster already, which serves them and the link's timeouts.
                let period = duty.as_ref().map_or(u64::from(TIMEOUT_TICK_MS), |d| {
                    d.interval_ms().min(u64::from(TIMEOUT_TICK_MS))
                });
                if (link.is_some() || duty.is_some()) && tests.is_empty() {
                    // Ticking, this root flushes its requests' counters and gauges, at
                    // least every `METRICS_FLUSH_MS`.
                    let period = u32::try_from(period)
                        .unwrap_or(TIMEOUT_TICK_MS)
                        .clamp(1, METRICS_FLUSH_MS);
                    hostcalls::set_tick_period_ms(period)
                        .map_err(|s| format!("set_tick_period failed: {s:?}"))?;
                    self.vm.buffer_metrics();
                }
                let store = WasmPickerStore::new(shared, link.clone());
                let role = PickerRole::new(store, tests);
                Role::Filter {
                    pipeline: Rc::new(picker_pipeline(role)),
                    link,
                    duty,
                    mode: if cfg.stop_at_headers {
                        HeadersMode::Stop
                    } else {
                        HeadersMode::HandoffOnly
                    },
                }
            }
            RoleKind::Headers => Role::Headers,
            #[cfg(feature = "probe")]
            RoleKind::Probe => Role::Probe,
        });
        Ok(())
    }
}

/// The quota buckets of `tenants` in the process's shared data (every worker's VM of this
/// `vm_id` sees the same cells), each cell created now if absent.
impl Drop for Root {
    fn drop(&mut self) {
        // The root is deleted (its plugin replaced or removed): what its streams counted
        // goes to Envoy now, and from then on at once.
        self.vm.stop_buffering();
    }
}

fn quota_cells(tenants: &Tenants, names: &Names, now: Millis) -> Arc<dyn QuotaStore> {
    let store = Arc::new(CasQuotas::new(SharedDataCells, &names.quota_prefix()));
    for (_, tenant) in tenants.iter() {
        for limit in &tenant.limits {
            store.ensure(&limit.bucket_key, &limit.limits, now);
        }
    }
    store
}

impl Root {
    /// `proxy_on_http_call_response` of a callout this root dispatched.
    pub fn on_http_call_response(&mut self, token_id: u32, num_headers: usize, body_size: usize) {
        let Some(Role::Filter {
            duty: Some(duty), ..
        }) = &mut self.role
        else {
            return;
        };
        let token = CalloutToken(u64::from(token_id));
        let Some(scraper) = duty.scraper_mut() else {
            return;
        };
        let outcome = callout_outcome(scraper, token, num_headers, body_size);
        duty.on_callout_done(&self.vm, token, outcome);
    }

    /// Hands the counter and gauge updates of this root and its streams to Envoy (the
    /// exports call it at the end of each of the root's ticks and callout answers; see
    /// `VmShared::buffer_metrics`).
    pub fn flush_metrics(&self) {
        self.vm.flush_metrics();
    }

    /// `proxy_on_configure`: false refuses the configuration (logged at critical).
    pub fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match config::parse(&bytes).and_then(|cfg| self.configure(cfg)) {
            Ok(()) => true,
            Err(e) => {
                log(LogLevel::Critical, &format!("infergate: {e}"));
                self.role = None;
                self._registration = None;
                false
            }
        }
    }

    /// `proxy_on_tick`: a candidate's election round (and, elected, a scrape round when due
    /// and the owner's flow-control timer: TTLs, and dispatches a new snapshot allows); a
    /// picker's link learns who owns the state, gives up on overdue answers (their streams
    /// are woken to pick locally) and gives ended requests' leases back, or says it lives;
    /// test builds also fire due test wakes.
    pub fn on_tick(&mut self) {
        test_stages::fire_due();
        let Some(Role::Filter { link, duty, .. }) = &mut self.role else {
            return;
        };
        let now = hostcalls::current_time_nanos().unwrap_or(0) / 1_000_000;
        let owner = duty.as_mut().map(|duty| duty.tick(&self.vm, now));
        if let Some(link) = link {
            if let Ok(mut link) = link.try_borrow_mut() {
                if let Some(duty) = duty {
                    link.set_local_owner(duty.local_owner());
                }
                if let Some((holder, epoch)) = owner {
                    link.observe_owner(holder, epoch, now);
                }
                link.expire(now);
                link.on_tick(now);
            }
        }
        self.claim_if_idle();
    }

    /// Claim the owner's lease for this VM when it may (`Duty::claim`: one worker, the only
    /// other candidate idle), and only while none of its link's requests is at the owner, so
    /// the old owner's state holds nothing of them. The link then talks to the owner here.
    fn claim_if_idle(&mut self) {
        let Some(Role::Filter {
            link: Some(link),
            duty: Some(duty),
            ..
        }) = &mut self.role
        else {
            return;
        };
        let Ok(mut link) = link.try_borrow_mut() else {
            return;
        };
        if !link.idle() {
            return;
        }
        let now = hostcalls::current_time_nanos().unwrap_or(0) / 1_000_000;
        if let Some((holder, epoch)) = duty.claim(&self.vm, now) {
            link.set_local_owner(duty.local_owner());
            link.observe_owner(holder, epoch, now);
        }
    }

    /// `proxy_on_queue_ready`: the owner answers the workers' messages; a picker takes the
    /// answers that arrived and wakes their streams.
    pub fn on_queue_ready(&mut self, queue: u32) {
        let Some(Role::Filter { link, duty, .. }) = &mut self.role else {
            return;
        };
        if duty
            .as_mut()
            .is_some_and(|duty| duty.on_queue_ready(&self.vm, queue))
        {
            return;
        }
        if let Some(link) = link {
            if let Ok(mut link) = link.try_borrow_mut() {
                if link.is_reply_queue(queue) {
                    link.receive();
                }
            }
        }
    }

    /// The HTTP context of a new stream on this plugin.
    pub fn create_http_context(&mut self, context_id: u32) -> Box<dyn HttpHooks> {
        crate::elected::note_stream();
        self.claim_if_idle();
        let vm = Rc::clone(&self.vm);
        match &self.role {
            Some(Role::Filter { pipeline, mode, .. }) => Box::new(PipelineContext::new(
                vm,
                Rc::clone(pipeline),
                context_id,
                *mode,
            )),
            Some(Role::Headers) => Box::new(HeadersContext),
            #[cfg(feature = "probe")]
            Some(Role::Probe) => Box::<crate::probe::ProbeContext>::default(),
            None => Box::new(FailClosedContext::new(vm)),
        }
    }
}

/// How the callout being delivered ended. A failed or timed-out call arrives without
/// headers (Envoy then answers any read of the response map with `BadArgument`); a status
/// or body the host cannot hand over makes the scrape a failure rather than a guess. A page
/// longer than the scraper's limit is never copied into the VM (its memory never shrinks).
fn callout_outcome(
    scraper: &Scraper,
    token: CalloutToken,
    num_headers: usize,
    body_size: usize,
) -> CalloutOutcome {
    if num_headers == 0 {
        return CalloutOutcome::Failed;
    }
    let status = hostcalls::header_map_value(MapType::HttpCallResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok());
    let Some(status) = status else {
        return CalloutOutcome::Failed;
    };
    let mut unreadable = false;
    let outcome = scraper.callout_outcome_for(token, status, body_size, || {
        match hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size) {
            Ok(body) => body.unwrap_or_default(),
            Err(_) => {
                unreadable = true;
                Vec::new()
            }
        }
    });
    if unreadable {
        CalloutOutcome::Failed
    } else {
        outcome
    }
}
