//! The one generic adapter: an Envoy HTTP filter that runs a pipeline the filters crate's
//! builder (`infergate_filters::stages::build`) assembled. `router.rs`, `picker.rs` and
//! `gateway.rs` only turn their configs into a [`PipelineFactory`] (the builder's pipeline,
//! over this process's state); everything a stream does is here.
//!
//! Per stream, [`PipelineStream`] holds the request's [`Run`] (its context: whatever the
//! stages keep about the request, the picker's in-flight lease included) and its
//! [`StreamHost`]. Every hook binds the host to the hook's stream and hands the event to the
//! run; the run's [`FilterStatus`] becomes the hook's status. A wake
//! (`on_http_filter_scheduled`, on the stream's worker) resumes the paused stage, and when the
//! request side is then done, decoding continues.
//!
//! **The end, on every path.** The run's end (every stage's `on_end`: the lease given back,
//! the in-flight gauges lowered) runs from `stream_complete`, or, when Envoy skipped that (a
//! completion re-entered from inside a hook, a panic), from the destroy hook: Envoy runs
//! `on_http_filter_destroy` from a member function of its live filter object, whose config
//! holds the gauges, so the stream's `filter_envoy_ptr`, kept from its last hook, still
//! reaches them there. The context is dropped with the stream object in the destroy hook
//! whatever happened before, so nothing it holds outlives the stream.

use std::sync::Arc;

use infergate_filters::pipeline::{Run, Stage, SyncPipeline};
use infergate_filters::stages::TestStages;
use infergate_filters::FilterStatus;

use crate::abi::{BodyStatus, HeadersStatus, HttpFilterConfigEnvoyPtr, TrailersStatus};
use crate::adapter::{HookKind, HostConfig, StreamHost};
use crate::filter::{FilterConfigHandle, StreamFactory, StreamLogic};
use crate::flush::{ConfigMetrics, FlushTicks};
use crate::host::EnvoyStream;
use crate::stats::StatsRegistry;
use infergate_filters::stats::{StatKey, StatKind};

/// A stage the native adapter can run.
pub type NativeStage = Box<dyn Stage<StreamHost> + Send + Sync>;

/// The stages of one filter config.
pub type NativePipeline = SyncPipeline<StreamHost>;

/// One filter config: its pipeline, what its streams' hosts share, and what must live as
/// long as the config (registrations in the process's config registry).
pub struct PipelineFactory {
    pipeline: Arc<NativePipeline>,
    host: Arc<HostConfig>,
    _keep: Vec<Box<dyn Send + Sync>>,
}

impl PipelineFactory {
    /// A config running `pipeline` (built by `infergate_filters::stages::build`); `keep`
    /// lives as long as the config.
    pub fn new(
        pipeline: NativePipeline,
        host: HostConfig,
        keep: Vec<Box<dyn Send + Sync>>,
    ) -> PipelineFactory {
        PipelineFactory {
            pipeline: Arc::new(pipeline),
            host: Arc::new(host),
            _keep: keep,
        }
    }

    /// The stages' names, in order.
    pub fn stage_names(&self) -> Vec<&'static str> {
        self.pipeline.names()
    }
}

/// What the streams of a filter config whose stages emit `keys` share: those stats,
/// defined on Envoy's config and flushed to it every `crate::flush::FLUSH_PERIOD`.
pub fn host_config(envoy: &mut FilterConfigHandle, keys: &[(StatKind, &StatKey)]) -> HostConfig {
    let flush = FlushTicks::start(envoy);
    HostConfig {
        stats: StatsRegistry::define(envoy, keys, flush.is_some()),
        flush,
    }
}

impl StreamFactory for PipelineFactory {
    fn flush_stats(&self, envoy: HttpFilterConfigEnvoyPtr) {
        self.host.stats.flush(&mut ConfigMetrics::new(envoy));
    }

    fn new_stream(&self) -> Box<dyn StreamLogic> {
        Box::new(PipelineStream {
            pipeline: Arc::clone(&self.pipeline),
            host: StreamHost::new(Arc::clone(&self.host)),
            run: Run::new(),
            reply_seen: false,
        })
    }
}

/// One stream through a pipeline (see the module doc).
pub struct PipelineStream {
    pipeline: Arc<NativePipeline>,
    host: StreamHost,
    run: Run,
    /// Whether the stages were given the headers of a local reply a stage sent.
    reply_seen: bool,
}

impl PipelineStream {
    /// A request-body event (a body hook, or the trailers that end the body).
    fn body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> FilterStatus {
        self.host.bind(envoy, HookKind::RequestBody);
        if end_of_stream {
            self.host.mark_body_complete();
        }
        let len = envoy.request_body_len();
        let status = self
            .run
            .request_body(&self.pipeline, &mut self.host, len, end_of_stream);
        self.after_request_event(status)
    }

