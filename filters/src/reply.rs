//! Local replies: the failure answers as OpenAI-style error JSON
//! (`{"error": {"message", "type", "param", "code"}}`), with `content-type` and, for
//! rejections, `x-llm-d-request-dropped-reason`.
//!
//! A message may quote the client's input (a `model` name, a parser's complaint): every
//! quoted value is cut to [`MAX_QUOTED_BYTES`] and every message to [`MAX_MESSAGE_BYTES`],
//! so an error reply stays small whatever the request held (a 1 MiB `model` gets a 404 of
//! a few hundred bytes).

use serde_json::{json, Value};

use crate::headers::DROPPED_REASON;

/// A complete local reply: status, headers and body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// Response headers (lower-case names).
    pub headers: Vec<(String, String)>,
    /// Response body.
    pub body: Vec<u8>,
}

/// The reason value of `x-llm-d-request-dropped-reason` when no endpoint can take a request.
pub const REJECTED_NO_ENDPOINTS: &str = "rejected-no-endpoints";

/// The most bytes of one client-supplied value a message quotes.
pub const MAX_QUOTED_BYTES: usize = 128;

/// The most bytes of an error message (longer ones are cut, ending in `…`).
pub const MAX_MESSAGE_BYTES: usize = 512;

/// `text` cut to at most `max` bytes at a character boundary, with `…` appended when cut.
pub fn truncate_for_message(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = String::with_capacity(end + 3);
    cut.push_str(text.get(..end).unwrap_or_default());
    cut.push('…');
    std::borrow::Cow::Owned(cut)
}

impl Reply {
    /// An OpenAI error reply: `kind` is the error `type`, `param`/`code` may be absent.
    pub fn openai_error(
        status: u16,
        kind: &str,
        message: &str,
        param: Option<&str>,
        code: Option<&str>,
    ) -> Reply {
        let body = json!({
            "error": {
                "message": truncate_for_message(message, MAX_MESSAGE_BYTES),
                "type": kind,
                "param": param.map_or(Value::Null, |p| Value::String(p.to_owned())),
                "code": code.map_or(Value::Null, |c| Value::String(c.to_owned())),
            }
        });
        Reply {
            status,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: body.to_string().into_bytes(),
        }
    }

    /// 400: the body is not a valid request (`code` and `param` from the parser).
    pub fn bad_request(message: &str, param: Option<&str>, code: &str) -> Reply {
        Reply::openai_error(400, "invalid_request_error", message, param, Some(code))
    }

    /// 413: the body is larger than `limit` bytes.
    pub fn too_large(limit: usize) -> Reply {
        let message = format!("request body exceeds the limit of {limit} bytes");
        Reply::openai_error(
            413,
            "invalid_request_error",
            &message,
            None,
            Some("request_too_large"),
        )
    }

    /// 404: no configured pool serves `model` (quoted up to [`MAX_QUOTED_BYTES`]).
    pub fn model_not_found(model: &str) -> Reply {
        let model = truncate_for_message(model, MAX_QUOTED_BYTES);
        let message = format!("The model `{model}` does not exist or is not served here");
        Reply::openai_error(
            404,
            "invalid_request_error",
            &message,
            Some("model"),
            Some("model_not_found"),
        )
    }

    /// 503 with `x-llm-d-request-dropped-reason: reason`.
    pub fn rejected(reason: &str, message: &str) -> Reply {
        let mut reply = Reply::openai_error(503, "server_error", message, None, Some(reason));
        reply
            .headers
            .push((DROPPED_REASON.to_owned(), reason.to_owned()));
        reply
    }

    /// 401: no credential, or one no tenant holds (OpenAI's `invalid_api_key`).
    pub fn unauthorized(message: &str) -> Reply {
        let mut reply = Reply::openai_error(
            401,
            "invalid_request_error",
            message,
            None,
            Some("invalid_api_key"),
        );
        reply
            .headers
            .push(("www-authenticate".to_owned(), "Bearer".to_owned()));
        reply
    }

