//! The plugin configuration: one JSON object whose `role` picks what this module instance
//! is; the remaining keys (minus the adapter's own, below) are the role's `filters/` config.
//!
//! | role | the rest is | adapter keys |
//! |---|---|---|
//! | `router` | `filters::router::RouterConfig` | — |
//! | `picker` | `filters::picker::PickerConfig` (`{"pools": [...]}` or one pool) | `snapshotKey` |
//! | `scraper` | `filters::scraper::ScraperConfig` | `snapshotKey` |
//! | `probe` | nothing (`{"role": "probe"}`) | — |
//!
//! `probe` is a measuring tool, not part of the gateway: it holds each request until its body
//! is complete, copies the body into the VM and lets the request go on unchanged, the least
//! any body-based filter does. `cargo xtask bench overhead` runs it as the Wasm floor.
//!
//! `snapshotKey` (default [`DEFAULT_SNAPSHOT_KEY`]) is the shared-data key the scraper
//! publishes under and the pickers read; both must also share a `vm_id`.
//! Keys the module once had are refused by name ([`REMOVED_KEYS`]), so a config written for
//! them fails with a reason instead of reaching the role as an unknown field.

use serde_json::{Map, Value};

/// Shared-data key of the metric snapshot unless configured.
pub const DEFAULT_SNAPSHOT_KEY: &str = "infergate.snapshot";

/// Keys this module once had, each with what replaced it.
pub const REMOVED_KEYS: &[(&str, &str)] = &[(
    "filterStateOverride",
    "the pool cluster's override_host load-balancing policy now routes from the picker's \
     destination list (header and envoy.lb metadata); remove the key",
)];

/// Which part of the gateway this instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleKind {
    /// The body router (HTTP filter).
    Router,
    /// The endpoint picker (HTTP filter).
    Picker,
    /// The metrics scraper (singleton root context).
    Scraper,
    /// Buffers and reads each request body, nothing else (the cost floor; module doc).
    Probe,
}

/// The parsed plugin configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConfig {
    /// The role.
    pub role: RoleKind,
    /// Shared-data key of the snapshot.
    pub snapshot_key: String,
    /// The role's own configuration (everything else).
    pub rest: Value,
}

/// Parse the plugin configuration bytes.
pub fn parse(bytes: &[u8]) -> Result<PluginConfig, String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("plugin config is not JSON: {e}"))?;
    let Value::Object(mut map) = value else {
        return Err("plugin config must be a JSON object".to_owned());
    };
    for (key, why) in REMOVED_KEYS {
        if map.contains_key(*key) {
            return Err(format!("plugin config: `{key}` was removed: {why}"));
        }
    }
    let role = match map.remove("role") {
        Some(Value::String(r)) if r == "router" => RoleKind::Router,
        Some(Value::String(r)) if r == "picker" => RoleKind::Picker,
        Some(Value::String(r)) if r == "scraper" => RoleKind::Scraper,
        Some(Value::String(r)) if r == "probe" => RoleKind::Probe,
        Some(other) => {
            return Err(format!(
                "plugin config: role must be \"router\", \"picker\", \"scraper\" or \"probe\", \
                 not {other}"
            ))
        }
        None => return Err("plugin config: missing \"role\"".to_owned()),
    };
    if role == RoleKind::Probe && !map.is_empty() {
        return Err("plugin config: the probe takes no settings".to_owned());
    }
    let snapshot_key = take_string(&mut map, "snapshotKey", role != RoleKind::Router)?
        .unwrap_or_else(|| DEFAULT_SNAPSHOT_KEY.to_owned());
    Ok(PluginConfig {
        role,
        snapshot_key,
        rest: Value::Object(map),
    })
}

