//! Local replies: the DESIGN §10 failures as OpenAI-style error JSON
//! (`{"error": {"message", "type", "param", "code"}}`), with `content-type` and, for
//! rejections, `x-llm-d-request-dropped-reason`.

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
                "message": message,
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

    /// 404: no configured pool serves `model`.
    pub fn model_not_found(model: &str) -> Reply {
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

    /// 500: a bug inside a filter; the request fails closed.
    pub fn internal(message: &str) -> Reply {
        Reply::openai_error(500, "server_error", message, None, Some("internal_error"))
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
    fn rejection_carries_the_dropped_reason_header() {
        let r = Reply::rejected(REJECTED_NO_ENDPOINTS, "no endpoint");
        assert_eq!(r.status, 503);
        assert!(r
            .headers
            .iter()
            .any(|(k, v)| k == DROPPED_REASON && v == REJECTED_NO_ENDPOINTS));
    }
}
