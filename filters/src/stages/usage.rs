//! The usage stage: make the engine report usage, and read it from the response as it
//! streams past.
//!
//! Request side: usage only arrives in a stream if `stream_options.include_usage` is true,
//! and a stream cut off mid-way can only be billed for what was generated if every chunk
//! carries its usage (`continuous_usage_stats`), so both are forced on for streamed OpenAI
//! requests (the body is rewritten; the host fixes `content-length`). Anthropic messages
//! always report usage.
//!
//! Response side: a [`UsageTracker`] observes every chunk unbuffered and removes from the
//! client's stream what the client did not ask for (the usage-only chunk, the per-chunk
//! usage fields); otherwise the stream is byte-identical to the engine's. A
//! `/v1/completions` stream keeps its per-chunk `"usage"` member with the value `null`,
//! as the engine writes it when usage was not asked for.

use serde_json::{Map, Value};

use scheduler_core::request::Api;
use scheduler_core::usage::{BodyKind, ClientWants, Forward, UsageTracker};

use crate::host::{RequestBody, ResponseChunk, ResponseHeaders, Stats};
use crate::pipeline::{RequestContext, Stage};
use crate::router::RoutedRequest;
use crate::FilterStatus;

use super::tenancy::{tenant_request, Metering};

/// The usage stage (no configuration of its own).
#[derive(Clone, Copy, Debug, Default)]
pub struct UsageStage;

/// What the client itself asked for, kept from the request side to the response side.
#[derive(Clone, Copy, Debug)]
struct Asked {
    wants: ClientWants,
}

/// The `stream_options` the gateway sends upstream.
const FORCED: &str = r#""stream_options":{"include_usage":true,"continuous_usage_stats":true}"#;

/// `body` with usage reporting forced on, or `None` if it cannot be rewritten (not a JSON
/// object: the router would not have routed it). A body without `stream_options` gets the
/// member inserted first, every other byte kept; one with it is re-serialised with its
/// flags set.
pub fn force_usage(body: &[u8]) -> Option<Vec<u8>> {
    let has_options = memchr::memmem::find(body, b"\"stream_options\"").is_some();
    if !has_options {
        let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
        if body.get(open) != Some(&b'{') {
            return None;
        }
        let rest = body.get(open + 1..)?;
        let empty = rest
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|b| *b == b'}');
        let mut out = Vec::with_capacity(body.len() + FORCED.len() + 1);
        out.extend_from_slice(body.get(..=open)?);
        out.extend_from_slice(FORCED.as_bytes());
        if !empty {
            out.push(b',');
        }
        out.extend_from_slice(rest);
        return Some(out);
    }
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object_mut()?;
    let options = object
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !options.is_object() {
        *options = Value::Object(Map::new());
    }
    if let Some(options) = options.as_object_mut() {
        options.insert("include_usage".to_owned(), Value::Bool(true));
        options.insert("continuous_usage_stats".to_owned(), Value::Bool(true));
    }
    serde_json::to_vec(&value).ok()
}

fn needs_forcing(routed: &RoutedRequest) -> bool {
    routed.stream
        && routed.api != Api::AnthropicMessages
        && !(routed.include_usage && routed.continuous_usage)
}

/// What the client of `routed` asked for, as the tracker needs it.
fn client_wants(routed: &RoutedRequest) -> ClientWants {
    if routed.stream && routed.api != Api::AnthropicMessages {
        ClientWants {
            include_usage: routed.include_usage,
            continuous_usage: routed.continuous_usage,
            // vLLM's completions stream writes `"usage":null` when usage was not asked
            // for; its chat stream leaves the member out.
            null_when_absent: routed.api == Api::Completions,
        }
    } else {
        // Nothing is forced: whatever the engine sends is what the client asked for.
        ClientWants {
            include_usage: true,
            continuous_usage: true,
            null_when_absent: false,
        }
    }
}

