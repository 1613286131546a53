//! The exported HTTP hooks driven as Envoy drives them, against the fake Envoy: the router
//! and the picker end to end through the ABI, panic containment, config rejection, and the
//! process-wide picker state under several threads.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::abi::HeaderKind;
use crate::fake_envoy::{self, dummy_ptr, request_header, set_request_header};
use crate::filter::StreamLogic;
use infergate_filters::picker::PoolId;

const ROUTER_CONFIG: &str = r#"{"role": "router", "pools": [{"name": "p", "baseModel": "llama", "adapters": ["llama-lora"]}]}"#;
const CHAT: &str = r#"{"model":"llama-lora","messages":[{"role":"user","content":"hello"}]}"#;

fn new_config(name: &str, json: &str) -> HttpFilterConfigModulePtr {
    let name = name.as_bytes();
    let json = json.as_bytes();
    envoy_dynamic_module_on_http_filter_config_new(
        dummy_ptr(),
        EnvoyBuffer {
            ptr: name.as_ptr().cast(),
            length: name.len(),
        },
        EnvoyBuffer {
            ptr: json.as_ptr().cast(),
            length: json.len(),
        },
    )
}

/// Runs the flush event Envoy's main thread would run for `config` (`crate::flush`).
fn flush(config: HttpFilterConfigModulePtr) {
    envoy_dynamic_module_on_http_filter_config_scheduled(
        dummy_ptr(),
        config,
        crate::flush::FLUSH_EVENT,
    );
}

fn chat_request(body: &str) {
    set_request_header(":path", "/v1/chat/completions");
    set_request_header(":method", "POST");
    fake_envoy::with(|s| s.bodies[0] = body.as_bytes().to_vec());
}

/// Runs one request through `config`'s filter: headers, then the whole body in one chunk.
fn run_request(
    config: HttpFilterConfigModulePtr,
) -> (HeadersStatus, BodyStatus, HttpFilterModulePtr) {
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    assert!(!filter.is_null());
    let h = envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false);
    let b = envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), filter, true);
    (h, b, filter)
}

