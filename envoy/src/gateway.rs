//! The `gateway` filter's config: the router role and the picker role in one Envoy HTTP
//! filter, one pipeline (the filters crate's `gateway_pipeline`: the router's stages, then
//! the picker's).
//!
//! The two-filter form (`router`, then `picker`) exists so that another filter can run
//! between them (the global rate-limit filter, which must see the router's quota headers
//! before any endpoint is picked). Without one, a single filter does the same work with one
//! set of hooks per stream instead of two: Envoy creates, iterates and destroys one filter,
//! and passes the buffered body through one. The route is matched again between the stages
//! exactly as between the two filters: the route stage clears Envoy's route cache once the
//! model headers are set, and the pick stage's first read of the routed cluster makes Envoy
//! match the route on those headers. The router's handoff to the picker stays in the
//! request's context: it is neither encoded into Envoy's filter state nor copied back out.
//!
//! Config: `{"router": <the router filter's config>, "picker": <the picker filter's
//! config>}`; each part is read exactly as its own filter reads it (a `role` field in either
//! is accepted and ignored), and shares the process's state with filters of the same config.
//! The picker part may carry the process's scraper (`scraper`), which this config then hosts
//! exactly as a `picker` filter's would (`crate::scraper`).

use infergate_filters::stages::gateway_pipeline;

use crate::filter::FilterConfigHandle;
use crate::picker::host_scraper;
use crate::pipeline::{host_config, PipelineFactory};
use crate::router::config_json;
use crate::scraper::{take_scraper, Hosting};

/// The config's two parts, in pipeline order.
const PARTS: [&str; 2] = ["router", "picker"];

/// The `gateway` filter's config from its JSON bytes.
pub fn factory(
    config: &[u8],
    envoy: &mut FilterConfigHandle,
) -> Result<(PipelineFactory, Option<Hosting>), String> {
    let serde_json::Value::Object(mut map) = config_json(config)? else {
        return Err("gateway config: expected an object {\"router\": ..., \"picker\": ...}".into());
    };
    let mut part = |name: &str| {
        map.remove(name)
            .ok_or_else(|| format!("gateway config: `{name}` is missing"))
            .and_then(|text| part_json(name, text))
    };
    let (router, mut picker) = (part(PARTS[0])?, part(PARTS[1])?);
    let scraper = take_scraper(&mut picker);
    if let Some(other) = map.keys().next() {
        return Err(format!(
            "gateway config: unknown key `{other}` (expected {})",
            PARTS.join(", ")
        ));
    }
    let (router, router_registration) =
        crate::router::role(router).map_err(|e| format!("gateway router: {e}"))?;
    let (picker, picker_registration) =
        crate::picker::role(picker).map_err(|e| format!("gateway picker: {e}"))?;
    let hosting = host_scraper(envoy, scraper).map_err(|e| format!("gateway picker: {e}"))?;
    let mut keys = router.stat_keys();
    keys.extend(picker.store().plans().stat_keys());
    let host = host_config(envoy, &keys);
    drop(keys);
    let factory = PipelineFactory::new(
        gateway_pipeline(router, picker),
        host,
        vec![Box::new(router_registration), Box::new(picker_registration)],
    );
    Ok((factory, hosting))
}

/// One part of the config: an object, or the JSON text of one (a part copied from a
/// filter's `StringValue`), without its `role`.
fn part_json(name: &str, value: serde_json::Value) -> Result<serde_json::Value, String> {
    let text = match value {
        serde_json::Value::String(text) => text.into_bytes(),
        value @ serde_json::Value::Object(_) => value.to_string().into_bytes(),
        _ => return Err(format!("gateway config: `{name}` must be an object")),
    };
    config_json(&text).map_err(|e| format!("gateway config: `{name}`: {e}"))
}