    /// 403: the tenant has no limit for `model` (neither its own entry nor `"*"`), so its
    /// plan does not include the model.
    pub fn model_not_allowed(model: &str) -> Reply {
        let model = truncate_for_message(model, MAX_QUOTED_BYTES);
        let message = format!("Your tenant has no quota for the model `{model}`");
        Reply::openai_error(
            403,
            "invalid_request_error",
            &message,
            Some("model"),
            Some("model_not_allowed"),
        )
    }

    /// 429: a quota refused the request before any engine saw it. `kind` is OpenAI's
    /// error type for the limit (`requests` or `tokens`); `headers` are `retry-after` and
    /// the `x-ratelimit-*` values; `reason` goes to `x-llm-d-request-dropped-reason`.
    pub fn rate_limited(
        reason: &str,
        kind: &str,
        message: &str,
        headers: impl IntoIterator<Item = (String, String)>,
    ) -> Reply {
        let mut reply = Reply::openai_error(429, kind, message, None, Some("rate_limit_exceeded"));
        reply
            .headers
            .push((DROPPED_REASON.to_owned(), reason.to_owned()));
        reply.headers.extend(headers);
        reply
    }

    /// 429 from flow control: the request waited in vain or found its band full, before any
    /// engine saw it (safe to retry); `x-llm-d-request-dropped-reason` says which.
    pub fn dropped(reason: crate::flow::DropReason) -> Reply {
        let mut reply = Reply::openai_error(
            429,
            "rate_limit_error",
            reason.message(),
            None,
            Some(reason.wire()),
        );
        reply
            .headers
            .push((DROPPED_REASON.to_owned(), reason.wire().to_owned()));
        reply
    }

    /// 500: a bug inside a filter; the request fails closed.
    pub fn internal(message: &str) -> Reply {
        Reply::openai_error(500, "server_error", message, None, Some("internal_error"))
    }

    /// A JSON answer the gateway gives itself (`200` with the OpenAI model list, say).
    pub fn json(status: u16, body: &Value) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: body.to_string().into_bytes(),
        }
    }

    /// 405 with `allow: allowed` (a method the gateway does not answer on a path it owns).
    pub fn method_not_allowed(method: &str, allowed: &str) -> Reply {
        let method = truncate_for_message(method, MAX_QUOTED_BYTES);
        let message = format!("method {method} is not allowed here (allowed: {allowed})");
        let mut reply = Reply::openai_error(
            405,
            "invalid_request_error",
            &message,
            None,
            Some("method_not_allowed"),
        );
        reply.headers.push(("allow".to_owned(), allowed.to_owned()));
        reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_json(r: &Reply) -> Value {
        serde_json::from_slice(&r.body).unwrap_or(Value::Null)
    }

    #[test]
    fn error_body_has_the_four_openai_fields() {
        let r = Reply::model_not_found("gpt-x");
        assert_eq!(r.status, 404);
        let v = body_json(&r);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("gpt-x")));
    }

    #[test]
    fn absent_param_is_null_and_message_is_escaped() {
        let r = Reply::bad_request("bad \"quote\"\n", None, "invalid_json");
        let v = body_json(&r);
        assert_eq!(v["error"]["param"], Value::Null);
        assert_eq!(v["error"]["message"], "bad \"quote\"\n");
    }

    #[test]
    fn quoted_input_and_messages_are_bounded() {
        let huge = "é".repeat(512 * 1024);
        let r = Reply::model_not_found(&huge);
        assert!(r.body.len() < 1024, "{}", r.body.len());
        let v = body_json(&r);
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("éé…`"), "{message}");
        let r = Reply::bad_request(&"x".repeat(10_000), None, "invalid_json");
        let message = body_json(&r)["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(message.len(), MAX_MESSAGE_BYTES + '…'.len_utf8());
        assert_eq!(truncate_for_message("short", 10), "short");
        // A cut never splits a character.
        assert_eq!(truncate_for_message("aé", 2), "a…");
    }

    #[test]
    fn rejection_carries_the_dropped_reason_header() {
        let r = Reply::rejected(REJECTED_NO_ENDPOINTS, "no endpoint");
        assert_eq!(r.status, 503);
        assert!(r
            .headers
            .iter()
            .any(|(k, v)| k == DROPPED_REASON && v == REJECTED_NO_ENDPOINTS));
    }
}
