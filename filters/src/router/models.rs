//! `GET /v1/models` and `GET /v1/models/{id}`, answered by the router itself: OpenAI
//! clients and SDKs list models before anything else, and the gateway is the one place
//! that knows every name it routes (each pool's base model and adapters, and the names
//! model rewrites match), across pools.
//!
//! The list is OpenAI's shape (`{"object": "list", "data": [{"id", "object": "model",
//! "created": 0, "owned_by": "infergate"}]}`), sorted by id, each name once. An id no pool
//! serves is the OpenAI 404 `model_not_found`. `GET` and `HEAD` are answered; any other
//! method on these paths is a 405 with `allow: GET, HEAD` (OpenAI has no other method on
//! them; passing one to an engine would answer from one replica's view only).

use serde_json::{json, Value};

use crate::reply::Reply;

/// The list path.
pub const MODELS_PATH: &str = "/v1/models";

/// The `owned_by` of every listed model.
pub const OWNED_BY: &str = "infergate";

/// What a request on the models paths asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelsRequest {
    /// `/v1/models`.
    List,
    /// `/v1/models/{id}` (percent-decoded; an id may hold `/`).
    One(String),
}

impl ModelsRequest {
    /// The models request `path` (query string allowed) is, if it is one.
    pub fn from_path(path: &str) -> Option<ModelsRequest> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let rest = path.strip_prefix(MODELS_PATH)?;
        if rest.is_empty() || rest == "/" {
            return Some(ModelsRequest::List);
        }
        let id = rest.strip_prefix('/')?;
        Some(ModelsRequest::One(percent_decode(id)))
    }
}

/// One model object.
fn model_object(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": OWNED_BY})
}

/// The answer to `request` over the served `names` (sorted, each once).
pub fn answer(request: &ModelsRequest, method: &str, names: &[&str]) -> Reply {
    if !method.eq_ignore_ascii_case("GET") && !method.eq_ignore_ascii_case("HEAD") {
        return Reply::method_not_allowed(method, "GET, HEAD");
    }
    match request {
        ModelsRequest::List => {
            let data: Vec<Value> = names.iter().map(|n| model_object(n)).collect();
            Reply::json(200, &json!({"object": "list", "data": data}))
        }
        ModelsRequest::One(id) => {
            if names.binary_search(&id.as_str()).is_ok() {
                Reply::json(200, &model_object(id))
            } else {
                Reply::model_not_found(id)
            }
        }
    }
}

/// `%XX` sequences decoded (invalid ones and non-UTF-8 results kept as written).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = |j: usize| bytes.get(j).and_then(|c| (*c as char).to_digit(16));
        if b == b'%' {
            if let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) {
                out.push((hi * 16 + lo) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_parse() {
        assert_eq!(
            ModelsRequest::from_path("/v1/models"),
            Some(ModelsRequest::List)
        );
        assert_eq!(
            ModelsRequest::from_path("/v1/models/?x=1"),
            Some(ModelsRequest::List)
        );
        assert_eq!(
            ModelsRequest::from_path("/v1/models/meta-llama%2FLlama-3"),
            Some(ModelsRequest::One("meta-llama/Llama-3".into()))
        );
        assert_eq!(
            ModelsRequest::from_path("/v1/models/org/name"),
            Some(ModelsRequest::One("org/name".into()))
        );
        assert_eq!(ModelsRequest::from_path("/v1/modelsx"), None);
        assert_eq!(ModelsRequest::from_path("/v1/chat/completions"), None);
        assert_eq!(percent_decode("a%zzb%4"), "a%zzb%4");
    }

    #[test]
    fn answers() {
        let names = ["a", "b/c"];
        let r = answer(&ModelsRequest::List, "GET", &names);
        assert_eq!(r.status, 200);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][1]["id"], "b/c");
        assert_eq!(v["data"][1]["owned_by"], OWNED_BY);
        let r = answer(&ModelsRequest::One("b/c".into()), "GET", &names);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!((r.status, v["id"].as_str()), (200, Some("b/c")));
        let r = answer(&ModelsRequest::One("z".into()), "GET", &names);
        assert_eq!(r.status, 404);
        let r = answer(&ModelsRequest::List, "DELETE", &names);
        assert_eq!(r.status, 405);
        assert!(r
            .headers
            .iter()
            .any(|(k, v)| k == "allow" && v == "GET, HEAD"));
    }
}
