//! The scraper hosted by filter configs, driven through the exported hooks as Envoy drives
//! them, against the fake Envoy: a picker (or gateway) config that carries `scraper` starts
//! it, its ticks run on the main thread from the config scheduler's events, its callouts go
//! out on the active config and the answers are published; configs carrying the same
//! scraper share one, which the next live config takes over when the active one goes; the
//! last one to go stops it; a panicking tick costs one round.

use core::ffi::c_void;
use std::time::{Duration, Instant};

use infergate_filters::host::SnapshotFetch;

use super::*;
use crate::fake_envoy;
use crate::scraper::{running_hosts, TICK_EVENT};

const EP1: &str = "127.0.0.1:9101";
/// The snapshot slot is the process's (one for every test thread): the tests that publish
/// into it take turns.
static PUBLISHING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn publishing() -> std::sync::MutexGuard<'static, ()> {
    PUBLISHING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

const EP2: &str = "127.0.0.1:9102";

/// A distinct `config_envoy_ptr` per config, so callouts can be told apart by config.
fn envoy_ptr(n: usize) -> HttpFilterConfigEnvoyPtr {
    (0x1000 + n * 0x10) as *mut c_void
}

fn buf(bytes: &[u8]) -> EnvoyBuffer {
    EnvoyBuffer {
        ptr: bytes.as_ptr().cast(),
        length: bytes.len(),
    }
}

fn new_config(
    envoy: HttpFilterConfigEnvoyPtr,
    name: &str,
    json: &str,
) -> HttpFilterConfigModulePtr {
    envoy_dynamic_module_on_http_filter_config_new(
        envoy,
        buf(name.as_bytes()),
        buf(json.as_bytes()),
    )
}

fn scraper_json(extra: &str) -> String {
    format!(
        r#"{{"endpoints": ["{EP1}", "{EP2}"], "intervalMs": 40, "timeoutMs": 100, "cluster": "infergate-scrape"{extra}}}"#
    )
}

/// A picker config over both endpoints carrying `scraper`.
fn picker_with(scraper: &str) -> String {
    format!(
        r#"{{"pools": [{{"pool": "p", "baseModel": "llama", "endpoints": ["{EP1}", "{EP2}"], "failureMode": "FailOpen"}}], "scraper": {scraper}}}"#
    )
}

fn tick(envoy: HttpFilterConfigEnvoyPtr, config: HttpFilterConfigModulePtr) {
    envoy_dynamic_module_on_http_filter_config_scheduled(envoy, config, TICK_EVENT);
}

fn answer(
    envoy: HttpFilterConfigEnvoyPtr,
    config: HttpFilterConfigModulePtr,
    callout_id: u64,
    status: &str,
    page: &str,
) {
    let mut headers = [EnvoyHttpHeader {
        key_ptr: b":status".as_ptr().cast(),
        key_length: 7,
        value_ptr: status.as_ptr().cast(),
        value_length: status.len(),
    }];
    let (a, b) = page.split_at(page.len() / 2);
    let mut body = [buf(a.as_bytes()), buf(b.as_bytes())];
    envoy_dynamic_module_on_http_filter_config_http_callout_done(
        envoy,
        config,
        callout_id,
        crate::abi::CALLOUT_SUCCESS,
        headers.as_mut_ptr(),
        headers.len(),
        body.as_mut_ptr(),
        body.len(),
    );
}

/// The scheduler made for config `envoy` (the fake records each one).
fn scheduler_of(envoy: HttpFilterConfigEnvoyPtr) -> Option<usize> {
    fake_envoy::with(|s| {
        s.config_schedulers
            .iter()
            .rev()
            .find(|(c, _)| *c == envoy as usize)
            .map(|(_, sched)| *sched)
    })
}

