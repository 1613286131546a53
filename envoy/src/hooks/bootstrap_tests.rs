//! The bootstrap hooks driven as Envoy drives them, against the fake Envoy: init signalled
//! once, the timer started on server init and re-armed per tick, one callout per endpoint
//! through the scrape cluster, answers published to the process-wide snapshot slot, and the
//! shutdown completion called exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};

use infergate_filters::host::SnapshotFetch;

use super::*;
use crate::fake_envoy::{self, dummy_ptr};

const EP1: &str = "127.0.0.1:9101";
const EP2: &str = "127.0.0.1:9102";

fn buf(bytes: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: bytes.as_ptr().cast(),
        length: bytes.len(),
    }
}

fn new_config(name: &str, json: &str) -> BootstrapConfigModulePtr {
    envoy_dynamic_module_on_bootstrap_extension_config_new(
        dummy_ptr(),
        buf(name.as_bytes()),
        buf(json.as_bytes()),
    )
}

/// The completion callback: `context` is the test's counter.
unsafe extern "C" fn count_completion(context: *mut c_void) {
    // SAFETY: every test passes a pointer to an `AtomicUsize` that outlives the call.
    let counter = unsafe { &*context.cast_const().cast::<AtomicUsize>() };
    counter.fetch_add(1, Ordering::SeqCst);
}

fn context(counter: &AtomicUsize) -> *mut c_void {
    (counter as *const AtomicUsize).cast_mut().cast()
}

fn answer(callout_id: u64, status: &str, page: &str) {
    let headers = [EnvoyHttpHeader {
        key_ptr: b":status".as_ptr().cast(),
        key_length: 7,
        value_ptr: status.as_ptr().cast(),
        value_length: status.len(),
    }];
    let (a, b) = page.split_at(page.len() / 2);
    let body = [buf(a.as_bytes()), buf(b.as_bytes())];
    envoy_dynamic_module_on_bootstrap_extension_http_callout_done(
        dummy_ptr(),
        CONFIG.with(|c| c.get()),
        callout_id,
        crate::abi::CALLOUT_SUCCESS,
        headers.as_ptr(),
        headers.len(),
        body.as_ptr(),
        body.len(),
    );
}

thread_local! {
    static CONFIG: core::cell::Cell<BootstrapConfigModulePtr> = const { core::cell::Cell::new(core::ptr::null()) };
}