#[test]
fn router_sets_routing_headers_strips_client_headers_and_clears_the_route_cache() {
    fake_envoy::reset();
    let config = new_config("router", ROUTER_CONFIG);
    assert!(!config.is_null());
    chat_request(CHAT);
    set_request_header("x-gateway-destination-endpoint", "6.6.6.6:80");
    set_request_header("x-llm-d-inference-objective", "vip");
    let (h, b, filter) = run_request(config);
    assert_eq!(h, HeadersStatus::StopIteration, "waits for the body");
    assert_eq!(
        fake_envoy::with(|s| s.buffer_limit),
        4 * 1024 * 1024 + 1,
        "Envoy may buffer up to the router's default limit"
    );
    assert_eq!(b, BodyStatus::Continue);
    assert_eq!(
        request_header("x-gateway-base-model-name").as_deref(),
        Some("llama")
    );
    assert_eq!(
        request_header("x-gateway-model-name").as_deref(),
        Some("llama-lora")
    );
    assert_eq!(request_header("x-gateway-destination-endpoint"), None);
    assert_eq!(request_header("x-llm-d-inference-objective"), None);
    // Counters wait in the module for the main thread's flush: the request made no
    // metric call into Envoy.
    assert!(fake_envoy::with(|s| s.increments.is_empty()));
    flush(config);
    fake_envoy::with(|s| {
        assert!(s.route_cache_clears >= 1);
        assert!(s.replies.is_empty());
        // Every key known at config time is its own label-less counter, named by the
        // flattened key.
        let routed = s
            .counters
            .iter()
            .position(|c| c == "infergate.router.requests.outcome.routed")
            .unwrap_or(usize::MAX);
        assert!(s
            .increments
            .iter()
            .any(|(id, labels, v)| *id == routed && labels.is_empty() && *v == 1));
        assert!(
            s.increments.iter().all(|(_, labels, _)| labels.is_empty()),
            "no labelled increments: {:?}",
            s.increments
        );
    });
    envoy_dynamic_module_on_http_filter_stream_complete(dummy_ptr(), filter);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn router_reassembles_a_body_split_between_buffered_and_received() {
    fake_envoy::reset();
    let config = new_config("router", ROUTER_CONFIG);
    chat_request("");
    let (head, tail) = CHAT.split_at(20);
    fake_envoy::with(|s| {
        s.bodies[1] = head.as_bytes().to_vec();
        s.bodies[0] = tail.as_bytes().to_vec();
    });
    let (_, b, filter) = run_request(config);
    assert_eq!(b, BodyStatus::Continue);
    assert_eq!(
        request_header("x-gateway-base-model-name").as_deref(),
        Some("llama")
    );
    // When an earlier filter already buffered the body, the chunk *is* the buffer.
    fake_envoy::reset();
    chat_request(CHAT);
    fake_envoy::with(|s| {
        s.bodies[1] = CHAT.as_bytes().to_vec();
        s.received_is_buffered = true;
    });
    let (_, b2, filter2) = run_request(config);
    assert_eq!(
        b2,
        BodyStatus::Continue,
        "{:?}",
        fake_envoy::with(|s| s.replies.clone())
    );
    for f in [filter, filter2] {
        envoy_dynamic_module_on_http_filter_destroy(f);
    }
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn router_answers_errors_as_local_replies() {
    fake_envoy::reset();
    let config = new_config("router", ROUTER_CONFIG);
    chat_request(r#"{"model":"nope","messages":[]}"#);
    let (_, b, filter) = run_request(config);
    assert_eq!(b, BodyStatus::StopIterationNoBuffer);
    let replies = fake_envoy::with(|s| s.replies.clone());
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].status, 404);
    assert!(replies[0].body.contains("model_not_found"));
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn unknown_filter_names_and_bad_configs_are_rejected_with_a_log_line() {
    fake_envoy::reset();
    assert!(new_config("nonsense", "{}").is_null());
    assert!(new_config("router", "{not json").is_null());
    assert!(new_config("picker", r#"{"pools": [], "failureMode": "Sometimes"}"#).is_null());
    let logs = fake_envoy::logs();
    assert_eq!(logs.len(), 3, "{logs:?}");
    assert!(logs[0].contains("unknown filter_name `nonsense`"));
}

/// Logic that panics in the hook named by `at`.
struct Panicking {
    at: &'static str,
}

#[allow(clippy::panic)]
impl StreamLogic for Panicking {
    fn on_request_headers(&mut self, _e: &mut EnvoyStream, _eos: bool) -> HeadersStatus {
        if self.at == "headers" {
            panic!("bug in headers");
        }
        HeadersStatus::StopIteration
    }
    fn on_request_body(&mut self, _e: &mut EnvoyStream, _eos: bool) -> BodyStatus {
        if self.at == "body" {
            panic!("bug in body");
        }
        BodyStatus::Continue
    }
    fn on_response_headers(&mut self, _e: &mut EnvoyStream, _eos: bool) -> HeadersStatus {
        if self.at == "response" {
            panic!("bug in response");
        }
        HeadersStatus::Continue
    }
}

fn stream_of(logic: Panicking) -> HttpFilterModulePtr {
    Box::into_raw(Box::new(HttpFilter::new(Box::new(logic))))
        .cast_const()
        .cast()
}

#[test]
fn a_panic_on_the_request_path_fails_that_request_with_500_and_keeps_going() {
    crate::guard::install_panic_hook();
    for at in ["headers", "body"] {
        fake_envoy::reset();
        let filter = stream_of(Panicking { at });
        let h = envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false);
        let b = envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), filter, true);
        assert_eq!(h, HeadersStatus::StopIteration);
        assert_eq!(b, BodyStatus::StopIterationNoBuffer);
        let replies = fake_envoy::with(|s| s.replies.clone());
        assert_eq!(replies.len(), 1, "exactly one 500 for {at}");
        assert_eq!(replies[0].status, 500);
        assert!(replies[0].body.contains("internal_error"));
        // Later hooks of the failed stream pass through without calling the logic again.
        let r = envoy_dynamic_module_on_http_filter_response_headers(dummy_ptr(), filter, false);
        assert_eq!(r, HeadersStatus::Continue);
        let logs = fake_envoy::logs();
        assert!(
            logs.iter()
                .any(|l| l.contains("panic in on_http_filter_request_") && l.contains(at)),
            "{logs:?}"
        );
        envoy_dynamic_module_on_http_filter_destroy(filter);
    }
}

#[test]
fn a_panic_on_the_response_path_resets_the_stream() {
    crate::guard::install_panic_hook();
    fake_envoy::reset();
    let filter = stream_of(Panicking { at: "response" });
    let r = envoy_dynamic_module_on_http_filter_response_headers(dummy_ptr(), filter, true);
    assert_eq!(r, HeadersStatus::StopIteration);
    fake_envoy::with(|s| {
        assert_eq!(s.resets, 1);
        assert!(
            s.replies.is_empty(),
            "no local reply once the response started"
        );
    });
    envoy_dynamic_module_on_http_filter_destroy(filter);
}

#[test]
fn null_module_pointers_never_crash_a_hook() {
    fake_envoy::reset();
    let null = core::ptr::null();
    assert_eq!(
        envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), null, false),
        HeadersStatus::StopIteration
    );
    assert!(envoy_dynamic_module_on_http_filter_new(null, dummy_ptr()).is_null());
    envoy_dynamic_module_on_http_filter_destroy(null);
    envoy_dynamic_module_on_http_filter_config_destroy(null);
}

