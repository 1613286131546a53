//! The generic pipeline adapter through the exported hooks, against the fake Envoy: a pause
//! resumed from another thread through the stream's scheduler, a response chunk rewritten
//! as it passes, a request body replaced with its `content-length`.

use std::sync::{Arc, Mutex};

use infergate_filters::host::{RequestHeaders, RequestWaker, Waker};
use infergate_filters::pipeline::{RequestContext, Stage};
use infergate_filters::stages::build::test_pipeline;
use infergate_filters::stages::testing::{
    replaced_body, REPLACE_BODY_HEADER, REWRITE_CHUNKS_HEADER,
};
use infergate_filters::stages::TestStages;
use infergate_filters::FilterStatus;

use super::*;
use crate::adapter::StreamHost;
use crate::fake_envoy::{self, dummy_ptr, request_header, set_request_header};
use crate::pipeline::{wake_from_another_thread, NativePipeline, NativeStage, PipelineFactory};

fn config_of(stages: Vec<NativeStage>) -> HttpFilterConfigModulePtr {
    config_running(NativePipeline::new(stages))
}

/// A config running the filters crate's test stages called `names`.
fn config_of_test_stages(names: &[&str]) -> HttpFilterConfigModulePtr {
    let tests = TestStages::named(names, wake_from_another_thread);
    config_running(test_pipeline(tests.unwrap_or_default()))
}

fn config_running(pipeline: NativePipeline) -> HttpFilterConfigModulePtr {
    let mut handle = FilterConfigHandle::new(dummy_ptr());
    let host = crate::pipeline::host_config(&mut handle, &[]);
    let factory = PipelineFactory::new(pipeline, host, Vec::new());
    let config = HttpConfig::from_factory(Box::new(factory));
    Box::into_raw(Box::new(config)).cast_const().cast()
}

/// Pauses every request at its headers and leaves the waker in `parked`.
struct ParkStage {
    parked: Arc<Mutex<Option<Waker>>>,
}

impl Stage<StreamHost> for ParkStage {
    fn name(&self) -> &'static str {
        "park"
    }
    fn on_request_headers(
        &self,
        _cx: &mut RequestContext,
        host: &mut StreamHost,
        _eos: bool,
    ) -> FilterStatus {
        match host.request_waker() {
            Ok(waker) => {
                *self.parked.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker);
                FilterStatus::Pause
            }
            Err(_) => FilterStatus::Continue,
        }
    }
    fn on_resume(&self, _cx: &mut RequestContext, host: &mut StreamHost) -> FilterStatus {
        host.set_request_header("x-resumed", "yes");
        FilterStatus::Continue
    }
}

