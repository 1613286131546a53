//! The `router` filter's config: a pipeline of the body router stage
//! ([`infergate_filters::stages::RouteStage`]), run by `crate::pipeline`; with tenants
//! configured, `auth → route → quota → usage` (see `infergate_filters::stages::tenancy`),
//! the quota buckets in the process's memory.
//!
//! Config: the Wasm flavour's router JSON (`{"bodyLimitBytes": ..., "pools": [...],
//! "tenantQuotas": [...]}`; a `role` field, which the Wasm module uses to pick its part, is
//! accepted and ignored).

use std::sync::Arc;

use infergate_filters::quotas::MemoryQuotas;
use infergate_filters::router::Router;
use infergate_filters::stages::tenancy::take_tenants;
use infergate_filters::stages::{AuthStage, QuotaStage, RouteStage, Tenancy, UsageStage};

use crate::filter::FilterConfigHandle;
use crate::pipeline::{compose, take_test_stages, ConfigPart, NativeStage, PipelineFactory};
use infergate_filters::stats::{StatKey, StatKind};

/// Parses a filter config, dropping the Wasm-only `role` field.
pub fn config_json(config: &[u8]) -> Result<serde_json::Value, String> {
    let text = if config.is_empty() {
        b"{}".as_slice()
    } else {
        config
    };
    let mut value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("config is not JSON: {e}"))?;
    if let Some(map) = value.as_object_mut() {
        map.remove("role");
    }
    Ok(value)
}

/// A router config compiled: its stages and their stat keys, and the registration that
/// lives as long as the config. The `router` filter runs these alone; the `gateway` filter
/// (`crate::gateway`) runs them before the picker's.
pub struct RouterParts {
    router: Arc<Router>,
    tenancy: Option<Arc<Tenancy>>,
    test_stages: Vec<NativeStage>,
    registration: crate::shared::Registration,
    /// Whether the picker's stages follow in the same pipeline (the `gateway` filter).
    picker_follows: bool,
}

impl RouterParts {
    /// Compiles a router config (the JSON `value`, its `role` already removed).
    pub fn from_json(mut value: serde_json::Value) -> Result<RouterParts, String> {
        let tenancy = take_tenants(&mut value)?.map(|t| Tenancy::new(t, MemoryQuotas::process()));
        let test_stages = take_test_stages(&mut value)?;
        let router = Router::from_json(value)
            .map_err(|e| e.to_string())?
            .with_block_sizes(Arc::new(crate::shared::ProcessBlockSizes));
        let bases = router
            .base_models()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let registration = crate::shared::config_registry().register_router(bases);
        Ok(RouterParts {
            router: Arc::new(router),
            tenancy,
            test_stages,
            registration,
            picker_follows: false,
        })
    }

    /// The same parts for a pipeline whose picker stages follow them: the route stage
    /// passes its handoff in the request's context instead of Envoy's filter state.
    pub fn before_picker(self) -> RouterParts {
        RouterParts {
            picker_follows: true,
            ..self
        }
    }
}

impl ConfigPart for RouterParts {
    fn stat_keys(&self) -> Vec<(StatKind, &StatKey)> {
        let mut keys = self.router.stat_keys();
        if let Some(tenancy) = &self.tenancy {
            keys.extend(tenancy.stat_keys());
        }
        keys
    }

    /// `auth`, the test stages, `route`, `quota`, `usage` (tenancy's only with tenants).
    fn into_stages(self: Box<Self>) -> (Vec<NativeStage>, crate::shared::Registration) {
        let mut stages: Vec<NativeStage> = Vec::new();
        if let Some(tenancy) = &self.tenancy {
            stages.push(Box::new(AuthStage::new(Arc::clone(tenancy))));
        }
        stages.extend(self.test_stages);
        let route = RouteStage::new(self.router);
        stages.push(Box::new(if self.picker_follows {
            route.before_pick_stage()
        } else {
            route
        }));
        if let Some(tenancy) = self.tenancy {
            stages.push(Box::new(QuotaStage::new(Arc::clone(&tenancy))));
            stages.push(Box::new(UsageStage));
        }
        (stages, self.registration)
    }
}

/// The `router` filter's config from its JSON bytes.
pub fn factory(config: &[u8], envoy: &mut FilterConfigHandle) -> Result<PipelineFactory, String> {
    let part = RouterParts::from_json(config_json(config)?)?;
    Ok(compose(envoy, vec![Box::new(part)]))
}