/// A factory whose streams cannot be created.
struct PanickingFactory;

impl crate::filter::StreamFactory for PanickingFactory {
    fn new_stream(&self) -> Box<dyn StreamLogic> {
        panic!("stream creation failed")
    }
}

/// If the stream's logic cannot be created, the request gets a 500 at once instead of
/// waiting for Envoy's idle timeout.
#[test]
fn a_stream_that_cannot_be_created_answers_500() {
    crate::guard::install_panic_hook();
    fake_envoy::reset();
    let config: HttpFilterConfigModulePtr = Box::into_raw(Box::new(HttpConfig::from_factory(
        Box::new(PanickingFactory),
    )))
    .cast_const()
    .cast();
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    assert!(!filter.is_null());
    assert_eq!(
        envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false),
        HeadersStatus::StopIteration
    );
    let replies = fake_envoy::with(|s| s.replies.clone());
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].status, 500);
    envoy_dynamic_module_on_http_filter_stream_complete(dummy_ptr(), filter);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[cfg(feature = "panic-injection")]
#[test]
fn injected_panic_header_fails_only_the_marked_request() {
    crate::guard::install_panic_hook();
    fake_envoy::reset();
    let config = new_config("router", ROUTER_CONFIG);
    chat_request(CHAT);
    set_request_header(crate::panic_injection::HEADER, "1");
    let (_, _, filter) = run_request(config);
    assert_eq!(
        fake_envoy::with(|s| s.replies.first().map(|r| r.status)),
        Some(500)
    );
    envoy_dynamic_module_on_http_filter_destroy(filter);
    fake_envoy::reset();
    chat_request(CHAT);
    let (_, b, filter) = run_request(config);
    assert_eq!(b, BodyStatus::Continue);
    assert!(fake_envoy::with(|s| s.replies.is_empty()));
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

fn picker_config(pool: &str, endpoints: &[&str], extra: &str) -> String {
    let eps: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        r#"{{"pools": [{{"pool": "{pool}", "baseModel": "llama", "endpoints": [{}], "failureMode": "FailOpen"}}]{extra}}}"#,
        eps.join(",")
    )
}

