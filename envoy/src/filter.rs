//! The module-side objects behind Envoy's HTTP filter pointers: one [`HttpConfig`] per filter
//! config (shared by every worker, so `Sync`), one [`StreamState`] per HTTP stream.
//!
//! `filter_name` in Envoy's `DynamicModuleFilter` selects the logic: `router`, `picker` and
//! `gateway` (both in one filter) are each a pipeline of the filters crate's stages
//! (configured in `router.rs`, `picker.rs` and `gateway.rs`, run by the one generic adapter
//! in `pipeline.rs`); `probe` is a measuring tool (`probe.rs`). A `picker` or `gateway`
//! config that carries the process's scraper also hosts it (`scraper.rs`) for as long as it
//! lives. This file only dispatches.

use infergate_filters::stats::StatKind;

use crate::abi::{
    BodyStatus, HeadersStatus, HttpFilterConfigEnvoyPtr, LabelBuffers, ModuleBuffer, TrailersStatus,
};
use crate::host::EnvoyStream;
use crate::stats::DefineMetric;

/// The per-stream logic of one filter kind. Every method has a pass-through default.
pub trait StreamLogic {
    /// Request headers arrived.
    fn on_request_headers(
        &mut self,
        _envoy: &mut EnvoyStream,
        _end_of_stream: bool,
    ) -> HeadersStatus {
        HeadersStatus::Continue
    }
    /// A request body chunk arrived.
    fn on_request_body(&mut self, _envoy: &mut EnvoyStream, _end_of_stream: bool) -> BodyStatus {
        BodyStatus::Continue
    }
    /// Request trailers arrived (the request body, if any, is complete).
    fn on_request_trailers(&mut self, _envoy: &mut EnvoyStream) -> TrailersStatus {
        TrailersStatus::Continue
    }
    /// Response headers arrived.
    fn on_response_headers(
        &mut self,
        _envoy: &mut EnvoyStream,
        _end_of_stream: bool,
    ) -> HeadersStatus {
        HeadersStatus::Continue
    }
    /// A response body chunk arrived (never buffered: streamed responses pass through).
    fn on_response_body(&mut self, _envoy: &mut EnvoyStream, _end_of_stream: bool) -> BodyStatus {
        BodyStatus::Continue
    }
    /// Response trailers arrived (the response is complete).
    fn on_response_trailers(&mut self, _envoy: &mut EnvoyStream) -> TrailersStatus {
        TrailersStatus::Continue
    }
    /// Envoy ran an event this stream scheduled (a wake of a paused request), on the
    /// stream's worker thread.
    fn on_scheduled(&mut self, _envoy: &mut EnvoyStream, _event_id: u64) {}
    /// The stream ended (complete, reset or locally replied).
    fn on_stream_complete(&mut self, _envoy: &mut EnvoyStream) {}
}

/// Creates the per-stream logic of one filter config. Shared by all worker threads.
pub trait StreamFactory: Send + Sync {
    /// A fresh per-stream object.
    fn new_stream(&self) -> Box<dyn StreamLogic>;
}

/// Main-thread access to Envoy's filter-config object while the config is being created
/// (stats must be defined there).
pub struct FilterConfigHandle {
    raw: HttpFilterConfigEnvoyPtr,
}

impl FilterConfigHandle {
    /// Wraps the pointer passed to `on_http_filter_config_new`; used only during that hook.
    pub fn new(raw: HttpFilterConfigEnvoyPtr) -> FilterConfigHandle {
        FilterConfigHandle { raw }
    }

    /// Envoy's config pointer (for the scraper's callbacks on it, `crate::scraper`).
    pub fn raw(&self) -> HttpFilterConfigEnvoyPtr {
        self.raw
    }
}

impl DefineMetric for FilterConfigHandle {
    /// Defines a counter or gauge `name` with `labels`; its id, or `None` if Envoy refused.
    fn define(&mut self, kind: StatKind, name: &str, labels: &[&str]) -> Option<usize> {
        use crate::abi::callbacks as cb;
        let mut raw_labels = LabelBuffers::new(labels);
        let (ptr, count) = (raw_labels.as_mut_ptr(), raw_labels.count());
        let name = ModuleBuffer::from_bytes(name.as_bytes());
        let mut id = 0usize;
        // SAFETY: `raw` is the live config pointer of the current config_new hook (main
        // thread); the buffers borrow `name`/`labels` for the call; `id` is a writable local.
        let result = unsafe {
            match kind {
                StatKind::Counter => {
                    cb::envoy_dynamic_module_callback_http_filter_config_define_counter(
                        self.raw, name, ptr, count, &mut id,
                    )
                }
                StatKind::Gauge => {
                    cb::envoy_dynamic_module_callback_http_filter_config_define_gauge(
                        self.raw, name, ptr, count, &mut id,
                    )
                }
                StatKind::Histogram => {
                    cb::envoy_dynamic_module_callback_http_filter_config_define_histogram(
                        self.raw, name, ptr, count, &mut id,
                    )
                }
            }
        };
        (result == crate::abi::METRICS_SUCCESS).then_some(id)
    }
}

