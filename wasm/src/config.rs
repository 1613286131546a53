//! The plugin configuration: one JSON object whose `role` picks what this module instance
//! is; the remaining keys (minus the adapter's own, below) are the role's `filters/` config.
//!
//! | role | the rest is | adapter keys |
//! |---|---|---|
//! | `router` | `filters::router::RouterConfig` | `instance` |
//! | `picker` | `filters::picker::PickerConfig` (`{"pools": [...]}` or one pool) | `instance`, `snapshotKey`, `scraper` |
//! | `headers` | nothing | `instance` |
//!
//! With the cargo feature `probe` (the bench build `cargo xtask bench overhead` loads for its
//! Wasm floor, never the release module) there is one more role, `probe`, with no other key
//! (`{"role": "probe"}`; `crate::probe`). Without it, `probe` is refused as any unknown role
//! is.
//!
//! `instance` (default [`DEFAULT_INSTANCE`]) names this gateway inside the proxy: every
//! shared-data key and queue name of the module starts with it ([`Names`]). Shared data
//! and queues are scoped by `vm_id` only, and Istio gives every `WasmPlugin` the `vm_id`
//! `""`, so two gateways, or another vendor's plugin, in one proxy meet in one namespace;
//! the router and the picker of one gateway set the same `instance`.
//!
//! `allowOnHeadersStopIteration` (router and picker; default `false`, as in Envoy) says
//! what the plugin's Envoy `PluginConfig` says of the same name. An Istio `WasmPlugin`
//! cannot set it, and under Envoy's default a filter that stops at the request headers
//! sees no body until it lets them go. So, unless it is `true`:
//!
//! - the router lets the headers go at once (Envoy's `buffer` filter after it holds them
//!   until the body is complete), reads the body, and leaves the header edits it makes
//!   meanwhile in filter state;
//! - the `headers` role, right after that buffer filter, applies them (which makes Envoy
//!   resolve the route again);
//! - the picker picks at the request headers from the router's handoff alone, and answers
//!   503 when no handoff fits rather than waiting for a body it would never see.
//!
//! `scraper` (picker only) is the process's scraper (`filters::scraper::ScraperConfig`): the
//! worker VM elected owner runs it (`crate::root`). `snapshotKey` (default
//! `<instance>.snapshot`) is the shared-data key the scraper publishes under and the pickers
//! read.
//!
//! Keys and roles the module once had are refused by name ([`REMOVED_KEYS`], the role
//! `scraper`), so a config written for them fails with a reason instead of reaching the role
//! as an unknown field.

use serde_json::{Map, Value};

/// The namespace of this module's shared data and queues unless configured.
pub const DEFAULT_INSTANCE: &str = "infergate";

/// Shared-data key of the metric snapshot of the default instance.
pub const DEFAULT_SNAPSHOT_KEY: &str = "infergate.snapshot";

/// The names one gateway instance uses in the proxy's shared data and queues, each
/// starting with the instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    instance: String,
}

impl Names {
    /// The names of `instance`.
    pub fn new(instance: &str) -> Names {
        Names {
            instance: instance.to_owned(),
        }
    }

    /// The metric snapshot's key (unless `snapshotKey` says otherwise).
    pub fn snapshot(&self) -> String {
        format!("{}.snapshot", self.instance)
    }

    /// The owner election's lease cell.
    pub fn owner_lease(&self) -> String {
        format!("{}.owner.lease", self.instance)
    }

    /// The picker state owner's queue.
    pub fn owner_queue(&self) -> String {
        format!("{}.picker.owner", self.instance)
    }

    /// A picker root's reply queue, `tag` its random part.
    pub fn reply_queue(&self, tag: u64) -> String {
        format!("{}.picker.reply.{tag:016x}", self.instance)
    }

    /// The cell where the picker declares the block size it hashes `base_model`'s prompts
    /// at, for a router in another VM (Istio gives each `WasmPlugin` its own).
    pub fn block_size(&self, base_model: &str) -> String {
        format!("{}.block_size.{base_model}", self.instance)
    }

    /// The prefix of the quota buckets' cells.
    pub fn quota_prefix(&self) -> String {
        format!("{}.quota.", self.instance)
    }
}

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
    /// Applies the header edits the router left in filter state (module doc).
    Headers,
    /// Buffers and reads each request body, nothing else (the cost floor of the bench
    /// build; `crate::probe`).
    #[cfg(feature = "probe")]
    Probe,
}

impl RoleKind {
    /// Whether this is the bench build's `probe` (always `false` without the feature).
    fn is_probe(self) -> bool {
        #[cfg(feature = "probe")]
        return self == RoleKind::Probe;
        #[cfg(not(feature = "probe"))]
        return false;
    }
}

/// The roles this build accepts, as the unknown-role error lists them.
#[cfg(not(feature = "probe"))]
const ROLES: &str = r#""router", "picker" or "headers""#;
/// The roles this build accepts, as the unknown-role error lists them.
#[cfg(feature = "probe")]
const ROLES: &str = r#""router", "picker", "headers" or "probe""#;