/// Waits (up to 2 s) until `scheduler` has at least `n` commits from the ticker thread.
fn await_commits(scheduler: usize, n: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if fake_envoy::commits(scheduler) >= n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// Callouts started on config `envoy`: (cluster, headers).
fn callouts_on(envoy: HttpFilterConfigEnvoyPtr) -> Vec<(String, Vec<(String, String)>)> {
    fake_envoy::with(|s| {
        s.callouts
            .iter()
            .zip(&s.callout_configs)
            .filter(|(_, c)| **c == envoy as usize)
            .map(|(call, _)| call.clone())
            .collect()
    })
}

fn destination(call: &(String, Vec<(String, String)>)) -> Option<String> {
    call.1
        .iter()
        .find(|(k, _)| k == "x-gateway-destination-endpoint")
        .map(|(_, v)| v.clone())
}

/// The sample of `endpoint` in the newest published snapshot after `known`.
fn published_after(
    known: Option<infergate_filters::host::SnapshotVersion>,
) -> Option<scheduler_core::snapshot::Snapshot> {
    match crate::shared::SNAPSHOT.fetch_if_changed(known) {
        SnapshotFetch::Changed { bytes, .. } => scheduler_core::snapshot::decode(&bytes).ok(),
        _ => None,
    }
}

fn current_version() -> Option<infergate_filters::host::SnapshotVersion> {
    match crate::shared::SNAPSHOT.fetch_if_changed(None) {
        SnapshotFetch::Changed { version, .. } => Some(version),
        _ => None,
    }
}

#[test]
fn a_picker_config_hosts_its_scraper_which_ticks_scrapes_and_publishes() {
    let _turn = publishing();
    fake_envoy::reset();
    let envoy = envoy_ptr(1);
    let config = new_config(envoy, "picker", &picker_with(&scraper_json("")));
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    let Some(scheduler) = scheduler_of(envoy) else {
        unreachable!("the config made its scheduler");
    };
    assert_eq!(running_hosts().len(), 1);
    assert!(
        await_commits(scheduler, 1),
        "the ticker commits the first tick at once"
    );

    tick(envoy, config);
    let calls = callouts_on(envoy);
    assert_eq!(calls.len(), 2, "one callout per endpoint");
    for (call, ep) in calls.iter().zip([EP1, EP2]) {
        assert_eq!(call.0, "infergate-scrape");
        let has = |k: &str, v: &str| call.1.iter().any(|(hk, hv)| hk == k && hv == v);
        assert!(
            has(":method", "GET") && has(":path", "/metrics"),
            "{call:?}"
        );
        assert!(has(":authority", ep), "{call:?}");
        assert_eq!(destination(call).as_deref(), Some(ep));
    }

    let known = current_version();
    answer(
        envoy,
        config,
        1,
        "200",
        "vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\n",
    );
    answer(envoy, config, 2, "500", "oops");
    let Some(snapshot) = published_after(known) else {
        unreachable!("a finished round publishes a snapshot");
    };
    let sample = |ep: &str| snapshot.endpoints.iter().find(|s| s.address == ep).cloned();
    let first = sample(EP1).unwrap_or_else(|| unreachable!("EP1 sampled"));
    assert_eq!(first.metrics.as_ref().and_then(|m| m.waiting), Some(3));
    assert_eq!(first.consecutive_failures, 0);
    let second = sample(EP2).unwrap_or_else(|| unreachable!("EP2 sampled"));
    assert_eq!(second.consecutive_failures, 1, "a 500 is a failed scrape");
    // The stats are this config's, named as before.
    let scrapes_defined = fake_envoy::with(|s| {
        s.counters
            .iter()
            .any(|n| n.starts_with("infergate.scraper.scrapes"))
    });
    assert!(scrapes_defined);

    envoy_dynamic_module_on_http_filter_config_destroy(config);
    assert!(
        running_hosts().is_empty(),
        "the last host stops the scraper"
    );
    assert_eq!(
        fake_envoy::with(|s| s.config_schedulers_deleted.clone()),
        vec![scheduler],
        "its scheduler deleted once, after the ticker stopped"
    );
}

#[test]
fn the_gateway_filter_hosts_the_scraper_its_picker_part_carries() {
    fake_envoy::reset();
    let envoy = envoy_ptr(2);
    let router = r#"{"pools": [{"name": "p", "baseModel": "llama"}]}"#;
    let json = format!(
        r#"{{"router": {router}, "picker": {}}}"#,
        picker_with(&scraper_json(""))
    );
    let config = new_config(envoy, "gateway", &json);
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    tick(envoy, config);
    assert_eq!(callouts_on(envoy).len(), 2);
    envoy_dynamic_module_on_http_filter_config_destroy(config);
    assert!(running_hosts().is_empty());
}

#[test]
fn configs_with_the_same_scraper_share_one_and_the_next_takes_over() {
    let _turn = publishing();
    fake_envoy::reset();
    let (ea, eb, ec) = (envoy_ptr(3), envoy_ptr(4), envoy_ptr(5));
    // The same scraper in the picker filter and in a gateway (another listener); a `role`
    // makes no difference.
    let a = new_config(ea, "picker", &picker_with(&scraper_json("")));
    let router = r#"{"pools": [{"name": "p", "baseModel": "llama"}]}"#;
    let gateway = format!(
        r#"{{"router": {router}, "picker": {}}}"#,
        picker_with(&scraper_json(r#", "role": "scraper""#))
    );
    let b = new_config(eb, "gateway", &gateway);
    assert!(!a.is_null() && !b.is_null(), "{:?}", fake_envoy::logs());
    let hosts = running_hosts();
    assert_eq!(hosts.len(), 1, "one scraper for both configs");
    assert_eq!(hosts.first().map(Vec::len), Some(2));
    let (Some(sa), Some(sb)) = (scheduler_of(ea), scheduler_of(eb)) else {
        unreachable!("both configs made a scheduler");
    };

    // A ticks; B, standing by, neither ticks nor scrapes.
    tick(ea, a);
    tick(eb, b);
    assert_eq!(callouts_on(ea).len(), 2);
    assert!(callouts_on(eb).is_empty());
    assert_eq!(
        fake_envoy::commits(sb),
        0,
        "the ticker commits on the active host only"
    );

    // A goes with its callouts unanswered (Envoy cancels them): B takes over at once.
    envoy_dynamic_module_on_http_filter_config_destroy(a);
    assert_eq!(
        fake_envoy::with(|s| s.config_schedulers_deleted.clone()),
        vec![sa]
    );
    assert!(
        await_commits(sb, 1),
        "the hand-over tick is committed on B at once"
    );
    tick(eb, b);
    let calls = callouts_on(eb);
    assert_eq!(
        calls.iter().filter_map(destination).collect::<Vec<_>>(),
        vec![EP1.to_owned(), EP2.to_owned()],
        "A's callouts are forgotten: B scrapes every endpoint"
    );
    // B's callout ids restart at 1 (they are per config): answers are B's, not A's.
    let known = current_version();
    answer(eb, b, 2, "200", "vllm:num_requests_waiting 7\n");
    answer(eb, b, 1, "200", "vllm:num_requests_waiting 5\n");
    let Some(snapshot) = published_after(known) else {
        unreachable!("B's round publishes");
    };
    let waiting = |ep: &str| {
        snapshot
            .endpoints
            .iter()
            .find(|s| s.address == ep)
            .and_then(|s| s.metrics.as_ref())
            .and_then(|m| m.waiting)
    };
    assert_eq!((waiting(EP1), waiting(EP2)), (Some(5), Some(7)));

    // An update replaces B with C, created first: C joins, B's end hands over to C.
    let c = new_config(ec, "picker", &picker_with(&scraper_json("")));
    assert!(!c.is_null());
    envoy_dynamic_module_on_http_filter_config_destroy(b);
    let Some(sc) = scheduler_of(ec) else {
        unreachable!("C made a scheduler");
    };
    assert!(await_commits(sc, 1));
    assert_eq!(running_hosts().first().map(Vec::len), Some(1));

    // The last host goes: the scraper and its ticker stop, every scheduler is deleted once.
    envoy_dynamic_module_on_http_filter_config_destroy(c);
    assert!(running_hosts().is_empty());
    let mut deleted = fake_envoy::with(|s| s.config_schedulers_deleted.clone());
    deleted.sort_unstable();
    let mut made = vec![sa, sb, sc];
    made.sort_unstable();
    assert_eq!(deleted, made);

    // A later config with the scraper starts it again.
    let d = new_config(envoy_ptr(6), "picker", &picker_with(&scraper_json("")));
    assert!(!d.is_null());
    assert_eq!(running_hosts().len(), 1);
    envoy_dynamic_module_on_http_filter_config_destroy(d);
}

#[test]
fn distinct_scraper_configs_run_one_scraper_each() {
    fake_envoy::reset();
    let (ea, eb) = (envoy_ptr(7), envoy_ptr(8));
    let a = new_config(ea, "picker", &picker_with(&scraper_json("")));
    let b = new_config(
        eb,
        "picker",
        &picker_with(&scraper_json(r#", "path": "/m""#)),
    );
    assert!(!a.is_null() && !b.is_null(), "{:?}", fake_envoy::logs());
    assert_eq!(running_hosts().len(), 2);
    tick(ea, a);
    tick(eb, b);
    assert_eq!((callouts_on(ea).len(), callouts_on(eb).len()), (2, 2));
    envoy_dynamic_module_on_http_filter_config_destroy(a);
    envoy_dynamic_module_on_http_filter_config_destroy(b);
    assert!(running_hosts().is_empty());
}

#[test]
fn a_panicking_tick_is_counted_and_scraping_goes_on() {
    let _turn = publishing();
    fake_envoy::reset();
    let envoy = envoy_ptr(9);
    let config = new_config(
        envoy,
        "picker",
        &picker_with(&scraper_json(r#", "testPanicTicks": [2]"#)),
    );
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());

    tick(envoy, config);
    assert_eq!(callouts_on(envoy).len(), 2);
    answer(envoy, config, 1, "200", "vllm:num_requests_waiting 1\n");
    answer(envoy, config, 2, "200", "vllm:num_requests_waiting 2\n");

    tick(envoy, config);
    fake_envoy::with(|s| {
        assert_eq!(s.callouts.len(), 2, "the panicking tick sent nothing");
        assert!(
            s.logs.iter().any(|l| l.contains("panic in scraper tick")),
            "{:?}",
            s.logs
        );
        let ids: Vec<usize> = s
            .counters
            .iter()
            .enumerate()
            .filter(|(_, n)| *n == "infergate.scraper.tick_failures")
            .map(|(i, _)| i)
            .collect();
        let counted: u64 = s
            .increments
            .iter()
            .filter(|(i, _, _)| ids.contains(i))
            .map(|(_, _, v)| *v)
            .sum();
        assert_eq!(counted, 1, "one tick failure counted");
    });

    tick(envoy, config);
    assert_eq!(
        callouts_on(envoy).len(),
        4,
        "scraping continues after the panic"
    );
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn bad_scraper_configs_reject_the_picker_config_and_name_the_field() {
    fake_envoy::reset();
    let bad = [
        r#"{"endpoints": ["localhost:8000"]}"#.to_owned(),
        r#"{"endpoints": [], "testPanicTicks": 3}"#.to_owned(),
        r#""not an object""#.to_owned(),
        // Lacks EP2, which the picker's own pool lists.
        format!(r#"{{"endpoints": ["{EP1}"]}}"#),
    ];
    for scraper in &bad {
        assert!(new_config(envoy_ptr(10), "picker", &picker_with(scraper)).is_null());
    }
    let logs = fake_envoy::logs();
    assert!(
        logs.first().is_some_and(|l| l.contains("endpoints[0]")),
        "{logs:?}"
    );
    assert!(
        logs.get(1).is_some_and(|l| l.contains("testPanicTicks")),
        "{logs:?}"
    );
    assert!(
        logs.get(2).is_some_and(|l| l.contains("scraper")),
        "{logs:?}"
    );
    assert!(
        logs.get(3)
            .is_some_and(|l| l.contains(EP2) && l.contains("pools[0].endpoints[1]")),
        "{logs:?}"
    );
    assert!(running_hosts().is_empty());
    fake_envoy::with(|s| {
        assert_eq!(
            s.config_schedulers.len(),
            s.config_schedulers_deleted.len(),
            "a scheduler made for a refused config is deleted"
        );
    });
}

#[test]
fn a_flush_event_on_a_config_that_hosts_the_scraper_scrapes_nothing() {
    fake_envoy::reset();
    let envoy = envoy_ptr(21);
    let config = new_config(envoy, "picker", &picker_with(&scraper_json("")));
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    let calls = callouts_on(envoy).len();
    envoy_dynamic_module_on_http_filter_config_scheduled(envoy, config, crate::flush::FLUSH_EVENT);
    assert_eq!(callouts_on(envoy).len(), calls, "a flush scrapes nothing");
    tick(envoy, config);
    assert!(callouts_on(envoy).len() > calls, "a tick scrapes");
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}

#[test]
fn hooks_for_configs_without_a_scraper_do_nothing() {
    fake_envoy::reset();
    let config = new_config(
        envoy_ptr(11),
        "picker",
        r#"{"pools": [{"pool": "p", "baseModel": "llama", "endpoints": [], "failureMode": "FailOpen"}]}"#,
    );
    assert!(!config.is_null(), "{:?}", fake_envoy::logs());
    tick(envoy_ptr(11), config);
    answer(envoy_ptr(11), config, 1, "200", "x 1\n");
    tick(envoy_ptr(11), core::ptr::null());
    assert!(fake_envoy::with(
        |s| s.callouts.is_empty() && s.config_schedulers.is_empty()
    ));
    envoy_dynamic_module_on_http_filter_config_destroy(config);
}
