//! Stages that exercise the host capabilities through a real proxy, each switched on per
//! request by a test header (which the stage removes before the request goes upstream).
//! An adapter accepts them only in its test build (the native module's `test-stages`
//! feature, under the config key `testStages`), so a release build never carries them.
//!
//! - [`PauseStage`] (`pause`): `x-infergate-test-pause-ms: <ms>` pauses the request at its
//!   headers and hands the request's [`Waker`] to the adapter's `wake_later`, which wakes it
//!   from elsewhere (native: another thread) after that many milliseconds. On resume the
//!   request goes upstream with `x-infergate-test-resumed: same-thread` (or `other-thread`
//!   if the resume ran on another thread than the pause, which the host must never do).
//! - [`ReplaceBodyStage`] (`replace-body`): `x-infergate-test-replace-body: <text>` waits
//!   for the whole body and replaces it with [`replaced_body`] of its `model` and `<text>`.
//! - [`RewriteChunksStage`] (`rewrite-chunks`): `x-infergate-test-rewrite-chunks: 1` makes
//!   every chunk of a `text/event-stream` response pass upper-cased (ASCII), one at a time.

use core::time::Duration;
use std::thread::ThreadId;

use crate::host::{
    LocalReply, RequestBody, RequestHeaders, RequestWaker, ResponseChunk, ResponseHeaders, Stats,
    Waker,
};
use crate::pipeline::{BodyProgress, RequestContext, Stage, Step};
use crate::reply::Reply;

/// The request header that asks [`PauseStage`] for a pause of that many milliseconds.
pub const PAUSE_HEADER: &str = "x-infergate-test-pause-ms";
/// The request header [`PauseStage`] sets on resume.
pub const RESUMED_HEADER: &str = "x-infergate-test-resumed";
/// The request header that asks [`ReplaceBodyStage`] for a new body with this text.
pub const REPLACE_BODY_HEADER: &str = "x-infergate-test-replace-body";
/// The request header that asks [`RewriteChunksStage`] to rewrite the response.
pub const REWRITE_CHUNKS_HEADER: &str = "x-infergate-test-rewrite-chunks";

/// The test stage called `name`, if there is one; `wake_later` is how the host wakes a
/// paused request from elsewhere after a delay.
pub fn by_name<H>(name: &str, wake_later: WakeLater) -> Option<Box<dyn Stage<H> + Send + Sync>>
where
    H: RequestHeaders
        + RequestBody
        + RequestWaker
        + ResponseHeaders
        + ResponseChunk
        + LocalReply
        + Stats
        + ?Sized,
{
    match name {
        "pause" => Some(Box::new(PauseStage { wake_later })),
        "replace-body" => Some(Box::new(ReplaceBodyStage)),
        "rewrite-chunks" => Some(Box::new(RewriteChunksStage)),
        _ => None,
    }
}

/// The filter config key that lists test stages (names of [`by_name`]), run before the
/// filter's own stage.
pub const TEST_STAGES_KEY: &str = "testStages";

/// Takes [`TEST_STAGES_KEY`] out of a filter's `config` and builds the stages it names, in
/// order; none if the key is absent. An adapter calls this only in its test build, so a
/// release build leaves the key for the filter's own config parser to refuse.
pub fn take_from_config<H>(
    config: &mut serde_json::Value,
    wake_later: WakeLater,
) -> Result<Vec<Box<dyn Stage<H> + Send + Sync>>, String>
where
    H: RequestHeaders
        + RequestBody
        + RequestWaker
        + ResponseHeaders
        + ResponseChunk
        + LocalReply
        + Stats
        + ?Sized,
{
    let Some(names) = config
        .as_object_mut()
        .and_then(|m| m.remove(TEST_STAGES_KEY))
    else {
        return Ok(Vec::new());
    };
    let names = names
        .as_array()
        .ok_or_else(|| format!("{TEST_STAGES_KEY} must be a list of stage names"))?;
    names
        .iter()
        .map(|name| {
            let name = name.as_str().unwrap_or_default();
            by_name(name, wake_later)
                .ok_or_else(|| format!("{TEST_STAGES_KEY}: unknown test stage `{name}`"))
        })
        .collect()
}

/// Wakes `waker` from elsewhere after the delay (the adapter's choice of "elsewhere").
pub type WakeLater = fn(Waker, Duration);

/// See the module doc.
pub struct PauseStage {
    wake_later: WakeLater,
}

impl PauseStage {
    /// A pause stage whose wakes come from `wake_later`.
    pub fn new(wake_later: WakeLater) -> PauseStage {
        PauseStage { wake_later }
    }
}