impl<H> Stage<H> for UsageStage
where
    H: RequestBody + ResponseHeaders + ResponseChunk + Stats + ?Sized,
{
    fn name(&self) -> &'static str {
        "usage"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        _end_of_stream: bool,
    ) -> FilterStatus {
        let Some((_, routed)) = tenant_request(cx) else {
            return FilterStatus::Continue;
        };
        let wants = client_wants(&routed);
        if needs_forcing(&routed) {
            // The router buffered the whole body before this stage runs.
            let body = host.request_body(0, usize::MAX).unwrap_or_default();
            let forced = force_usage(&body);
            let replaced = forced.is_some_and(|b| host.replace_request_body(&b).is_ok());
            if !replaced {
                // Usage is then what the engine volunteers, else the chunk count.
                cx.insert(Asked {
                    wants: ClientWants {
                        include_usage: true,
                        continuous_usage: true,
                        null_when_absent: false,
                    },
                });
                return FilterStatus::Continue;
            }
        }
        cx.insert(Asked { wants });
        FilterStatus::Continue
    }

    fn on_response_headers(&self, cx: &mut RequestContext, host: &mut H, _end_of_stream: bool) {
        let Some(asked) = cx.get::<Asked>().copied() else {
            return;
        };
        let kind = match host.response_header("content-type") {
            Some(t) if t.trim_start().starts_with("text/event-stream") => BodyKind::EventStream,
            _ => BodyKind::Json,
        };
        cx.insert(Metering {
            tracker: UsageTracker::new(kind, asked.wants),
            out: Vec::new(),
        });
    }

    fn on_response_chunk(&self, cx: &mut RequestContext, host: &mut H, end_of_stream: bool) {
        let Some(metering) = cx.get_mut::<Metering>() else {
            return;
        };
        let Some(chunk) = host.response_chunk() else {
            return;
        };
        // One output buffer for the whole response, not one per chunk.
        let out = &mut metering.out;
        if metering.tracker.feed(&chunk, end_of_stream, out) == Forward::Replaced
            && host.replace_response_chunk(out).is_err()
        {
            // The host forwarded the engine's bytes: the client then sees usage it did not
            // ask for, never a broken stream; usage is still read.
            metering.tracker.stop_rewriting();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn routed(api: Api) -> RoutedRequest {
        RoutedRequest {
            api,
            model: "m".into(),
            target_model: "m".into(),
            base_model: "m".into(),
            prompt_tokens: 1,
            max_output_tokens: None,
            output_sequences: 1,
            stream: true,
            include_usage: false,
            continuous_usage: false,
        }
    }

    /// What a client of `api` that asked for no usage receives of the forced `stream`.
    fn client_stream(api: Api, stream: &str) -> String {
        let mut tracker = UsageTracker::new(BodyKind::EventStream, client_wants(&routed(api)));
        let mut client = Vec::new();
        let mut out = Vec::new();
        for (i, line) in stream.split_inclusive('\n').enumerate() {
            let last = i + 1 == stream.split_inclusive('\n').count();
            match tracker.feed(line.as_bytes(), last, &mut out) {
                Forward::Unchanged => client.extend_from_slice(line.as_bytes()),
                Forward::Replaced => client.extend_from_slice(&out),
            }
        }
        String::from_utf8(client).unwrap()
    }

    #[test]
    fn a_completions_client_gets_null_usage_a_chat_client_no_member() {
        // vLLM's shapes with usage forced on: per-chunk usage, then the usage-only chunk.
        let usage = r#""usage":{"prompt_tokens":5,"total_tokens":6,"completion_tokens":1}"#;
        let completions = format!(
            "data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"Hi\",\"logprobs\":null,\"finish_reason\":null}}],{usage}}}\n\n\
             data: {{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[],{usage}}}\n\n\
             data: [DONE]\n\n"
        );
        assert_eq!(
            client_stream(Api::Completions, &completions),
            "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"Hi\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n\
             data: [DONE]\n\n"
        );
        let chat = format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}}}}],{usage}}}\n\n\
             data: [DONE]\n\n"
        );
        assert_eq!(
            client_stream(Api::ChatCompletions, &chat),
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
             data: [DONE]\n\n"
        );
        assert!(!client_wants(&routed(Api::AnthropicMessages)).null_when_absent);
    }

    fn forced(body: &str) -> Value {
        serde_json::from_slice(&force_usage(body.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn forcing_inserts_or_sets_both_flags() {
        for body in [
            r#"{"model":"m","stream":true}"#,
            r#"  { "model":"m"}"#,
            r#"{}"#,
            r#"{"model":"m","stream_options":{"include_usage":false}}"#,
            r#"{"model":"m","stream_options":null}"#,
            r#"{"model":"m","stream_options":{"x":1}}"#,
        ] {
            let v = forced(body);
            assert_eq!(v["stream_options"]["include_usage"], true, "{body}");
            assert_eq!(
                v["stream_options"]["continuous_usage_stats"], true,
                "{body}"
            );
        }
        assert_eq!(
            forced(r#"{"model":"m","stream_options":{"x":1}}"#)["stream_options"]["x"],
            1
        );
        // Without stream_options every byte of the client's body is kept, in place.
        let body = br#"{"model":"m","messages":[{"role":"user","content":"1e308 \u00e9"}]}"#;
        let out = force_usage(body).unwrap();
        assert!(out.ends_with(&body[1..]));
        assert_eq!(force_usage(b"[1]"), None);
        assert_eq!(force_usage(b""), None);
    }
}
