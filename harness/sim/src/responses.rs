//! JSON shapes of vLLM's OpenAI-compatible responses: stream chunks, usage, full responses
//! and errors.

use serde_json::{json, Value};

use super::engine::Usage;
use super::prompt::ApiKind;

/// What every chunk and response of one request shares.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    /// Endpoint kind.
    pub kind: ApiKind,
    /// `chatcmpl-…` or `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model as requested.
    pub model: String,
}

impl ResponseMeta {
    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (ApiKind::Chat, true) => "chat.completion.chunk",
            (ApiKind::Chat, false) => "chat.completion",
            (ApiKind::Completions, _) => "text_completion",
        }
    }

    /// The usage object, with `prompt_tokens_details.cached_tokens`.
    pub fn usage(u: &Usage) -> Value {
        json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        })
    }

    /// The chat role chunk vLLM sends before the first content.
    pub fn role_chunk(&self, usage: Option<&Usage>) -> Value {
        let mut v = json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                          "logprobs": null, "finish_reason": null}],
        });
        if let (Some(u), Some(obj)) = (usage, v.as_object_mut()) {
            obj.insert("usage".into(), Self::usage(u));
        }
        v
    }

    /// One content chunk; `finish` marks the last token (`"length"` or `"stop"`).
    pub fn content_chunk(&self, text: &str, finish: Option<&str>, usage: Option<&Usage>) -> Value {
        let choice = match self.kind {
            ApiKind::Chat => json!({"index": 0, "delta": {"content": text},
                                    "logprobs": null, "finish_reason": finish}),
            ApiKind::Completions => json!({"index": 0, "text": text, "logprobs": null,
                                           "finish_reason": finish, "stop_reason": null}),
        };
        let mut v = json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [choice],
        });
        if let (Some(u), Some(obj)) = (usage, v.as_object_mut()) {
            obj.insert("usage".into(), Self::usage(u));
        }
        v
    }

    /// The bytes before and after the text of a plain content chunk (no finish, no usage),
    /// so the hot path of a stream formats no JSON. `text` must need no JSON escaping.
    pub fn content_template(&self) -> (String, String) {
        let model = Value::String(self.model.clone()).to_string();
        let id = Value::String(self.id.clone()).to_string();
        let object = self.object(true);
        let head = format!(
            "data: {{\"id\":{id},\"object\":\"{object}\",\"created\":{},\"model\":{model},\"choices\":[{{\"index\":0,",
            self.created
        );
        match self.kind {
            ApiKind::Chat => (
                format!("{head}\"delta\":{{\"content\":\""),
                "\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n".to_string(),
            ),
            ApiKind::Completions => (
                format!("{head}\"text\":\""),
                "\",\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}\n\n"
                    .to_string(),
            ),
        }
    }

    /// The final usage chunk (empty `choices`) sent when `include_usage` is set.
    pub fn usage_chunk(&self, u: &Usage) -> Value {
        json!({
            "id": self.id, "object": self.object(true), "created": self.created,
            "model": self.model, "choices": [], "usage": Self::usage(u),
        })
    }

    /// A complete non-streaming response.
    pub fn full(&self, text: &str, finish: &str, u: &Usage) -> Value {
        let choice = match self.kind {
            ApiKind::Chat => json!({"index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": null, "finish_reason": finish, "stop_reason": null}),
            ApiKind::Completions => json!({"index": 0, "text": text, "logprobs": null,
                "finish_reason": finish, "stop_reason": null}),
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created,
            "model": self.model, "choices": [choice], "usage": Self::usage(u),
        })
    }
}

/// An OpenAI-style error body as vLLM sends it.
pub fn error_body(status: u16, message: &str, param: Option<&str>) -> Value {
    let kind = match status {
        400 => "BadRequestError",
        404 => "NotFoundError",
        405 => "MethodNotAllowed",
        _ => "InternalServerError",
    };
    json!({"error": {"message": message, "type": kind, "param": param, "code": status}})
}

/// One SSE event line pair for a JSON payload.
pub fn sse(v: &Value) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {v}\n\n"))
}

/// The stream terminator.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn template_equals_json_chunk() {
        for kind in [ApiKind::Chat, ApiKind::Completions] {
            let m = ResponseMeta {
                kind,
                id: "x-1".into(),
                created: 7,
                model: "m\"q".into(),
            };
            let (head, tail) = m.content_template();
            let text = format!("{head}abc {tail}");
            let payload = text.strip_prefix("data: ").unwrap().trim_end();
            let got: Value = serde_json::from_str(payload).unwrap();
            assert_eq!(got, m.content_chunk("abc ", None, None));
            assert!(text.ends_with("\n\n"));
        }
    }
}