    /// Envoy never runs a module's response hooks for a local reply the module itself sent
    /// (its `sent_local_reply_` guard), so when a stage of this pipeline answered, the
    /// stages get the reply's headers here instead, once, as they would in a filter later
    /// in the chain (the two-filter form, where the router's tenancy stages see the
    /// picker's refusals).
    fn after_request_event(&mut self, status: FilterStatus) -> FilterStatus {
        if status == FilterStatus::Replied && self.host.sent_local_reply() && !self.reply_seen {
            self.reply_seen = true;
            self.run
                .response_headers(&self.pipeline, &mut self.host, false);
        }
        status
    }
}

impl StreamLogic for PipelineStream {
    fn on_request_headers(
        &mut self,
        envoy: &mut EnvoyStream,
        end_of_stream: bool,
    ) -> HeadersStatus {
        self.host.bind(envoy, HookKind::Other);
        if end_of_stream {
            self.host.mark_body_complete();
        }
        let status = self
            .run
            .request_headers(&self.pipeline, &mut self.host, end_of_stream);
        self.after_request_event(status).into()
    }

    fn on_request_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> BodyStatus {
        self.body(envoy, end_of_stream).into()
    }

    fn on_request_trailers(&mut self, envoy: &mut EnvoyStream) -> TrailersStatus {
        // Trailers end the request: whatever was buffered is the whole body.
        self.body(envoy, true).into()
    }

    fn on_scheduled(&mut self, envoy: &mut EnvoyStream, _event_id: u64) {
        self.host.bind(envoy, HookKind::Other);
        // A stop asked for here completes the stream inside Envoy's call, and Envoy logs it
        // there: the run ends first (`StreamHost::defer_stops`).
        self.host.defer_stops(true);
        // Only a run that held the stream and is now done with the request side restarts
        // it; a late wake (nothing paused) leaves the stream alone; a signal may stop it.
        match self.run.wake(&self.pipeline, &mut self.host) {
            Some(FilterStatus::Continue) => envoy.continue_decoding(),
            Some(status) => {
                self.after_request_event(status);
            }
            None => {}
        }
        if self.host.has_deferred_stop() {
            self.run.end(&self.pipeline, &mut self.host);
        }
        self.host.apply_deferred_stop();
    }

    fn on_response_headers(
        &mut self,
        envoy: &mut EnvoyStream,
        end_of_stream: bool,
    ) -> HeadersStatus {
        self.host.bind(envoy, HookKind::Other);
        self.run
            .response_headers(&self.pipeline, &mut self.host, end_of_stream);
        HeadersStatus::Continue
    }

    fn on_response_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> BodyStatus {
        self.host.bind(envoy, HookKind::ResponseBody);
        self.run
            .response_chunk(&self.pipeline, &mut self.host, end_of_stream);
        BodyStatus::Continue
    }

    fn on_response_trailers(&mut self, envoy: &mut EnvoyStream) -> TrailersStatus {
        self.host.bind(envoy, HookKind::Other);
        self.run.response_trailers();
        TrailersStatus::Continue
    }

    fn on_stream_complete(&mut self, envoy: &mut EnvoyStream) {
        self.host.bind(envoy, HookKind::Other);
        self.run.end(&self.pipeline, &mut self.host);
    }
}

impl Drop for PipelineStream {
    /// A stream destroyed without `stream_complete` (or after a panic) still ends its run;
    /// a no-op when the end already ran (see the module doc).
    fn drop(&mut self) {
        if self.run.has_ended() || !self.host.is_bound() {
            // Never bound: no hook ran, so no stage holds anything to give back.
            return;
        }
        // The host still points at the stream of its last hook: Envoy drops streams only
        // from `on_http_filter_destroy`, run from its live filter object (module doc).
        self.run.end(&self.pipeline, &mut self.host);
    }
}

/// Takes `testStages` ([`TestStages::take_from_config`]) out of a filter's config: the
/// builder runs those stages before the filter's own. Only in builds with the `test-stages`
/// feature; a release build leaves the key in place, so the filter's own config parser
/// refuses it as an unknown field.
#[cfg(feature = "test-stages")]
pub fn take_test_stages(config: &mut serde_json::Value) -> Result<TestStages, String> {
    TestStages::take_from_config(config, wake_from_another_thread)
}

/// See the `test-stages` variant: without the feature there are none.
#[cfg(not(feature = "test-stages"))]
pub fn take_test_stages(_config: &mut serde_json::Value) -> Result<TestStages, String> {
    Ok(TestStages::none())
}

/// The pause stage's "elsewhere": a thread of its own that wakes the request after `delay`.
#[cfg(any(test, feature = "test-stages"))]
pub(crate) fn wake_from_another_thread(
    waker: infergate_filters::host::Waker,
    delay: core::time::Duration,
) {
    let spawned = std::thread::Builder::new()
        .name("infergate-test-waker".into())
        .spawn(move || {
            std::thread::sleep(delay);
            waker.wake();
        });
    if spawned.is_err() {
        crate::log::error("infergate: the test waker thread could not start");
    }
}