#[test]
fn scraper_lifecycle_publishes_snapshots_and_completes_shutdown_once() {
    fake_envoy::reset();
    let json = format!(
        r#"{{"role": "scraper", "endpoints": ["{EP1}", "{EP2}"], "intervalMs": 40, "timeoutMs": 100, "cluster": "infergate-scrape"}}"#
    );
    let config = new_config("scraper", &json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    CONFIG.with(|c| c.set(config));
    assert_eq!(
        fake_envoy::with(|s| s.init_complete),
        1,
        "init signalled in config_new"
    );

    let ext = envoy_dynamic_module_on_bootstrap_extension_new(config, dummy_ptr());
    assert!(!ext.is_null());
    assert!(
        fake_envoy::with(|s| s.timers.is_empty()),
        "no timer before server init"
    );
    envoy_dynamic_module_on_bootstrap_extension_server_initialized(dummy_ptr(), ext);
    envoy_dynamic_module_on_bootstrap_extension_server_initialized(dummy_ptr(), ext);
    assert_eq!(
        fake_envoy::with(|s| s.timers.clone()),
        vec![Some(0)],
        "one timer, fired at once"
    );

    let timer = 1usize as BootstrapTimerModulePtr;
    envoy_dynamic_module_on_bootstrap_extension_timer_fired(dummy_ptr(), config, timer);
    fake_envoy::with(|s| {
        assert_eq!(s.timers, vec![Some(40)], "re-armed at the interval");
        assert_eq!(s.callouts.len(), 2);
        for ((cluster, headers), ep) in s.callouts.iter().zip([EP1, EP2]) {
            assert_eq!(cluster, "infergate-scrape");
            let has = |k: &str, v: &str| headers.iter().any(|(hk, hv)| hk == k && hv == v);
            assert!(
                has(":method", "GET") && has(":path", "/metrics"),
                "{headers:?}"
            );
            assert!(
                has(":authority", ep) && has("x-gateway-destination-endpoint", ep),
                "{headers:?}"
            );
        }
    });

    let before = crate::shared::SNAPSHOT.fetch_if_changed(None);
    let known = match before {
        SnapshotFetch::Changed { version, .. } => Some(version),
        _ => None,
    };
    answer(
        1,
        "200",
        "vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\n",
    );
    answer(2, "500", "oops");
    let SnapshotFetch::Changed { bytes, .. } = crate::shared::SNAPSHOT.fetch_if_changed(known)
    else {
        unreachable!("a finished round must publish a snapshot");
    };
    let snapshot =
        scheduler_core::snapshot::decode(&bytes).unwrap_or_else(|e| unreachable!("{e:?}"));
    let sample = |ep: &str| snapshot.endpoints.iter().find(|s| s.address == ep).cloned();
    let first = sample(EP1).unwrap_or_else(|| unreachable!("EP1 sampled"));
    assert_eq!(first.metrics.as_ref().and_then(|m| m.waiting), Some(3));
    assert_eq!(first.consecutive_failures, 0);
    let second = sample(EP2).unwrap_or_else(|| unreachable!("EP2 sampled"));
    assert_eq!(
        second.consecutive_failures, 1,
        "a 500 counts as a failed scrape"
    );

    let completions = AtomicUsize::new(0);
    envoy_dynamic_module_on_bootstrap_extension_shutdown(
        dummy_ptr(),
        ext,
        Some(count_completion),
        context(&completions),
    );
    assert_eq!(
        completions.load(Ordering::SeqCst),
        1,
        "completion exactly once"
    );
    assert_eq!(fake_envoy::with(|s| s.timers_deleted), 1);
    envoy_dynamic_module_on_bootstrap_extension_destroy(ext);
    envoy_dynamic_module_on_bootstrap_extension_config_destroy(config);
    assert_eq!(
        fake_envoy::with(|s| s.timers_deleted),
        1,
        "the timer is deleted only once"
    );
}

#[test]
fn shutdown_completes_even_without_an_extension() {
    let completions = AtomicUsize::new(0);
    envoy_dynamic_module_on_bootstrap_extension_shutdown(
        dummy_ptr(),
        core::ptr::null(),
        Some(count_completion),
        context(&completions),
    );
    assert_eq!(completions.load(Ordering::SeqCst), 1);
}

#[test]
fn unknown_extensions_and_bad_configs_are_rejected() {
    fake_envoy::reset();
    assert!(new_config("other", "{}").is_null());
    assert!(new_config("scraper", r#"{"endpoints": [], "intervalMs": 0}"#).is_null());
    assert!(new_config("scraper", "not json").is_null());
    assert_eq!(fake_envoy::logs().len(), 3);
    assert_eq!(fake_envoy::with(|s| s.init_complete), 0);
}

#[test]
fn a_panicking_tick_is_counted_and_scraping_goes_on() {
    fake_envoy::reset();
    let json = format!(
        r#"{{"endpoints": ["{EP1}", "{EP2}"], "intervalMs": 40, "timeoutMs": 100, "testPanicTicks": [2]}}"#
    );
    let config = new_config("scraper", &json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    CONFIG.with(|c| c.set(config));
    let ext = envoy_dynamic_module_on_bootstrap_extension_new(config, dummy_ptr());
    envoy_dynamic_module_on_bootstrap_extension_server_initialized(dummy_ptr(), ext);
    let timer = 1usize as BootstrapTimerModulePtr;

    // Tick 1 scrapes both endpoints; both answer.
    envoy_dynamic_module_on_bootstrap_extension_timer_fired(dummy_ptr(), config, timer);
    assert_eq!(fake_envoy::with(|s| s.callouts.len()), 2);
    answer(1, "200", "vllm:num_requests_waiting 1\n");
    answer(2, "200", "vllm:num_requests_waiting 2\n");

    // Tick 2 panics: contained, logged, counted, and the timer is armed all the same.
    fake_envoy::with(|s| s.timers = vec![None]);
    envoy_dynamic_module_on_bootstrap_extension_timer_fired(dummy_ptr(), config, timer);
    fake_envoy::with(|s| {
        assert_eq!(s.timers, vec![Some(40)], "re-armed despite the panic");
        assert_eq!(s.callouts.len(), 2, "the panicking tick sent nothing");
        assert!(
            s.logs.iter().any(|l| l.contains("panic in scraper tick")),
            "{:?}",
            s.logs
        );
        let id = s
            .counters
            .iter()
            .position(|n| n == "infergate.scraper.tick_failures");
        let counted: u64 = s
            .increments
            .iter()
            .filter(|(i, _, _)| Some(*i) == id)
            .map(|(_, _, v)| *v)
            .sum();
        assert_eq!(counted, 1, "one tick failure counted");
    });

    // Tick 3 scrapes again.
    envoy_dynamic_module_on_bootstrap_extension_timer_fired(dummy_ptr(), config, timer);
    fake_envoy::with(|s| {
        assert_eq!(s.callouts.len(), 4, "scraping continues after the panic");
        assert_eq!(s.timers, vec![Some(40)]);
    });
    envoy_dynamic_module_on_bootstrap_extension_destroy(ext);
    envoy_dynamic_module_on_bootstrap_extension_config_destroy(config);
}

#[test]
fn scraper_config_errors_name_the_field() {
    fake_envoy::reset();
    assert!(new_config("scraper", r#"{"endpoints": ["localhost:8000"]}"#).is_null());
    assert!(new_config("scraper", r#"{"endpoints": [], "testPanicTicks": 3}"#).is_null());
    let logs = fake_envoy::logs();
    assert!(logs[0].contains("endpoints[0]"), "{logs:?}");
    assert!(logs[1].contains("testPanicTicks"), "{logs:?}");
}

#[test]
fn a_scraper_that_misses_a_loaded_pickers_endpoint_is_refused() {
    fake_envoy::reset();
    let picker = crate::shared::config_registry().register_picker(
        infergate_filters::consistency::PickerDeclaration {
            pools: vec![infergate_filters::consistency::PoolDeclaration {
                name: "p".into(),
                base_model: "m".into(),
                endpoints: vec![EP1.into(), EP2.into()],
                block_size_tokens: None,
            }],
        },
    );
    assert!(picker.is_ok());
    let only_one = format!(r#"{{"endpoints": ["{EP1}"]}}"#);
    assert!(new_config("scraper", &only_one).is_null());
    let logs = fake_envoy::logs();
    assert!(
        logs.iter()
            .any(|l| l.contains(EP2) && l.contains("pools[0].endpoints[1]")),
        "{logs:?}"
    );
    let both = format!(r#"{{"endpoints": ["{EP1}", "{EP2}"]}}"#);
    let config = new_config("scraper", &both);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    envoy_dynamic_module_on_bootstrap_extension_config_destroy(config);
}