fn picker_request() {
    chat_request(r#"{"model":"llama","messages":[{"role":"user","content":"hi"}]}"#);
    set_request_header("x-gateway-base-model-name", "llama");
}

fn inflight(config_json: &str, address: &str) -> u32 {
    let value = crate::router::config_json(config_json.as_bytes()).unwrap_or_default();
    let Ok(state) = crate::picker::tests_support::state_for(&value) else {
        return u32::MAX;
    };
    let state = crate::picker::tests_support::lock(&state);
    state
        .pool_for_base_model("llama")
        .and_then(|p| state.inflight(p, address))
        .map_or(u32::MAX, |i| i.requests)
}

#[test]
fn picker_routes_with_header_and_metadata_and_releases_on_destroy() {
    fake_envoy::reset();
    let json = picker_config("solo", &["127.0.0.1:9001"], "");
    let config = new_config("picker", &json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    picker_request();
    let (h, b, filter) = run_request(config);
    assert_eq!((h, b), (HeadersStatus::StopIteration, BodyStatus::Continue));
    assert_eq!(
        request_header("x-gateway-destination-endpoint").as_deref(),
        Some("127.0.0.1:9001")
    );
    fake_envoy::with(|s| {
        assert!(s.metadata.contains(&(
            "envoy.lb".into(),
            "x-gateway-destination-endpoint".into(),
            "127.0.0.1:9001".into()
        )));
    });
    assert_eq!(inflight(&json, "127.0.0.1:9001"), 1);
    // No stream_complete (a reset stream): destroy alone gives the lease back.
    envoy_dynamic_module_on_http_filter_destroy(filter);
    assert_eq!(inflight(&json, "127.0.0.1:9001"), 0);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

/// After the router's handoff the picker decides in its headers hook and never copies the
/// body out of Envoy (the body is read only when a filter asks for it).
#[test]
fn a_picker_that_picked_from_the_handoff_never_reads_the_body() {
    fake_envoy::reset();
    let router = new_config("router", ROUTER_CONFIG);
    let json = picker_config("handoff", &["127.0.0.1:9101"], "");
    let picker = new_config("picker", &json);
    chat_request(CHAT);
    let (_, b, routed) = run_request(router);
    assert_eq!(b, BodyStatus::Continue);
    let reads = fake_envoy::with(|s| s.body_reads);
    assert!(reads > 0, "the router reads the body");
    let filter = envoy_dynamic_module_on_http_filter_new(picker, dummy_ptr());
    assert_eq!(
        envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false),
        HeadersStatus::Continue,
        "picked in the headers hook"
    );
    assert_eq!(
        envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), filter, true),
        BodyStatus::Continue
    );
    assert_eq!(
        request_header("x-gateway-destination-endpoint").as_deref(),
        Some("127.0.0.1:9101")
    );
    assert_eq!(
        fake_envoy::with(|s| s.body_reads),
        reads,
        "the picker read no body"
    );
    for (f, c) in [(filter, picker), (routed, router)] {
        envoy_dynamic_module_on_http_filter_destroy(f);
        envoy_dynamic_module_on_http_filter_config_destroy(c);
    }
}

