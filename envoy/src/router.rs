//! The `router` filter's config: the router role of the filters crate's builder
//! (`infergate_filters::stages::build`: the body router, and the tenancy stages around it
//! when tenants are configured), its quota buckets in the process's memory, run by
//! `crate::pipeline`.
//!
//! Config: the Wasm flavour's router JSON (`{"bodyLimitBytes": ..., "pools": [...],
//! "tenantQuotas": [...]}`; a `role` field, which the Wasm module uses to pick its part, is
//! accepted and ignored).

use std::sync::Arc;

use infergate_filters::quotas::{MemoryQuotas, QuotaStore};
use infergate_filters::stages::{router_pipeline, RouterRole};

use crate::filter::FilterConfigHandle;
use crate::pipeline::{host_config, take_test_stages, PipelineFactory};
use crate::shared::{config_registry, ProcessBlockSizes, Registration};

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

/// Compiles a router config (the JSON `value`, its `role` already removed) into the
/// builder's router role, and registers its base models for as long as the returned
/// registration lives.
pub fn role(mut value: serde_json::Value) -> Result<(RouterRole, Registration), String> {
    let tests = take_test_stages(&mut value)?;
    let role = RouterRole::from_json(
        value,
        tests,
        |_| -> Arc<dyn QuotaStore> { MemoryQuotas::process() },
        Arc::new(ProcessBlockSizes),
    )?;
    let bases = role
        .router()
        .base_models()
        .into_iter()
        .map(str::to_owned)
        .collect();
    let registration = config_registry().register_router(bases);
    Ok((role, registration))
}

/// The `router` filter's config from its JSON bytes.
pub fn factory(config: &[u8], envoy: &mut FilterConfigHandle) -> Result<PipelineFactory, String> {
    let (role, registration) = role(config_json(config)?)?;
    let host = host_config(envoy, &role.stat_keys());
    Ok(PipelineFactory::new(
        router_pipeline(role),
        host,
        vec![Box::new(registration)],
    ))
}