#[test]
fn a_paused_request_continues_only_after_another_thread_woke_it() {
    fake_envoy::reset();
    let parked = Arc::new(Mutex::new(None));
    let config = config_of(vec![Box::new(ParkStage {
        parked: Arc::clone(&parked),
    })]);
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    set_request_header(":path", "/v1/chat/completions");
    let h = envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false);
    assert_eq!(h, HeadersStatus::StopIteration);
    // The body that arrives meanwhile is held.
    fake_envoy::with(|s| s.bodies[0] = b"{}".to_vec());
    let b = envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), filter, true);
    assert_eq!(b, BodyStatus::StopIterationAndBuffer);
    let scheduler = fake_envoy::with(|s| s.schedulers.clone());
    assert_eq!(scheduler.len(), 1, "one scheduler for the stream");
    // An event before the wake (none was committed, but Envoy could run a stale one):
    // nothing resumes.
    assert_eq!(fake_envoy::commits(scheduler[0]), 0);
    let waker = parked.lock().unwrap_or_else(|e| e.into_inner()).take();
    let Some(waker) = waker else {
        unreachable!("the stage parked a waker");
    };
    let woke = std::thread::spawn(move || waker.wake());
    assert!(woke.join().is_ok());
    assert_eq!(
        fake_envoy::commits(scheduler[0]),
        1,
        "the wake committed from its thread"
    );
    assert_eq!(fake_envoy::with(|s| s.continued), 0);
    assert_eq!(request_header("x-resumed"), None);
    // Envoy runs the committed event on the stream's worker: the stage resumes there and
    // decoding continues.
    envoy_dynamic_module_on_http_filter_scheduled(dummy_ptr(), filter, 1);
    assert_eq!(request_header("x-resumed").as_deref(), Some("yes"));
    assert_eq!(fake_envoy::with(|s| s.continued), 1);
    // A repeated event changes nothing.
    envoy_dynamic_module_on_http_filter_scheduled(dummy_ptr(), filter, 1);
    assert_eq!(fake_envoy::with(|s| s.continued), 1);
    let deleted = fake_envoy::SCHEDULERS_DELETED.load(std::sync::atomic::Ordering::SeqCst);
    envoy_dynamic_module_on_http_filter_stream_complete(dummy_ptr(), filter);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    assert!(
        fake_envoy::SCHEDULERS_DELETED.load(std::sync::atomic::Ordering::SeqCst) > deleted,
        "the scheduler goes with its last holder"
    );
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn a_waker_that_outlives_its_stream_keeps_the_scheduler_until_it_is_dropped() {
    fake_envoy::reset();
    let parked = Arc::new(Mutex::new(None));
    let config = config_of(vec![Box::new(ParkStage {
        parked: Arc::clone(&parked),
    })]);
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    set_request_header(":path", "/v1/chat/completions");
    envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, true);
    let scheduler = fake_envoy::with(|s| s.schedulers[0]);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    // The stream is gone; the waker still holds the scheduler, so its commit is safe.
    assert_eq!(fake_envoy::commits(scheduler), 0);
    let waker = parked.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(waker) = waker {
        waker.wake();
    }
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn a_response_chunk_is_rewritten_as_it_passes() {
    fake_envoy::reset();
    let config = config_of_test_stages(&["rewrite-chunks"]);
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    set_request_header(":path", "/v1/chat/completions");
    set_request_header(REWRITE_CHUNKS_HEADER, "1");
    let h = envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, true);
    assert_eq!(h, HeadersStatus::Continue);
    assert_eq!(
        request_header(REWRITE_CHUNKS_HEADER),
        None,
        "removed before upstream"
    );
    fake_envoy::with(|s| {
        s.headers[2].push(("content-type".into(), b"text/event-stream".to_vec()));
    });
    envoy_dynamic_module_on_http_filter_response_headers(dummy_ptr(), filter, false);
    for chunk in ["data: one\n\n", "data: two\n\n"] {
        fake_envoy::with(|s| s.bodies[2] = chunk.as_bytes().to_vec());
        let b = envoy_dynamic_module_on_http_filter_response_body(dummy_ptr(), filter, false);
        assert_eq!(b, BodyStatus::Continue, "passes unbuffered");
        let sent = fake_envoy::with(|s| String::from_utf8_lossy(&s.bodies[2]).into_owned());
        assert_eq!(sent, chunk.to_ascii_uppercase());
    }
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn a_request_body_is_replaced_with_its_content_length() {
    fake_envoy::reset();
    let config = config_of_test_stages(&["replace-body"]);
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    set_request_header(":path", "/v1/chat/completions");
    set_request_header("content-length", "40");
    set_request_header(REPLACE_BODY_HEADER, "new words");
    let h = envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false);
    assert_eq!(h, HeadersStatus::StopIteration, "held for the body");
    let old = r#"{"model":"m","messages":[{"role":"user","content":"old"}]}"#;
    let (head, tail) = old.split_at(10);
    fake_envoy::with(|s| {
        s.bodies[1] = head.as_bytes().to_vec();
        s.bodies[0] = tail.as_bytes().to_vec();
    });
    let b = envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), filter, true);
    assert_eq!(b, BodyStatus::Continue);
    let expected = replaced_body("m", "new words");
    fake_envoy::with(|s| {
        assert!(s.bodies[1].is_empty(), "the buffered part is drained");
        assert_eq!(s.bodies[0], expected);
    });
    assert_eq!(
        request_header("content-length"),
        Some(expected.len().to_string())
    );
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}