#[test]
fn a_picker_config_with_the_removed_upstream_override_is_refused_naming_it() {
    for mode in ["strict", "fallback"] {
        fake_envoy::reset();
        let json = picker_config(
            "override-pool",
            &["127.0.0.1:9002"],
            &format!(r#", "upstreamOverride": "{mode}""#),
        );
        assert!(new_config("picker", &json).is_null(), "{mode}");
        let logs = fake_envoy::logs();
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert!(
            logs[0].contains("`upstreamOverride` was removed") && logs[0].contains("override_host"),
            "{logs:?}"
        );
    }
    // The same pool without the key builds.
    fake_envoy::reset();
    let config = new_config(
        "picker",
        &picker_config("override-pool", &["127.0.0.1:9002"], ""),
    );
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

/// The pool of the cluster the route chose (two pools of one base model), the subset hint
/// from a list in the dynamic metadata, and the served endpoint from the upstream address.
#[test]
fn picker_follows_the_routed_cluster_the_metadata_subset_and_the_served_address() {
    fake_envoy::reset();
    let json = r#"{"pools": [
        {"pool": "stable", "baseModel": "llama", "endpoints": ["127.0.0.1:9301"], "failureMode": "FailOpen"},
        {"pool": "canary", "cluster": "canary-cluster", "baseModel": "llama",
         "endpoints": ["127.0.0.1:9302", "127.0.0.1:9303", "127.0.0.1:9304"], "failureMode": "FailOpen"}
    ]}"#;
    let config = new_config("picker", json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    picker_request();
    fake_envoy::with(|s| {
        s.cluster_name = Some(b"canary-cluster".to_vec());
        s.metadata_in.push((
            "envoy.lb.subset_hint".into(),
            "x-gateway-destination-endpoint-subset".into(),
            true,
            vec![b"127.0.0.1:9303".to_vec(), b"127.0.0.1:9304".to_vec()],
        ));
    });
    let (_, _, filter) = run_request(config);
    assert_eq!(fake_envoy::with(|s| s.cluster_name_reads), 1);
    let list = request_header("x-gateway-destination-endpoint").unwrap_or_default();
    let entries: Vec<&str> = list.split(',').collect();
    assert_eq!(entries.len(), 2, "{list}");
    assert!(
        entries
            .iter()
            .all(|e| ["127.0.0.1:9303", "127.0.0.1:9304"].contains(e)),
        "{list}"
    );
    // The fallback served: the response says so, and the lease moved there.
    let fallback = entries[1].to_owned();
    fake_envoy::with(|s| {
        s.attributes.push((
            crate::abi::ATTRIBUTE_UPSTREAM_ADDRESS,
            fallback.clone().into_bytes(),
        ))
    });
    envoy_dynamic_module_on_http_filter_response_headers(dummy_ptr(), filter, false);
    let served = fake_envoy::with(|s| {
        s.headers[2]
            .iter()
            .find(|(k, _)| k == "x-gateway-destination-endpoint-served")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    });
    assert_eq!(served.as_deref(), Some(fallback.as_str()));
    let value = crate::router::config_json(json.as_bytes()).unwrap_or_default();
    let state = crate::picker::tests_support::state_for(&value).expect("the config's state");
    let state = crate::picker::tests_support::lock(&state);
    let load = |e: &str| {
        state
            .inflight(PoolId(1), e)
            .map_or(u32::MAX, |i| i.requests)
    };
    assert_eq!(load(&fallback), 1);
    assert_eq!(load(entries[0]), 0);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    assert_eq!(load(&fallback), 0);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn one_picker_state_per_process_shared_by_configs_and_threads() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 50;
    let endpoints = ["127.0.0.1:9011", "127.0.0.1:9012", "127.0.0.1:9013"];
    let json = picker_config("shared-pool", &endpoints, "");
    // Two filter configs from the same JSON (two listeners, or an LDS update) share a state.
    let first = new_config("picker", &json) as usize;
    let second = new_config("picker", &json) as usize;
    static HELD: AtomicUsize = AtomicUsize::new(0);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let config = (if t % 2 == 0 { first } else { second }) as HttpFilterConfigModulePtr;
                let mut open = Vec::new();
                for _ in 0..PER_THREAD {
                    fake_envoy::reset();
                    picker_request();
                    let (_, b, filter) = run_request(config);
                    assert_eq!(b, BodyStatus::Continue);
                    open.push(filter as usize);
                    HELD.fetch_add(1, Ordering::SeqCst);
                }
                for f in open {
                    envoy_dynamic_module_on_http_filter_stream_complete(
                        dummy_ptr(),
                        f as HttpFilterModulePtr,
                    );
                    envoy_dynamic_module_on_http_filter_destroy(f as HttpFilterModulePtr);
                }
            })
        })
        .collect();
    for w in workers {
        assert!(w.join().is_ok());
    }
    assert_eq!(HELD.load(Ordering::SeqCst), THREADS * PER_THREAD);
    let total: u32 = endpoints.iter().map(|e| inflight(&json, e)).sum();
    assert_eq!(total, 0, "every lease given back exactly once");
    for c in [first, second] {
        envoy_dynamic_module_on_http_filter_config_destroy(c as HttpFilterConfigModulePtr);
    }
}

