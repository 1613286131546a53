//! The request-header edits the router hands to the `headers` role, and their application.
//!
//! Under Envoy's default `allow_on_headers_stop_iteration` (false, the only setting an
//! Istio `WasmPlugin` gets), the router lets the request headers go before it reads the
//! body, while Envoy's `buffer` filter after it holds them. The edits it makes then (the
//! model header, the split key, a rewritten body's `content-length`) are left, JSON
//! encoded, in the stream's filter state under [`HEADER_EDITS_PROPERTY`]; the `headers`
//! role, after the buffer filter, applies them ([`apply_pending`]), and a Wasm header edit
//! makes Envoy clear the route cache. Both modules read and write this one format.

use crate::hostcalls;
use crate::MapType;

/// The property (filter state `wasm.infergate.request_headers`) through which the router
/// hands the header edits it made after the headers went on to the `headers` role.
pub const HEADER_EDITS_PROPERTY: &str = "infergate.request_headers";

/// One edit of a request header made after the headers went on.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HeaderEdit {
    /// Replace every value of the header with this one.
    Set(String, String),
    /// Add a value.
    Add(String, String),
    /// Remove the header.
    Remove(String),
}

/// Apply `edits` to the current request headers. A header the host refuses to change is
/// left as it is: the route then answers as it would without the edit.
pub fn apply_header_edits(edits: &[HeaderEdit]) {
    let map = MapType::HttpRequestHeaders;
    for edit in edits {
        let _ = match edit {
            HeaderEdit::Set(name, value) => {
                hostcalls::replace_header_map_value(map, name, value.as_bytes())
            }
            HeaderEdit::Add(name, value) => {
                hostcalls::add_header_map_value(map, name, value.as_bytes())
            }
            HeaderEdit::Remove(name) => hostcalls::remove_header_map_value(map, name),
        };
    }
}

/// The `headers` role's whole work at a request's headers: apply the edits the router
/// left for this stream, if any (a request the router did not edit has none; one whose
/// edits cannot be read goes on as it is).
pub fn apply_pending() {
    let edits = hostcalls::get_property(&[HEADER_EDITS_PROPERTY])
        .ok()
        .flatten()
        .and_then(|bytes| serde_json::from_slice::<Vec<HeaderEdit>>(&bytes).ok());
    if let Some(edits) = edits {
        apply_header_edits(&edits);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_keep_their_wire_form() {
        let edits = vec![
            HeaderEdit::Set("x-gateway-base-model-name".into(), "m".into()),
            HeaderEdit::Add("a".into(), "b".into()),
            HeaderEdit::Remove("content-length".into()),
        ];
        let bytes = serde_json::to_vec(&edits).unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"[{"Set":["x-gateway-base-model-name","m"]},{"Add":["a","b"]},{"Remove":"content-length"}]"#
        );
        assert_eq!(
            serde_json::from_slice::<Vec<HeaderEdit>>(&bytes).unwrap(),
            edits
        );
    }
}
