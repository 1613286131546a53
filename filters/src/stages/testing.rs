//! Stages that exercise the host capabilities through a real proxy, each switched on per
//! request by a test header (which the stage removes before the request goes upstream).
//! An adapter accepts them only in its test build (the `test-stages` feature of either
//! module, under the config key `testStages`), so a release build never carries them;
//! the builder ([`super::build`]) runs them before the filter's own stages.
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
use crate::pipeline::{reply, BodyProgress, RequestContext, Stage};
use crate::reply::Reply;
use crate::FilterStatus;

use super::build::StageBox;

/// The request header that asks [`PauseStage`] for a pause of that many milliseconds.
pub const PAUSE_HEADER: &str = "x-infergate-test-pause-ms";
/// The request header [`PauseStage`] sets on resume.
pub const RESUMED_HEADER: &str = "x-infergate-test-resumed";
/// The request header that asks [`ReplaceBodyStage`] for a new body with this text.
pub const REPLACE_BODY_HEADER: &str = "x-infergate-test-replace-body";
/// The request header that asks [`RewriteChunksStage`] to rewrite the response.
pub const REWRITE_CHUNKS_HEADER: &str = "x-infergate-test-rewrite-chunks";

/// The test stage called `name`, if there is one; `wake_later` is how the host wakes a
/// paused request from elsewhere after a delay. `S` is the box the adapter keeps its
/// stages in.
pub fn by_name<H, S>(name: &str, wake_later: WakeLater) -> Option<Box<S>>
where
    H: TestHost + ?Sized,
    S: StageBox<H> + ?Sized,
{
    TestStage::named(name).map(|stage| stage.boxed(wake_later))
}

/// What a host offers the test stages.
pub trait TestHost:
    RequestHeaders + RequestBody + RequestWaker + ResponseHeaders + ResponseChunk + LocalReply + Stats
{
}

impl<T> TestHost for T where
    T: RequestHeaders
        + RequestBody
        + RequestWaker
        + ResponseHeaders
        + ResponseChunk
        + LocalReply
        + Stats
        + ?Sized
{
}

/// The filter config key that lists test stages (names of [`by_name`]), run before the
/// filter's own stages.
pub const TEST_STAGES_KEY: &str = "testStages";

/// One test stage, by its name in [`TEST_STAGES_KEY`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TestStage {
    Pause,
    ReplaceBody,
    RewriteChunks,
}

impl TestStage {
    fn named(name: &str) -> Option<TestStage> {
        match name {
            "pause" => Some(TestStage::Pause),
            "replace-body" => Some(TestStage::ReplaceBody),
            "rewrite-chunks" => Some(TestStage::RewriteChunks),
            _ => None,
        }
    }

    fn boxed<H, S>(self, wake_later: WakeLater) -> Box<S>
    where
        H: TestHost + ?Sized,
        S: StageBox<H> + ?Sized,
    {
        match self {
            TestStage::Pause => S::boxed(PauseStage { wake_later }),
            TestStage::ReplaceBody => S::boxed(ReplaceBodyStage),
            TestStage::RewriteChunks => S::boxed(RewriteChunksStage),
        }
    }
}

/// The test stages a filter config lists, in order, with how the host wakes a paused
/// request (see [`by_name`]). The builder ([`super::build`]) runs them before the filter's
/// own stages.
#[derive(Clone, Debug, Default)]
pub struct TestStages {
    stages: Vec<TestStage>,
    wake_later: Option<WakeLater>,
}

impl TestStages {
    /// No test stages (a release build: the config key stays for the filter's own parser
    /// to refuse).
    pub fn none() -> TestStages {
        TestStages::default()
    }