#[test]
fn header_kinds_are_passed_as_envoy_numbers() {
    assert_eq!(HeaderKind::RequestHeaders as u32, 0);
    assert_eq!(HeaderKind::ResponseTrailers as u32, 3);
    assert_eq!(crate::abi::BodyKind::BufferedResponse as u32, 3);
    assert_eq!(HeadersStatus::StopAllIterationAndWatermark as u32, 4);
    assert_eq!(BodyStatus::StopIterationNoBuffer as u32, 3);
}

/// The release module has no `probe` filter: the name is refused with the answer any
/// unknown name gets, which lists the names this build knows.
#[cfg(not(feature = "probe"))]
#[test]
fn the_probe_filter_exists_only_in_the_bench_build() {
    fake_envoy::reset();
    assert!(new_config("probe", "{}").is_null());
    let logs = fake_envoy::logs();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(
        logs[0].contains("unknown filter_name `probe` (expected router, picker or gateway)"),
        "{logs:?}"
    );
}

/// The `probe` filter (the native floor of `bench overhead`, in the bench build) holds the
/// request until the body is complete, then lets it go on untouched; it refuses settings.
#[cfg(feature = "probe")]
#[test]
fn probe_buffers_the_body_then_continues_without_touching_the_request() {
    fake_envoy::reset();
    assert!(new_config("probe", r#"{"x":1}"#).is_null());
    let config = new_config("probe", "{}");
    assert!(!config.is_null());
    chat_request(CHAT);
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    let h = envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false);
    assert_eq!(h, HeadersStatus::StopIteration);
    let partial = envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), filter, false);
    assert_eq!(partial, BodyStatus::StopIterationAndBuffer);
    assert_eq!(
        fake_envoy::with(|s| s.body_reads),
        0,
        "nothing read before the end"
    );
    let b = envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), filter, true);
    assert_eq!(b, BodyStatus::Continue);
    assert!(
        fake_envoy::with(|s| s.body_reads) > 0,
        "the body is read at its end"
    );
    assert_eq!(request_header("x-gateway-base-model-name"), None);
    fake_envoy::with(|s| {
        assert_eq!(s.route_cache_clears, 0);
        assert!(s.replies.is_empty());
        assert!(s.increments.is_empty());
    });
    // A request that ends with trailers is read and let go at its trailers.
    let with_trailers = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), with_trailers, false);
    envoy_dynamic_module_on_http_filter_request_body(dummy_ptr(), with_trailers, false);
    let reads = fake_envoy::with(|s| s.body_reads);
    assert_eq!(
        envoy_dynamic_module_on_http_filter_request_trailers(dummy_ptr(), with_trailers),
        crate::abi::TrailersStatus::Continue
    );
    assert!(fake_envoy::with(|s| s.body_reads) > reads);
    envoy_dynamic_module_on_http_filter_destroy(with_trailers);
    envoy_dynamic_module_on_http_filter_stream_complete(dummy_ptr(), filter);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

/// Net gauge movement per defined name, from the fake's record of increments/decrements,
/// once `config` flushed.
fn gauge_totals(config: HttpFilterConfigModulePtr) -> std::collections::BTreeMap<String, i64> {
    flush(config);
    fake_envoy::with(|s| {
        let mut totals = std::collections::BTreeMap::new();
        for (id, _, delta) in &s.gauge_moves {
            let name = s.counters.get(*id).cloned().unwrap_or_default();
            *totals.entry(name).or_insert(0) += delta;
        }
        totals
    })
}

