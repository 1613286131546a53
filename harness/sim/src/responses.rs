//! The bytes of vLLM's OpenAI-compatible responses: stream chunks, usage objects, full
//! responses and errors, written field by field in vLLM's order.
//!
//! vLLM serialises with pydantic, so key order is the model's field order and `null`s
//! appear where vLLM sends them:
//! - chat chunks are written with `exclude_unset`: no `usage` key unless usage is sent,
//!   `logprobs: null` and `finish_reason` always, `stop_reason` only on the finishing chunk;
//! - completion chunks are written without `exclude_unset`: every chunk ends with
//!   `"usage":null` unless it carries usage, and a continuous-usage object ends with
//!   `"prompt_tokens_details":null`;
//! - the final usage-only chunk (`"choices":[]`) drops `null`s, so
//!   `prompt_tokens_details` is there only when it has a value;
//! - full responses carry every field.
//!
//! A usage object is `{"prompt_tokens":P,"total_tokens":P+C,"completion_tokens":C,…}`.

use serde_json::{json, Value};

use super::engine::Usage;
use super::prompt::ApiKind;

/// When `usage.prompt_tokens_details` (`{"cached_tokens":N}`) is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PromptTokensDetails {
    /// On every final usage, `cached_tokens` 0 included.
    #[default]
    Always,
    /// Only when some prompt tokens were cached: vLLM with `--enable-prompt-tokens-details`.
    Nonzero,
    /// Never: vLLM's default.
    Off,
}

impl std::str::FromStr for PromptTokensDetails {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "always" => Ok(Self::Always),
            "nonzero" => Ok(Self::Nonzero),
            "off" => Ok(Self::Off),
            _ => Err(format!("expected always, nonzero or off, not {s:?}")),
        }
    }
}

impl PromptTokensDetails {
    /// The cached-token count to report, if any.
    fn cached(self, cached_tokens: u32) -> Option<u32> {
        match self {
            Self::Always => Some(cached_tokens),
            Self::Nonzero if cached_tokens > 0 => Some(cached_tokens),
            Self::Nonzero | Self::Off => None,
        }
    }
}

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
    /// The opening of every stream chunk, rendered once: a stream writes one chunk per token.
    chunk_head: String,
}

/// Appends `s` as a JSON string literal, escaped as serde (and so pydantic) escapes it.
fn push_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A JSON string literal.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_quoted(&mut out, s);
    out
}

/// `{"prompt_tokens":P,"total_tokens":T,"completion_tokens":C` without the closing brace.
fn usage_counts(out: &mut String, prompt: u32, completion: u32) {
    let total = u64::from(prompt) + u64::from(completion);
    out.push_str(&format!(
        "{{\"prompt_tokens\":{prompt},\"total_tokens\":{total},\"completion_tokens\":{completion}"
    ));
}

