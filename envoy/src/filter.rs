//! The module-side objects of one HTTP stream and what a filter config is made of: the
//! per-stream logic of a filter kind ([`StreamLogic`]) and its factory ([`StreamFactory`],
//! shared by every worker, so `Sync`), one [`HttpFilter`] per HTTP stream (the object
//! behind Envoy's `filter_module_ptr`), and the main-thread handle on Envoy's config object
//! ([`FilterConfigHandle`]). The config object itself, which picks the logic by
//! `filter_name`, is `crate::factory`'s: the filter kinds depend on this module, never the
//! other way round.

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
    /// Hands the config's buffered counters and gauges to Envoy's config `envoy` (main
    /// thread, on the flush event; `crate::flush`). Nothing buffered: nothing to do.
    fn flush_stats(&self, _envoy: HttpFilterConfigEnvoyPtr) {}
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

/// Our object behind `filter_module_ptr`.
pub struct HttpFilter {
    logic: Box<dyn StreamLogic>,
    /// Set once a hook panicked and the request was failed; later hooks pass through.
    pub failed: bool,
    #[cfg(feature = "panic-injection")]
    inject: crate::panic_injection::Phase,
}

impl HttpFilter {
    /// Wraps the per-stream logic.
    pub fn new(logic: Box<dyn StreamLogic>) -> HttpFilter {
        HttpFilter {
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