#[test]
fn picker_in_flight_gauges_return_to_zero_on_complete_and_on_destroy_alone() {
    fake_envoy::reset();
    let json = picker_config("gauges", &["127.0.0.1:9201"], "");
    let config = new_config("picker", &json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    let pool = "infergate.picker.inflight_requests.pool.gauges";
    let endpoint = format!("{pool}.endpoint.127_0_0_1_9201");
    // Both gauges are label-less metrics defined at config time.
    fake_envoy::with(|s| {
        assert!(s.counters.iter().any(|n| n == pool), "{:?}", s.counters);
        assert!(s.counters.contains(&endpoint));
    });

    picker_request();
    let (_, _, completed) = run_request(config);
    let (_, _, reset) = run_request(config);
    let totals = gauge_totals(config);
    assert_eq!(totals.get(pool), Some(&2), "{totals:?}");
    assert_eq!(totals.get(&endpoint), Some(&2));

    // One stream completes normally; the other is destroyed without stream_complete.
    envoy_dynamic_module_on_http_filter_stream_complete(dummy_ptr(), completed);
    assert_eq!(gauge_totals(config).get(pool), Some(&1));
    envoy_dynamic_module_on_http_filter_destroy(completed);
    assert_eq!(
        gauge_totals(config).get(pool),
        Some(&1),
        "no second release"
    );
    envoy_dynamic_module_on_http_filter_destroy(reset);
    let totals = gauge_totals(config);
    assert_eq!(totals.get(pool), Some(&0), "{totals:?}");
    assert_eq!(totals.get(&endpoint), Some(&0));
    assert_eq!(inflight(&json, "127.0.0.1:9201"), 0);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn destroying_a_config_flushes_what_its_last_requests_counted() {
    fake_envoy::reset();
    let json = picker_config("last", &["127.0.0.1:9211"], "");
    let config = new_config("picker", &json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    picker_request();
    let (_, _, filter) = run_request(config);
    envoy_dynamic_module_on_http_filter_stream_complete(dummy_ptr(), filter);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    // No flush event since the request: Envoy has seen none of its updates yet.
    assert!(fake_envoy::with(
        |s| s.increments.is_empty() && s.gauge_moves.is_empty()
    ));
    envoy_dynamic_module_on_http_filter_config_destroy(config);
    // The config's last flush: its counters, and its in-flight gauges up and back down.
    fake_envoy::with(|s| {
        assert!(!s.increments.is_empty(), "{:?}", s.counters);
        let net: i64 = s.gauge_moves.iter().map(|(_, _, delta)| delta).sum();
        assert_eq!(net, 0, "{:?}", s.gauge_moves);
    });
}

#[test]
fn a_routed_model_without_a_picker_pool_gets_the_pickers_503() {
    fake_envoy::reset();
    let json = picker_config("nopool", &["127.0.0.1:9301"], "");
    let config = new_config("picker", &json);
    chat_request(r#"{"model":"qwen","messages":[{"role":"user","content":"hi"}]}"#);
    set_request_header("x-gateway-base-model-name", "qwen");
    let filter = envoy_dynamic_module_on_http_filter_new(config, dummy_ptr());
    assert_eq!(
        envoy_dynamic_module_on_http_filter_request_headers(dummy_ptr(), filter, false),
        HeadersStatus::StopIteration
    );
    let reply = fake_envoy::with(|s| s.replies.last().cloned());
    let reply = reply.unwrap_or_else(|| unreachable!("the picker answers"));
    assert_eq!(reply.status, 503);
    assert!(reply
        .headers
        .iter()
        .any(|(k, v)| k == "x-llm-d-request-dropped-reason" && v == "rejected-no-endpoints"));
    assert!(reply.body.contains("`qwen`"), "{}", reply.body);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn a_picker_config_that_leaves_a_routed_base_model_without_a_pool_is_refused() {
    fake_envoy::reset();
    let router = new_config(
        "router",
        r#"{"pools": [{"name": "a", "baseModel": "llama"}, {"name": "b", "baseModel": "qwen"}]}"#,
    );
    assert!(!router.is_null());
    let json = picker_config("only-llama", &["127.0.0.1:9401"], "");
    assert!(new_config("picker", &json).is_null());
    let logs = fake_envoy::logs();
    assert!(
        logs.iter()
            .any(|l| l.contains("`qwen`") && l.contains("pools[].baseModel")),
        "{logs:?}"
    );
    // Once the router is gone, the same picker config loads.
    envoy_dynamic_module_on_http_filter_config_destroy(router);
    let picker = new_config("picker", &json);
    assert!(!picker.is_null(), "{:?}", fake_envoy::logs());
    envoy_dynamic_module_on_http_filter_config_destroy(picker);
}

fn gateway_config(pool: &str, endpoint: &str) -> String {
    format!(
        r#"{{"router": {ROUTER_CONFIG}, "picker": {}}}"#,
        picker_config(pool, &[endpoint], "")
    )
}

/// The `gateway` filter routes and picks in one stream: the body is read once, the route
/// is cleared for the pick stage, the pick comes from the route stage's handoff, and the
/// lease is given back when the stream goes.
#[test]
fn the_gateway_filter_routes_and_picks_in_one_stream() {
    fake_envoy::reset();
    let json = gateway_config("one", "127.0.0.1:9501");
    let config = new_config("gateway", &json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    chat_request(CHAT);
    set_request_header("x-gateway-destination-endpoint", "6.6.6.6:80");
    let (h, b, filter) = run_request(config);
    assert_eq!((h, b), (HeadersStatus::StopIteration, BodyStatus::Continue));
    assert_eq!(
        request_header("x-gateway-base-model-name").as_deref(),
        Some("llama")
    );
    assert_eq!(
        request_header("x-gateway-destination-endpoint").as_deref(),
        Some("127.0.0.1:9501"),
        "the client's destination is replaced by the pick"
    );
    flush(config);
    fake_envoy::with(|s| {
        assert!(s.route_cache_clears >= 1);
        assert!(s.replies.is_empty(), "{:?}", s.replies);
        // The handoff stayed in the request's context: none went through Envoy.
        assert!(
            !s.filter_state.iter().any(|(k, _)| k == "infergate_handoff"),
            "{:?}",
            s.filter_state.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
        assert!(s.metadata.contains(&(
            "envoy.lb".into(),
            "x-gateway-destination-endpoint".into(),
            "127.0.0.1:9501".into()
        )));
        // Both parts' stats are defined on the one config, and the pick came from the
        // route stage's handoff.
        for name in [
            "infergate.router.requests.outcome.routed",
            "infergate.picker.handoff.pool.one",
        ] {
            let id = s.counters.iter().position(|c| c == name);
            assert!(
                s.increments
                    .iter()
                    .any(|(i, _, v)| Some(*i) == id && *v == 1),
                "{name}: {:?}",
                s.counters
            );
        }
    });
    let picker_json = crate::router::config_json(json.as_bytes())
        .ok()
        .and_then(|v| v.get("picker").cloned())
        .map(|v| v.to_string())
        .unwrap_or_default();
    assert_eq!(inflight(&picker_json, "127.0.0.1:9501"), 1);
    envoy_dynamic_module_on_http_filter_destroy(filter);
    assert_eq!(inflight(&picker_json, "127.0.0.1:9501"), 0);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn a_gateway_config_needs_both_parts_and_nothing_else() {
    for (json, needle) in [
        (r#"{"router": {}}"#.to_owned(), "`picker` is missing"),
        (r#"[1]"#.to_owned(), "expected an object"),
        (
            format!(r#"{{"router": {ROUTER_CONFIG}, "picker": 3}}"#),
            "`picker` must be an object",
        ),
        (
            gateway_config("extra", "127.0.0.1:9502").replacen('{', r#"{"pickr": {}, "#, 1),
            "unknown key `pickr`",
        ),
        (
            format!(r#"{{"router": {ROUTER_CONFIG}, "picker": {{"pools": []}}}}"#),
            "gateway picker:",
        ),
    ] {
        fake_envoy::reset();
        assert!(new_config("gateway", &json).is_null(), "{json}");
        let logs = fake_envoy::logs();
        assert!(logs.iter().any(|l| l.contains(needle)), "{json}: {logs:?}");
    }
}
