//! `infergate_wasm_headers.wasm`: the `headers` role of the Wasm flavour as a module of its
//! own, which exports nothing but what that role needs.
//!
//! The role applies, after Envoy's `buffer` filter, the request-header edits the router made
//! once the headers had gone on ([`infergate_wasm_abi::header_edits`]). In the full module
//! (`infergate_wasm.wasm`, which still accepts `{"role": "headers"}`) that filter is entered
//! at every callback the module exports: the context's creation, each body chunk, the
//! response's headers and every response chunk, the log and the deletion, seven VM entries
//! per request and one more per streamed chunk, for one callback of work. Envoy skips a
//! callback the module does not export without entering the VM, so this module exports
//! only `proxy_on_configure` (the configuration is checked once) and
//! `proxy_on_request_headers`: one entry per request. It keeps no per-stream state, so it
//! needs neither `proxy_on_context_create` nor `proxy_on_delete`.
//!
//! Build: `cargo build -p infergate-wasm-headers --target wasm32-wasip1 --release`.

#[cfg(target_arch = "wasm32")]
mod exports;

use serde_json::Value;

/// The one role this module plays.
pub const ROLE: &str = "headers";

/// Checks the plugin configuration: `{"role": "headers"}`, optionally with the gateway's
/// `instance` (a string), as the full module accepts it for the same role. Any other role
/// is refused with a pointer to the module that plays it.
pub fn check_config(bytes: &[u8]) -> Result<(), String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("plugin config: not JSON: {e}"))?;
    let Value::Object(mut map) = value else {
        return Err("plugin config: must be a JSON object".to_owned());
    };
    match map.remove("role") {
        Some(Value::String(r)) if r == ROLE => {}
        Some(other) => {
            return Err(format!(
                "plugin config: this module plays only the role \"{ROLE}\", not {other}; \
                 the router and the picker are infergate_wasm.wasm"
            ))
        }
        None => return Err("plugin config: missing \"role\"".to_owned()),
    }
    match map.remove("instance") {
        None | Some(Value::String(_)) => {}
        Some(other) => {
            return Err(format!(
                "plugin config: instance must be a string, not {other}"
            ))
        }
    }
    if !map.is_empty() {
        return Err("plugin config: the headers role takes no settings but `instance`".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headers_role_is_accepted_with_or_without_an_instance() {
        assert_eq!(check_config(br#"{"role":"headers"}"#), Ok(()));
        assert_eq!(
            check_config(br#"{"role":"headers","instance":"gw"}"#),
            Ok(())
        );
    }

    #[test]
    fn anything_else_is_refused_with_a_reason() {
        for (config, says) in [
            (
                &br#"{"role":"router","pools":[]}"#[..],
                "not \"router\"; the router and the picker are infergate_wasm.wasm",
            ),
            (br#"{"role":"picker"}"#, "plays only the role \"headers\""),
            (br#"{"instance":"gw"}"#, "missing \"role\""),
            (
                br#"{"role":"headers","instance":7}"#,
                "instance must be a string",
            ),
            (
                br#"{"role":"headers","pools":[]}"#,
                "no settings but `instance`",
            ),
            (br#"["headers"]"#, "must be a JSON object"),
            (b"", "not JSON"),
        ] {
            let err = check_config(config).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