impl ResponseMeta {
    /// The shared fields of one response.
    pub fn new(kind: ApiKind, id: String, created: u64, model: String) -> Self {
        let mut m = Self {
            kind,
            id,
            created,
            model,
            chunk_head: String::new(),
        };
        m.chunk_head = m.render_head(true);
        m
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (ApiKind::Chat, true) => "chat.completion.chunk",
            (ApiKind::Chat, false) => "chat.completion",
            (ApiKind::Completions, _) => "text_completion",
        }
    }

    /// `{"id":…,"object":…,"created":…,"model":…,"choices":[` of a chunk (`stream`) or of
    /// a full response.
    fn head(&self, stream: bool) -> String {
        if stream {
            let mut out = String::with_capacity(self.chunk_head.len() + 160);
            out.push_str(&self.chunk_head);
            return out;
        }
        self.render_head(false)
    }

    fn render_head(&self, stream: bool) -> String {
        format!(
            "{{\"id\":{},\"object\":\"{}\",\"created\":{},\"model\":{},\"choices\":[",
            quoted(&self.id),
            self.object(stream),
            self.created,
            quoted(&self.model)
        )
    }

    /// Closes a chunk after its choices: the running usage (prompt tokens and tokens so
    /// far) when continuous usage is sent, else nothing (chat) or `"usage":null`
    /// (completions).
    fn chunk_tail(&self, out: &mut String, running: Option<(u32, u32)>) {
        out.push(']');
        match (running, self.kind) {
            (Some((prompt, done)), kind) => {
                out.push_str(",\"usage\":");
                usage_counts(out, prompt, done);
                if kind == ApiKind::Completions {
                    out.push_str(",\"prompt_tokens_details\":null");
                }
                out.push('}');
            }
            (None, ApiKind::Chat) => {}
            (None, ApiKind::Completions) => out.push_str(",\"usage\":null"),
        }
        out.push('}');
    }

    /// The chat role chunk vLLM sends for choice `index` before the first content; `running`
    /// is `(prompt_tokens, 0)` under continuous usage.
    pub fn role_chunk(&self, index: u32, running: Option<(u32, u32)>) -> String {
        let mut out = self.head(true);
        out.push_str(&format!(
            "{{\"index\":{index},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}"
        ));
        self.chunk_tail(&mut out, running);
        out
    }

    /// One content chunk of choice `index`; `finish` marks its last token (`"length"` or
    /// `"stop"`); `running` is `(prompt_tokens, the choice's completion tokens so far)` under
    /// continuous usage (vLLM counts each choice on its own there).
    pub fn content_chunk(
        &self,
        index: u32,
        text: &str,
        finish: Option<&str>,
        running: Option<(u32, u32)>,
    ) -> String {
        let mut out = self.head(true);
        let finish_json = finish.map(quoted);
        match self.kind {
            ApiKind::Chat => {
                out.push_str(&format!("{{\"index\":{index},\"delta\":{{\"content\":"));
                push_quoted(&mut out, text);
                out.push_str("},\"logprobs\":null,\"finish_reason\":");
                match &finish_json {
                    // vLLM sets `stop_reason` only on the finishing chunk.
                    Some(f) => {
                        out.push_str(f);
                        out.push_str(",\"stop_reason\":null}");
                    }
                    None => out.push_str("null}"),
                }
            }
            ApiKind::Completions => {
                out.push_str(&format!("{{\"index\":{index},\"text\":"));
                push_quoted(&mut out, text);
                out.push_str(",\"logprobs\":null,\"finish_reason\":");
                out.push_str(finish_json.as_deref().unwrap_or("null"));
                out.push_str(",\"stop_reason\":null}");
            }
        }
        self.chunk_tail(&mut out, running);
        out
    }

    /// The final usage-only chunk (`"choices":[]`) sent when `include_usage` is set.
    pub fn usage_chunk(&self, u: &Usage, details: PromptTokensDetails) -> String {
        let mut out = self.head(true);
        out.push_str("],\"usage\":");
        usage_counts(&mut out, u.prompt_tokens, u.completion_tokens);
        if let Some(n) = details.cached(u.cached_tokens) {
            out.push_str(&format!(
                ",\"prompt_tokens_details\":{{\"cached_tokens\":{n}}}"
            ));
        }
        out.push_str("}}");
        out
    }

    /// A complete non-streaming response with one choice per `(text, finish reason)`, indexed
    /// in order; `usage` is `None` when the engine reports none.
    pub fn full(
        &self,
        choices: &[(String, &str)],
        usage: Option<&Usage>,
        details: PromptTokensDetails,
    ) -> String {
        let mut out = self.head(false);
        for (index, (text, finish)) in choices.iter().enumerate() {
            if index > 0 {
                out.push(',');
            }
            match self.kind {
                ApiKind::Chat => {
                    out.push_str(&format!(
                        "{{\"index\":{index},\"message\":{{\"role\":\"assistant\",\"reasoning_content\":null,\"content\":"
                    ));
                    out.push_str(&quoted(text));
                    out.push_str(",\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":");
                }
                ApiKind::Completions => {
                    out.push_str(&format!("{{\"index\":{index},\"text\":"));
                    out.push_str(&quoted(text));
                    out.push_str(",\"logprobs\":null,\"finish_reason\":");
                }
            }
            out.push_str(&quoted(finish));
            out.push_str(",\"stop_reason\":null");
            if self.kind == ApiKind::Completions {
                out.push_str(",\"prompt_logprobs\":null");
            }
            out.push('}');
        }
        out.push(']');
        if let Some(u) = usage {
            out.push_str(",\"usage\":");
            usage_counts(&mut out, u.prompt_tokens, u.completion_tokens);
            match details.cached(u.cached_tokens) {
                Some(n) => out.push_str(&format!(
                    ",\"prompt_tokens_details\":{{\"cached_tokens\":{n}}}}}"
                )),
                None => out.push_str(",\"prompt_tokens_details\":null}"),
            }
        }
        if self.kind == ApiKind::Chat {
            out.push_str(",\"prompt_logprobs\":null");
        }
        out.push_str(",\"kv_transfer_params\":null}");
        out
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

/// One SSE event for a JSON payload.
pub fn sse(payload: &str) -> bytes::Bytes {
    let mut s = String::with_capacity(payload.len() + 8);
    s.push_str("data: ");
    s.push_str(payload);
    s.push_str("\n\n");
    bytes::Bytes::from(s)
}

/// The stream terminator.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn meta(kind: ApiKind) -> ResponseMeta {
        ResponseMeta::new(kind, "chatcmpl-1".into(), 7, "m\"q".into())
    }

    #[test]
    fn strings_are_escaped_as_serde_does() {
        for s in [
            "plain",
            "q\"b\\s",
            "tab\tnl\ncr\r",
            "\u{1}\u{8}\u{c}\u{1f}",
            "é😀",
        ] {
            assert_eq!(quoted(s), Value::String(s.into()).to_string(), "{s:?}");
        }
    }

    const U: Usage = Usage {
        prompt_tokens: 10,
        completion_tokens: 3,
        cached_tokens: 0,
    };

    #[test]
    fn chat_chunks_are_vllm_bytes() {
        let m = meta(ApiKind::Chat);
        let head = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"m\"q","choices":["#;
        assert_eq!(
            m.role_chunk(0, None),
            format!(
                r#"{head}{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}]}}"#
            )
        );
        assert_eq!(
            m.role_chunk(0, Some((10, 0))),
            format!(
                r#"{head}{{"index":0,"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null}}],"usage":{{"prompt_tokens":10,"total_tokens":10,"completion_tokens":0}}}}"#
            )
        );
        assert_eq!(
            m.content_chunk(0, "ab \n", None, None),
            format!(
                r#"{head}{{"index":0,"delta":{{"content":"ab \n"}},"logprobs":null,"finish_reason":null}}]}}"#
            )
        );
        assert_eq!(
            m.content_chunk(0, "x", Some("length"), Some((10, 3))),
            format!(
                r#"{head}{{"index":0,"delta":{{"content":"x"}},"logprobs":null,"finish_reason":"length","stop_reason":null}}],"usage":{{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3}}}}"#
            )
        );
        assert_eq!(
            m.usage_chunk(&U, PromptTokensDetails::Always),
            format!(
                r#"{head}],"usage":{{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":{{"cached_tokens":0}}}}}}"#
            )
        );
        assert_eq!(
            m.usage_chunk(&U, PromptTokensDetails::Nonzero),
            format!(
                r#"{head}],"usage":{{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3}}}}"#
            )
        );
        let cached = Usage {
            cached_tokens: 16,
            ..U
        };
        assert!(m
            .usage_chunk(&cached, PromptTokensDetails::Nonzero)
            .ends_with(r#""prompt_tokens_details":{"cached_tokens":16}}}"#));
        assert!(!m
            .usage_chunk(&cached, PromptTokensDetails::Off)
            .contains("prompt_tokens_details"));
    }

    #[test]
    fn completion_chunks_carry_usage_null() {
        let m = meta(ApiKind::Completions);
        let head = r#"{"id":"chatcmpl-1","object":"text_completion","created":7,"model":"m\"q","choices":["#;
        assert_eq!(
            m.content_chunk(0, "a", None, None),
            format!(
                r#"{head}{{"index":0,"text":"a","logprobs":null,"finish_reason":null,"stop_reason":null}}],"usage":null}}"#
            )
        );
        assert_eq!(
            m.content_chunk(0, "a", Some("stop"), Some((10, 1))),
            format!(
                r#"{head}{{"index":0,"text":"a","logprobs":null,"finish_reason":"stop","stop_reason":null}}],"usage":{{"prompt_tokens":10,"total_tokens":11,"completion_tokens":1,"prompt_tokens_details":null}}}}"#
            )
        );
    }

    #[test]
    fn full_responses_have_every_field() {
        let chat = meta(ApiKind::Chat).full(
            &[("hi".into(), "stop")],
            Some(&U),
            PromptTokensDetails::Nonzero,
        );
        assert_eq!(
            chat,
            r#"{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"m\"q","choices":[{"index":0,"message":{"role":"assistant","reasoning_content":null,"content":"hi","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":10,"total_tokens":13,"completion_tokens":3,"prompt_tokens_details":null},"prompt_logprobs":null,"kv_transfer_params":null}"#
        );
        let cmpl = meta(ApiKind::Completions).full(
            &[("hi".into(), "length")],
            None,
            PromptTokensDetails::Always,
        );
        assert_eq!(
            cmpl,
            r#"{"id":"chatcmpl-1","object":"text_completion","created":7,"model":"m\"q","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"kv_transfer_params":null}"#
        );
        for body in [chat, cmpl] {
            serde_json::from_str::<Value>(&body).unwrap();
        }
    }

    #[test]
    fn several_choices_are_indexed_in_order() {
        let m = meta(ApiKind::Completions);
        let body = m.full(
            &[("a".into(), "length"), ("b".into(), "stop")],
            Some(&U),
            PromptTokensDetails::Off,
        );
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["choices"][0]["index"], 0);
        assert_eq!(v["choices"][1]["index"], 1);
        assert_eq!(v["choices"][1]["text"], "b");
        assert_eq!(v["choices"][1]["finish_reason"], "stop");
        let chunk: Value = serde_json::from_str(&m.content_chunk(7, "x", None, None)).unwrap();
        assert_eq!(chunk["choices"][0]["index"], 7);
        let role: Value = serde_json::from_str(&meta(ApiKind::Chat).role_chunk(3, None)).unwrap();
        assert_eq!(role["choices"][0]["index"], 3);
    }
}
