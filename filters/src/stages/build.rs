//! The builder: one function per filter role turns the role's compiled configuration into
//! its pipeline. The stage sequence of every filter is written here once; the adapters
//! call these functions and never list stages.
//!
//! - [`router_pipeline`]: `auth → priority-band → [test stages] → route → quota → usage`,
//!   the tenancy stages (all but `route`) only with `tenantQuotas`;
//! - [`picker_pipeline`]: `[test stages] → pick`;
//! - [`gateway_pipeline`]: the router's stages, then the picker's, in one filter; the
//!   route stage then leaves its handoff in the request's context for the pick stage.
//!
//! What only an adapter knows comes in as values: where the quota buckets live (process
//! memory, or proxy-wasm shared data), where the router learns the block sizes of the
//! loaded picker pools, the picker state's [`PickerStore`], and the test stages its test
//! build accepts ([`TestStages`]). Each stage is boxed as the adapter keeps its stages
//! ([`StageBox`]: `dyn Stage<H>` on one thread, `dyn Stage<H> + Send + Sync` when every
//! worker thread shares them).
//!
//! A new stage is a file in this directory and one line here.

use std::sync::Arc;

use serde_json::Value;

use crate::host::{
    BodyBufferLimit, RequestWaker, ResponseChunk, ResponseHeaders, RouteRefresh, UsageRecordSink,
    VerifiedJwt,
};
use crate::picker::{PickerAccess, PickerHost};
use crate::pipeline::{Pipeline, Stage};
use crate::quotas::QuotaStore;
use crate::router::{BlockSizeSource, Router};
use crate::stats::{StatKey, StatKind};
use crate::tenants::Tenants;

use super::testing::{TestHost, TestStages};
use super::{
    tenancy::take_tenants, AuthStage, ExportStage, PickStage, PickerStore, QuotaStage, RouteStage,
    Tenancy, UsageStage,
};

/// Everything a host offers that some stage of a built pipeline uses: every capability
/// the router's, the picker's and the test stages ask for.
pub trait StageHost:
    PickerHost
    + RequestWaker
    + RouteRefresh
    + BodyBufferLimit
    + VerifiedJwt
    + UsageRecordSink
    + ResponseHeaders
    + ResponseChunk
{
}

impl<T> StageHost for T where
    T: PickerHost
        + RequestWaker
        + RouteRefresh
        + BodyBufferLimit
        + VerifiedJwt
        + UsageRecordSink
        + ResponseHeaders
        + ResponseChunk
        + ?Sized
{
}

/// The box an adapter keeps its stages in: `dyn Stage<H>`, or `dyn Stage<H> + Send + Sync`
/// for a pipeline that worker threads share. A stage is configuration shared by every
/// request, so every stage but the picker's (whose store is the adapter's) is `Send +
/// Sync`; the picker's is boxed through `From` (below), which asks of its store what the
/// box asks.
pub trait StageBox<H: ?Sized>: Stage<H> {
    /// `stage` in this box.
    fn boxed<T: Stage<H> + Send + Sync + 'static>(stage: T) -> Box<Self>;
}

impl<H: ?Sized> StageBox<H> for dyn Stage<H> {
    fn boxed<T: Stage<H> + Send + Sync + 'static>(stage: T) -> Box<Self> {
        Box::new(stage)
    }
}

impl<H: ?Sized> StageBox<H> for dyn Stage<H> + Send + Sync {
    fn boxed<T: Stage<H> + Send + Sync + 'static>(stage: T) -> Box<Self> {
        Box::new(stage)
    }
}

impl<H, P> From<PickStage<P>> for Box<dyn Stage<H>>
where
    H: PickerHost + RequestWaker + RouteRefresh + ?Sized,
    P: PickerStore + 'static,
{
    fn from(stage: PickStage<P>) -> Self {
        Box::new(stage)
    }
}

impl<H, P> From<PickStage<P>> for Box<dyn Stage<H> + Send + Sync>
where
    H: PickerHost + RequestWaker + RouteRefresh + ?Sized,
    P: PickerStore + Send + Sync + 'static,
{
    fn from(stage: PickStage<P>) -> Self {
        Box::new(stage)
    }
}

/// The router role's configuration, compiled: the body router, the tenancy when
/// `tenantQuotas` is configured, and the test stages.
#[derive(Debug)]
pub struct RouterRole {
    router: Arc<Router>,
    tenancy: Option<Arc<Tenancy>>,
    tests: TestStages,
}