    /// Takes [`TEST_STAGES_KEY`] out of a filter's `config`: the stages it names, in order;
    /// none if the key is absent. An adapter calls this only in its test build, so a
    /// release build leaves the key for the filter's own config parser to refuse.
    pub fn take_from_config(
        config: &mut serde_json::Value,
        wake_later: WakeLater,
    ) -> Result<TestStages, String> {
        let Some(names) = config
            .as_object_mut()
            .and_then(|m| m.remove(TEST_STAGES_KEY))
        else {
            return Ok(TestStages::none());
        };
        let names = names
            .as_array()
            .ok_or_else(|| format!("{TEST_STAGES_KEY} must be a list of stage names"))?;
        let names: Vec<&str> = names
            .iter()
            .map(|name| name.as_str().unwrap_or_default())
            .collect();
        TestStages::named(&names, wake_later)
    }

    /// The test stages called `names` (names of [`by_name`]), in order.
    pub fn named(names: &[&str], wake_later: WakeLater) -> Result<TestStages, String> {
        let stages = names
            .iter()
            .map(|name| {
                TestStage::named(name)
                    .ok_or_else(|| format!("{TEST_STAGES_KEY}: unknown test stage `{name}`"))
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(TestStages {
            stages,
            wake_later: Some(wake_later),
        })
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The stages, boxed as the adapter keeps them.
    pub(crate) fn boxed<H, S>(&self) -> Vec<Box<S>>
    where
        H: TestHost + ?Sized,
        S: StageBox<H> + ?Sized,
    {
        // Only a config that named stages gave a wake.
        let Some(wake_later) = self.wake_later else {
            return Vec::new();
        };
        self.stages
            .iter()
            .map(|stage| stage.boxed(wake_later))
            .collect()
    }
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

impl<H: RequestHeaders + RequestWaker + LocalReply + ?Sized> Stage<H> for PauseStage {
    fn name(&self) -> &'static str {
        "pause"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        _eos: bool,
    ) -> FilterStatus {
        let Some(ms) = host
            .request_header(PAUSE_HEADER)
            .and_then(|v| v.trim().parse::<u64>().ok())
        else {
            return FilterStatus::Continue;
        };
        host.remove_request_header(PAUSE_HEADER);
        match host.request_waker() {
            Ok(waker) => {
                cx.insert(PausedOn(std::thread::current().id()));
                (self.wake_later)(waker, Duration::from_millis(ms));
                FilterStatus::Pause
            }
            Err(e) => reply(host, &Reply::internal(&format!("no waker: {e:?}"))),
        }
    }

    fn on_resume(&self, cx: &mut RequestContext, host: &mut H) -> FilterStatus {
        let same = cx
            .get::<PausedOn>()
            .is_some_and(|p| p.0 == std::thread::current().id());
        let value = if same { "same-thread" } else { "other-thread" };
        host.set_request_header(RESUMED_HEADER, value);
        FilterStatus::Continue
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

impl<H: RequestHeaders + RequestBody + LocalReply + ?Sized> Stage<H> for ReplaceBodyStage {
    fn name(&self) -> &'static str {
        "replace-body"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        _eos: bool,
    ) -> FilterStatus {
        if let Some(text) = host.request_header(REPLACE_BODY_HEADER) {
            host.remove_request_header(REPLACE_BODY_HEADER);
            cx.insert(ReplaceWith(text));
            cx.need_request_body();
        }
        FilterStatus::Continue
    }

    fn on_request_body(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        body: BodyProgress,
    ) -> FilterStatus {
        if !body.end_of_stream {
            return FilterStatus::Continue;
        }
        let Some(ReplaceWith(text)) = cx.remove::<ReplaceWith>() else {
            return FilterStatus::Continue;
        };
        let old = host.request_body(0, body.buffered_len).unwrap_or_default();
        let model = serde_json::from_slice::<serde_json::Value>(&old)
            .ok()
            .and_then(|v| v.get("model").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_default();
        match host.replace_request_body(&replaced_body(&model, &text)) {
            Ok(()) => FilterStatus::Continue,
            Err(e) => reply(
                host,
                &Reply::internal(&format!("body replacement failed: {e:?}")),
            ),
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

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        _eos: bool,
    ) -> FilterStatus {
        if host.request_header(REWRITE_CHUNKS_HEADER).is_some() {
            host.remove_request_header(REWRITE_CHUNKS_HEADER);
            cx.insert(Rewrite::Asked);
        }
        FilterStatus::Continue
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