/// Our object behind `filter_config_module_ptr`.
pub struct HttpConfig {
    factory: Box<dyn StreamFactory>,
    /// The scraper this config carries and hosts (`crate::scraper`); leaves with it.
    scraper: Option<crate::scraper::Hosting>,
}

impl HttpConfig {
    /// Builds the config for `filter_name` from its JSON `config` bytes.
    pub fn new(
        filter_name: &str,
        config: &[u8],
        envoy: &mut FilterConfigHandle,
    ) -> Result<HttpConfig, String> {
        let (factory, scraper): (Box<dyn StreamFactory>, _) = match filter_name {
            "router" => (Box::new(crate::router::factory(config, envoy)?), None),
            "picker" => {
                let (factory, scraper) = crate::picker::factory(config, envoy)?;
                (Box::new(factory), scraper)
            }
            "gateway" => {
                let (factory, scraper) = crate::gateway::factory(config, envoy)?;
                (Box::new(factory), scraper)
            }
            "probe" => (Box::new(crate::probe::ProbeFactory::new(config)?), None),
            other => {
                return Err(format!(
                    "unknown filter_name `{other}` (expected router, picker, gateway or probe)"
                ))
            }
        };
        Ok(HttpConfig { factory, scraper })
    }

    /// The scraper this config hosts, if it carries one.
    pub fn scraper(&self) -> Option<&crate::scraper::Hosting> {
        self.scraper.as_ref()
    }

    /// A fresh per-stream object.
    pub fn new_stream(&self) -> Box<dyn StreamLogic> {
        self.factory.new_stream()
    }

    /// A config around any factory (tests drive the hooks with factories of their own).
    #[cfg(test)]
    pub fn from_factory(factory: Box<dyn StreamFactory>) -> HttpConfig {
        HttpConfig {
            factory,
            scraper: None,
        }
    }
}

/// Our object behind `filter_module_ptr`.
pub struct StreamState {
    logic: Box<dyn StreamLogic>,
    /// Set once a hook panicked and the request was failed; later hooks pass through.
    pub failed: bool,
    #[cfg(feature = "panic-injection")]
    inject: crate::panic_injection::Phase,
}

impl StreamState {
    /// Wraps the per-stream logic.
    pub fn new(logic: Box<dyn StreamLogic>) -> StreamState {
        StreamState {
            logic,
            failed: false,
            #[cfg(feature = "panic-injection")]
            inject: crate::panic_injection::Phase::None,
        }
    }

    /// See [`StreamLogic::on_request_headers`].
    pub fn on_request_headers(
        &mut self,
        envoy: &mut EnvoyStream,
        end_of_stream: bool,
    ) -> HeadersStatus {
        #[cfg(feature = "panic-injection")]
        {
            self.inject = crate::panic_injection::Phase::requested(envoy);
            self.inject
                .fire_if(crate::panic_injection::Phase::RequestHeaders);
        }
        self.logic.on_request_headers(envoy, end_of_stream)
    }

    /// See [`StreamLogic::on_request_body`].
    pub fn on_request_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> BodyStatus {
        #[cfg(feature = "panic-injection")]
        self.inject
            .fire_if(crate::panic_injection::Phase::RequestBody);
        self.logic.on_request_body(envoy, end_of_stream)
    }

    /// See [`StreamLogic::on_request_trailers`].
    pub fn on_request_trailers(&mut self, envoy: &mut EnvoyStream) -> TrailersStatus {
        self.logic.on_request_trailers(envoy)
    }

    /// See [`StreamLogic::on_response_headers`].
    pub fn on_response_headers(
        &mut self,
        envoy: &mut EnvoyStream,
        end_of_stream: bool,
    ) -> HeadersStatus {
        #[cfg(feature = "panic-injection")]
        self.inject
            .fire_if(crate::panic_injection::Phase::ResponseHeaders);
        self.logic.on_response_headers(envoy, end_of_stream)
    }

    /// See [`StreamLogic::on_response_body`].
    pub fn on_response_body(&mut self, envoy: &mut EnvoyStream, end_of_stream: bool) -> BodyStatus {
        self.logic.on_response_body(envoy, end_of_stream)
    }

    /// See [`StreamLogic::on_response_trailers`].
    pub fn on_response_trailers(&mut self, envoy: &mut EnvoyStream) -> TrailersStatus {
        self.logic.on_response_trailers(envoy)
    }

    /// See [`StreamLogic::on_scheduled`].
    pub fn on_scheduled(&mut self, envoy: &mut EnvoyStream, event_id: u64) {
        self.logic.on_scheduled(envoy, event_id);
    }

    /// See [`StreamLogic::on_stream_complete`].
    pub fn on_stream_complete(&mut self, envoy: &mut EnvoyStream) {
        self.logic.on_stream_complete(envoy);
    }
}