impl RouterRole {
    /// Compiles a router config (JSON; a Wasm plugin's `role` already removed, the test
    /// stages already taken into `tests`). `quotas` makes the store of the tenants' buckets
    /// (asked only when tenants are configured); the router hashes its handoffs at the
    /// block sizes `block_sizes` reports.
    pub fn from_json(
        mut config: Value,
        tests: TestStages,
        quotas: impl FnOnce(&Tenants) -> Arc<dyn QuotaStore>,
        block_sizes: Arc<dyn BlockSizeSource>,
    ) -> Result<RouterRole, String> {
        let tenancy = take_tenants(&mut config)?.map(|tenants| {
            let store = quotas(&tenants);
            Tenancy::new(tenants, store)
        });
        let router = Router::from_json(config)
            .map_err(|e| e.to_string())?
            .with_block_sizes(block_sizes);
        Ok(RouterRole {
            router: Arc::new(router),
            tenancy,
            tests,
        })
    }

    /// The compiled router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Every stat key the role's stages emit with known labels, so a host can define them
    /// up front.
    pub fn stat_keys(&self) -> Vec<(StatKind, &StatKey)> {
        let mut keys = self.router.stat_keys();
        if let Some(tenancy) = &self.tenancy {
            keys.extend(tenancy.stat_keys());
        }
        keys
    }

    /// Whether the config listed test stages.
    pub fn has_test_stages(&self) -> bool {
        !self.tests.is_empty()
    }

    /// Push the role's stages; `picker_follows`: the pick stage runs later in the same
    /// pipeline.
    fn push<H, S>(self, stages: &mut Vec<Box<S>>, picker_follows: bool)
    where
        H: StageHost + ?Sized,
        S: StageBox<H> + ?Sized,
    {
        if let Some(tenancy) = &self.tenancy {
            stages.push(S::boxed(AuthStage::new(Arc::clone(tenancy))));
            stages.push(S::boxed(super::priority::PriorityBandStage::new(tenancy)));
        }
        stages.extend(self.tests.boxed::<H, S>());
        let route = RouteStage::new(self.router);
        stages.push(S::boxed(if picker_follows {
            route.before_pick_stage()
        } else {
            route
        }));
        if let Some(tenancy) = self.tenancy {
            stages.push(S::boxed(QuotaStage::new(tenancy)));
            stages.push(S::boxed(UsageStage));
        }
    }
}

/// The picker role's configuration: where its state lives (the adapter's store) and the
/// test stages.
#[derive(Debug)]
pub struct PickerRole<P> {
    store: P,
    tests: TestStages,
}

impl<P: PickerStore> PickerRole<P> {
    /// A picker over `store`, after the test stages `tests`.
    pub fn new(store: P, tests: TestStages) -> PickerRole<P> {
        PickerRole { store, tests }
    }

    /// The store the pick stage reaches the state through.
    pub fn store(&self) -> &P {
        &self.store
    }

    /// Whether the config listed test stages.
    pub fn has_test_stages(&self) -> bool {
        !self.tests.is_empty()
    }

    fn push<H, S>(self, stages: &mut Vec<Box<S>>)
    where
        H: StageHost + ?Sized,
        S: StageBox<H> + ?Sized,
        Box<S>: From<PickStage<P>>,
    {
        let plans = self
            .store
            .access()
            .map(|mut a| a.with_shared(|s| s.plans()));
        if let Some(export) = plans.and_then(ExportStage::new) {
            stages.push(S::boxed(export));
        }
        stages.extend(self.tests.boxed::<H, S>());
        stages.push(Box::from(PickStage::new(self.store)));
    }
}

/// The `router` filter's pipeline.
pub fn router_pipeline<H, S>(router: RouterRole) -> Pipeline<H, S>
where
    H: StageHost + ?Sized,
    S: StageBox<H> + ?Sized,
{
    let mut stages = Vec::new();
    router.push::<H, S>(&mut stages, false);
    Pipeline::new(stages)
}

/// The `picker` filter's pipeline.
pub fn picker_pipeline<H, S, P>(picker: PickerRole<P>) -> Pipeline<H, S>
where
    H: StageHost + ?Sized,
    S: StageBox<H> + ?Sized,
    P: PickerStore,
    Box<S>: From<PickStage<P>>,
{
    let mut stages = Vec::new();
    picker.push::<H, S>(&mut stages);
    Pipeline::new(stages)
}

/// The pipeline of one filter that routes and picks (the native `gateway` filter): the
/// router's stages, then the picker's.
pub fn gateway_pipeline<H, S, P>(router: RouterRole, picker: PickerRole<P>) -> Pipeline<H, S>
where
    H: StageHost + ?Sized,
    S: StageBox<H> + ?Sized,
    P: PickerStore,
    Box<S>: From<PickStage<P>>,
{
    let mut stages = Vec::new();
    router.push::<H, S>(&mut stages, true);
    picker.push::<H, S>(&mut stages);
    Pipeline::new(stages)
}

/// A pipeline of test stages alone: how an adapter's own tests drive a host capability
/// through its hooks.
pub fn test_pipeline<H, S>(tests: TestStages) -> Pipeline<H, S>
where
    H: TestHost + ?Sized,
    S: StageBox<H> + ?Sized,
{
    Pipeline::new(tests.boxed::<H, S>())
}