fn take_string(
    map: &mut Map<String, Value>,
    key: &str,
    allowed: bool,
) -> Result<Option<String>, String> {
    match map.remove(key) {
        None => Ok(None),
        Some(_) if !allowed => Err(format!(
            "plugin config: {key} is not a setting of this role"
        )),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(other) => Err(format!(
            "plugin config: {key} must be a non-empty string, not {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_is_taken_out_and_the_rest_kept() {
        let c = parse(br#"{"role":"router","bodyLimitBytes":10,"pools":[]}"#);
        let c = c.map_err(|e| e.to_string());
        assert_eq!(c.as_ref().map(|c| c.role), Ok(RoleKind::Router));
        assert_eq!(
            c.map(|c| c.rest),
            Ok(serde_json::json!({"bodyLimitBytes": 10, "pools": []}))
        );
    }

    #[test]
    fn adapter_keys_are_removed_and_defaulted() {
        let c = parse(br#"{"role":"picker","pool":"p","baseModel":"m"}"#);
        assert_eq!(
            c.as_ref().map(|c| c.snapshot_key.as_str()),
            Ok(DEFAULT_SNAPSHOT_KEY)
        );
        let c = parse(br#"{"role":"picker","snapshotKey":"k","pool":"p"}"#);
        assert_eq!(c.as_ref().map(|c| c.snapshot_key.as_str()), Ok("k"));
        assert_eq!(c.map(|c| c.rest), Ok(serde_json::json!({"pool": "p"})));
    }

    #[test]
    fn the_removed_filter_state_override_is_refused_naming_it() {
        for bad in [
            &br#"{"role":"picker","filterStateOverride":true,"pool":"p"}"#[..],
            br#"{"role":"picker","filterStateOverride":false,"pools":[]}"#,
            br#"{"role":"scraper","filterStateOverride":true}"#,
        ] {
            let err = parse(bad).err().unwrap_or_default();
            assert!(
                err.contains("`filterStateOverride` was removed") && err.contains("override_host"),
                "{}: {err}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn bad_configs_are_rejected_with_a_reason() {
        for bad in [
            &b"not json"[..],
            b"[]",
            br#"{"pools":[]}"#,
            br#"{"role":"balancer"}"#,
            br#"{"role":"router","snapshotKey":"k"}"#,
            br#"{"role":"scraper","filterStateOverride":true}"#,
            br#"{"role":"picker","snapshotKey":""}"#,
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}

#[cfg(test)]
mod testdata_tests {
    //! The example configurations in `testdata/filters/` parse and build their role.

    use super::*;
    use infergate_filters::picker::PickerShared;
    use infergate_filters::router::Router;
    use infergate_filters::scraper::Scraper;

    fn load(name: &str) -> Result<PluginConfig, String> {
        let path = format!("{}/../testdata/filters/{name}", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(&path).map_err(|e| format!("{path}: {e}"))?;
        parse(&bytes)
    }

    #[test]
    fn router_example_builds() {
        let c = load("router.json");
        assert_eq!(c.as_ref().map(|c| c.role), Ok(RoleKind::Router));
        let router = c.and_then(|c| Router::from_json(c.rest).map_err(|e| e.to_string()));
        assert_eq!(
            router.as_ref().ok().and_then(|r| r.base_model("sql-lora")),
            Some("meta-llama/Llama-3.1-8B-Instruct")
        );
    }

    #[test]
    fn picker_example_builds() {
        let c = load("picker.json");
        assert_eq!(c.as_ref().map(|c| c.role), Ok(RoleKind::Picker));
        let shared = c.and_then(|c| PickerShared::from_json(c.rest).map_err(|e| e.to_string()));
        let shared = shared.map_err(|e| e.to_string());
        assert!(shared.is_ok(), "{shared:?}");
        assert!(shared
            .ok()
            .and_then(|s| s.pool_for_base_model("Qwen/Qwen2.5-7B-Instruct"))
            .is_some());
    }

    #[test]
    fn scraper_example_builds() {
        let c = load("scraper.json");
        assert_eq!(c.as_ref().map(|c| c.role), Ok(RoleKind::Scraper));
        let scraper = c.and_then(|c| Scraper::from_json(c.rest));
        assert_eq!(scraper.map(|s| s.samples().len()), Ok(4));
    }
}