/// The parsed plugin configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginConfig {
    /// The role.
    pub role: RoleKind,
    /// The instance's shared-data keys and queue names.
    pub names: Names,
    /// Shared-data key of the snapshot.
    pub snapshot_key: String,
    /// The process's scraper, carried by a picker.
    pub scraper: Option<Value>,
    /// Envoy lets this filter stop at the request headers and still read the body.
    pub stop_at_headers: bool,
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
        Some(Value::String(r)) if r == "scraper" => {
            return Err(
                "plugin config: the role `scraper` was removed: no control plane \
                        installs a singleton service; put the scraper's configuration into \
                        the picker's as `scraper`, and the worker VM elected owner runs it"
                    .to_owned(),
            )
        }
        #[cfg(feature = "probe")]
        Some(Value::String(r)) if r == "probe" => RoleKind::Probe,
        Some(Value::String(r)) if r == "headers" => RoleKind::Headers,
        Some(other) => return Err(format!("plugin config: role must be {ROLES}, not {other}")),
        None => return Err("plugin config: missing \"role\"".to_owned()),
    };
    if role.is_probe() && !map.is_empty() {
        return Err("plugin config: the probe takes no settings".to_owned());
    }
    let instance = take_string(&mut map, "instance", !role.is_probe())?
        .unwrap_or_else(|| DEFAULT_INSTANCE.to_owned());
    let names = Names::new(&instance);
    let snapshot_key = take_string(&mut map, "snapshotKey", role == RoleKind::Picker)?
        .unwrap_or_else(|| names.snapshot());
    let scraper = match map.remove("scraper") {
        None => None,
        Some(_) if role != RoleKind::Picker => {
            return Err("plugin config: scraper is not a setting of this role".to_owned())
        }
        Some(v @ Value::Object(_)) => Some(v),
        Some(other) => {
            return Err(format!(
                "plugin config: scraper must be the scraper's configuration object, not {other}"
            ))
        }
    };
    let stop_at_headers = match map.remove("allowOnHeadersStopIteration") {
        None => false,
        Some(_) if !matches!(role, RoleKind::Router | RoleKind::Picker) => {
            return Err(
                "plugin config: allowOnHeadersStopIteration is not a setting of this role"
                    .to_owned(),
            )
        }
        Some(Value::Bool(b)) => b,
        Some(other) => {
            return Err(format!(
                "plugin config: allowOnHeadersStopIteration must be a boolean, not {other}"
            ))
        }
    };
    if role == RoleKind::Headers && !map.is_empty() {
        return Err("plugin config: the headers role takes no settings but `instance`".to_owned());
    }
    Ok(PluginConfig {
        role,
        names,
        snapshot_key,
        scraper,
        stop_at_headers,
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
            br#"{"role":"scraper","endpoints":[]}"#,
            br#"{"role":"router","scraper":{}}"#,
            br#"{"role":"picker","scraper":[]}"#,
            br#"{"role":"picker","instance":""}"#,
            br#"{"role":"probe","instance":"a"}"#,
            br#"{"role":"headers","pools":[]}"#,
            br#"{"role":"headers","allowOnHeadersStopIteration":true}"#,
            br#"{"role":"picker","allowOnHeadersStopIteration":"yes"}"#,
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// The release module has no `probe`: the role is refused with the answer any unknown
    /// role gets, which lists the roles this build knows.
    #[cfg(not(feature = "probe"))]
    #[test]
    fn the_probe_role_exists_only_in_the_bench_build() {
        let err = r#"plugin config: role must be "router", "picker" or "headers", not "probe""#;
        assert_eq!(parse(br#"{"role":"probe"}"#), Err(err.to_owned()));
        let unknown = parse(br#"{"role":"balancer"}"#).map_err(|e| e.replace("balancer", "probe"));
        assert_eq!(unknown, Err(err.to_owned()));
    }

    /// The bench build (`--features probe`) knows the role, which takes no settings.
    #[cfg(feature = "probe")]
    #[test]
    fn the_bench_build_has_the_probe_role() {
        let probe = parse(br#"{"role":"probe"}"#).map(|c| c.role);
        assert_eq!(probe, Ok(RoleKind::Probe));
        assert!(parse(br#"{"role":"probe","x":1}"#).is_err());
        let unknown = parse(br#"{"role":"balancer"}"#);
        let err = r#"plugin config: role must be "router", "picker", "headers" or "probe", not "balancer""#;
        assert_eq!(unknown, Err(err.to_owned()));
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
    fn the_scraper_example_builds_as_a_pickers_scraper() {
        let path = format!(
            "{}/../testdata/filters/scraper.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let config = format!(r#"{{"role":"picker","pools":[],"scraper":{text}}}"#);
        let c = parse(config.as_bytes());
        let scraper = c.and_then(|c| c.scraper.ok_or_else(|| "no scraper".to_owned()));
        let scraper = scraper.and_then(Scraper::from_json);
        assert_eq!(scraper.map(|s| s.samples().len()), Ok(4));
    }
}