/// Where [`PauseStage`] paused a request.
struct PausedOn(ThreadId);

impl<H: RequestHeaders + RequestWaker + ?Sized> Stage<H> for PauseStage {
    fn name(&self) -> &'static str {
        "pause"
    }

    fn on_request_headers(&self, cx: &mut RequestContext, host: &mut H, _eos: bool) -> Step {
        let Some(ms) = host
            .request_header(PAUSE_HEADER)
            .and_then(|v| v.trim().parse::<u64>().ok())
        else {
            return Step::Next;
        };
        host.remove_request_header(PAUSE_HEADER);
        match host.request_waker() {
            Ok(waker) => {
                cx.insert(PausedOn(std::thread::current().id()));
                (self.wake_later)(waker, Duration::from_millis(ms));
                Step::Pause
            }
            Err(e) => Step::Reply(Reply::internal(&format!("no waker: {e:?}"))),
        }
    }

    fn on_resume(&self, cx: &mut RequestContext, host: &mut H) -> Step {
        let same = cx
            .get::<PausedOn>()
            .is_some_and(|p| p.0 == std::thread::current().id());
        let value = if same { "same-thread" } else { "other-thread" };
        host.set_request_header(RESUMED_HEADER, value);
        Step::Next
    }
}

/// The body [`ReplaceBodyStage`] sends upstream for a request of `model` asking for `text`.
pub fn replaced_body(model: &str, text: &str) -> Vec<u8> {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": text}],
    })
    .to_string()
    .into_bytes()
}

/// See the module doc.
pub struct ReplaceBodyStage;

/// The text a request asked [`ReplaceBodyStage`] to put in its new body.
struct ReplaceWith(String);

impl<H: RequestHeaders + RequestBody + ?Sized> Stage<H> for ReplaceBodyStage {
    fn name(&self) -> &'static str {
        "replace-body"
    }

    fn on_request_headers(&self, cx: &mut RequestContext, host: &mut H, _eos: bool) -> Step {
        if let Some(text) = host.request_header(REPLACE_BODY_HEADER) {
            host.remove_request_header(REPLACE_BODY_HEADER);
            cx.insert(ReplaceWith(text));
            cx.need_request_body();
        }
        Step::Next
    }

    fn on_request_body(&self, cx: &mut RequestContext, host: &mut H, body: BodyProgress) -> Step {
        if !body.end_of_stream {
            return Step::Next;
        }
        let Some(ReplaceWith(text)) = cx.remove::<ReplaceWith>() else {
            return Step::Next;
        };
        let old = host.request_body(0, body.buffered_len).unwrap_or_default();
        let model = serde_json::from_slice::<serde_json::Value>(&old)
            .ok()
            .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_default();
        match host.replace_request_body(&replaced_body(&model, &text)) {
            Ok(()) => Step::Next,
            Err(e) => Step::Reply(Reply::internal(&format!("body replacement failed: {e:?}"))),
        }
    }
}

/// See the module doc.
pub struct RewriteChunksStage;

/// Whether [`RewriteChunksStage`] rewrites this request's response.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rewrite {
    Asked,
    Active,
}

impl<H> Stage<H> for RewriteChunksStage
where
    H: RequestHeaders + ResponseHeaders + ResponseChunk + Stats + ?Sized,
{
    fn name(&self) -> &'static str {
        "rewrite-chunks"
    }

    fn on_request_headers(&self, cx: &mut RequestContext, host: &mut H, _eos: bool) -> Step {
        if host.request_header(REWRITE_CHUNKS_HEADER).is_some() {
            host.remove_request_header(REWRITE_CHUNKS_HEADER);
            cx.insert(Rewrite::Asked);
        }
        Step::Next
    }

    fn on_response_headers(&self, cx: &mut RequestContext, host: &mut H, _eos: bool) {
        let streamed = host
            .response_header("content-type")
            .is_some_and(|t| t.starts_with("text/event-stream"));
        if let Some(rewrite) = cx.get_mut::<Rewrite>() {
            if streamed {
                *rewrite = Rewrite::Active;
            }
        }
    }

    fn on_response_chunk(&self, cx: &mut RequestContext, host: &mut H, _eos: bool) {
        if cx.get::<Rewrite>() != Some(&Rewrite::Active) {
            return;
        }
        let Some(chunk) = host.response_chunk() else {
            return;
        };
        if let Err(e) = host.replace_response_chunk(&chunk.to_ascii_uppercase()) {
            host.log_error(&format!(
                "rewrite-chunks: the host refused a rewrite: {e:?}"
            ));
        }
    }
}
