//! Both flavours: pools and endpoints through Envoy's own routing, each test named after the
//! Gateway API Inference Extension conformance scenario it plays (where there is one).
//!
//! - `gateway_weighted_across_two_inference_pools`: two pools of one model weighted 70/30
//!   get 70 ± 5% / 30 ± 5% of 1,000 requests, each request inside one pool and each pool
//!   with its own picker state; a header-targeted rule (`x-canary: fp8`) sends all of its
//!   traffic to its pool; a split sticky on `x-gateway-split-key` keeps every turn of a
//!   session on one pool while sessions spread over both.
//! - `gateway_following_epp_routing`: every request is served by the first endpoint of the
//!   picker's `x-gateway-destination-endpoint` list, which names only pool members; a
//!   client's own subset header does not confine the picks.
//! - `gateway_following_epp_routing_with_data_parallelism`: simulated pods on 127.0.0.2 and
//!   127.0.0.3 with two ranks (ports) each, the picker's pool given as bare IPs with
//!   `targetPorts`: every rank is scraped (the scraper's per-endpoint counts) and picked (the
//!   picker's) as an endpoint of its own, and receives traffic.
//! - `gateway_destination_endpoint_served`: the response's
//!   `x-gateway-destination-endpoint-served` names the endpoint that served; with a replica
//!   that resets every request, Envoy retries on the picker's fallback, the client sees
//!   success, the header names the fallback, and the prefix index follows it (the next
//!   turn of that conversation is picked there first).
//! - `a_subset_hint_keeps_every_pick_inside_it`: with the gateway's subset hint, no request
//!   leaves the subset, however attractive the endpoint outside is.
//! - `epp_un_available_fail_open`: a `FailOpen` pool whose metrics become unavailable (every
//!   scrape hangs) keeps serving, spread over every member by in-proxy load. (The error
//!   suite covers one stale endpoint and `FailClose`'s 503.)

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::{answered_by, chat, tag};
use crate::support::gw::{self, gateway_stats, traced};
use crate::support::reset::ResettingBackend;
use crate::support::{workers, MetricsMode, StreamPace, TestBackend, QUICK};
use infergate_cli::config::rewrites::{Split, SplitMode};
use infergate_harness::launch::client::{
    post_json, post_json_streamed, HttpResponse, StreamedResponse,
};
use infergate_harness::launch::{
    Backends, EnvoyOptions, FailureMode, Flavor, GatewaySettings, PluginConfigs, PoolSpec,
    RouteSpec, Stack, StackOptions,
};
use infergate_harness::sim::SimConfig;

const MODEL: &str = "pool-model";
const STICKY: &str = "sticky-model";
const SERVED: &str = "x-gateway-destination-endpoint-served";
const DESTINATION: &str = "x-gateway-destination-endpoint";
const SUBSET: &str = "x-gateway-destination-endpoint-subset";
const SESSION: &str = "x-session-id";

for_each_flavour!(
    gateway_weighted_across_two_inference_pools,
    gateway_following_epp_routing,
    gateway_following_epp_routing_with_data_parallelism,
    gateway_destination_endpoint_served,
    a_subset_hint_keeps_every_pick_inside_it,
    epp_un_available_fail_open,
);

/// What a stack of this suite is made of beside its replicas.
struct Layout {
    pools: Vec<PoolSpec>,
    routes: Vec<RouteSpec>,
    subset_hint: Vec<usize>,
    split: Option<Split>,
    /// Edits the generated plugin configurations (external backends only).
    tweak: Option<gw::Tweak>,
}

impl Layout {
    fn pools(pools: Vec<PoolSpec>) -> Layout {
        Layout {
            pools,
            routes: Vec::new(),
            subset_hint: Vec::new(),
            split: None,
            tweak: None,
        }
    }
}

/// Starts `flavor` over `backends` as `layout` says, at the suite's worker count, and waits
/// for the scraper's first snapshot; `None` (after printing why) when the module is not
/// built.
async fn start(flavor: Flavor, backends: Backends, layout: Layout) -> Option<Stack> {
    let mut plugins_override = None;
    if crate::support::unbuilt(flavor) {
        return None;
    }
    if let (Some(tweak), Backends::External(addrs)) = (layout.tweak, &backends) {
        let pools = layout
            .pools
            .iter()
            .map(|p| p.resolve(addrs))
            .collect::<anyhow::Result<Vec<_>>>()
            .unwrap();
        let mut plugins = PluginConfigs::for_pools(&pools, &GatewaySettings::default());
        tweak(&mut plugins);
        plugins_override = Some(plugins);
    }
    let mut opts = StackOptions::new(flavor, backends);
    opts.plugins = plugins_override;
    opts.pools = layout.pools;
    opts.routes = layout.routes;
    opts.subset_hint = layout.subset_hint;
    opts.split = layout.split;
    opts.envoy = EnvoyOptions {
        concurrency: workers(),
        // The trace log (Envoy's stderr) is flushed this often.
        extra_args: vec!["--file-flush-interval-msec".into(), "100".into()],
        ..EnvoyOptions::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    gw::wait_for_publish(&stack, 1).await;
    Some(stack)
}

fn external(backends: &[TestBackend]) -> Backends {
    Backends::External(backends.iter().map(|b| b.addr).collect())
}

async fn post(stack: &Stack, body: &Value, headers: &[(&str, &str)]) -> HttpResponse {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    post_json(&url, body, headers).await.unwrap()
}

/// Sends `n` requests, `concurrency` at a time; `request(i)` gives the i-th body and
/// headers. Returns, per request, the backend that answered and the headers it received.
async fn send_many(
    stack: &Arc<Stack>,
    n: usize,
    concurrency: usize,
    request: impl Fn(usize) -> (Value, Vec<(String, String)>) + Send + Sync + 'static,
) -> Vec<(usize, Value)> {
    let next = Arc::new(AtomicUsize::new(0));
    let out = Arc::new(Mutex::new(vec![(usize::MAX, Value::Null); n]));
    let request = Arc::new(request);
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (stack, next, out, request) =
            (stack.clone(), next.clone(), out.clone(), request.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return;
                }
                let (body, headers) = request(i);
                let headers: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                let resp = post(&stack, &body, &headers).await;
                let answered = answered_by(&stack, &resp);
                out.lock().unwrap()[i] = answered;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let out = out.lock().unwrap().clone();
    out
}

/// Two pools of `MODEL` (b0, b1 and b2, b3) split 70/30 per request, `x-canary: fp8` to the
/// second first; two pools of `STICKY` (the same backends) split 50/50 on the session.
async fn gateway_weighted_across_two_inference_pools(flavor: Flavor) {
    let backends = TestBackend::many(4, QUICK).await;
    let mut layout = Layout::pools(vec![
        PoolSpec::on(MODEL, &[0, 1]).named("bf16"),
        PoolSpec::on(MODEL, &[2, 3]).named("fp8"),
        PoolSpec::on(STICKY, &[0, 1]).named("sticky-a"),
        PoolSpec::on(STICKY, &[2, 3]).named("sticky-b"),
    ]);
    layout.routes = vec![
        RouteSpec::split(MODEL, &[(0, 70), (1, 30)]),
        RouteSpec::to(MODEL, 1).when_header("x-canary", "fp8"),
        RouteSpec::split(STICKY, &[(2, 1), (3, 1)]).sticky(),
    ];
    layout.split = Some(Split {
        mode: SplitMode::Sticky,
        session_header: Some(SESSION.into()),
    });
    let Some(stack) = start(flavor, external(&backends), layout).await else {
        return;
    };
    let stack = Arc::new(stack);
    let t = tag(flavor);

    const N: usize = 1000;
    let answered = send_many(&stack, N, 16, |i| (chat(MODEL, &format!("w{i}")), vec![])).await;
    let first_pool = answered.iter().filter(|(b, _)| *b < 2).count();
    let share = first_pool as f64 / N as f64;
    assert!(
        (0.65..=0.75).contains(&share),
        "{t}: {first_pool} of {N} requests on the 70% pool"
    );
    // Each pool's picker picked inside its own pool, with its own state.
    let stats = stack.envoy().stats().await.unwrap();
    for (pool, inside, outside) in [("bf16", [0, 1], [2, 3]), ("fp8", [2, 3], [0, 1])] {
        let picks_on = |b: usize| -> i64 {
            let label = super::endpoint_label(&backends[b].addr);
            stats
                .containing("infergate.picker.picks")
                .filter(|(k, _)| k.contains(pool) && k.contains(&label))
                .map(|(_, v)| v)
                .sum()
        };
        let inside: i64 = inside.iter().map(|&b| picks_on(b)).sum();
        let outside: i64 = outside.iter().map(|&b| picks_on(b)).sum();
        let expected = if pool == "bf16" {
            first_pool
        } else {
            N - first_pool
        };
        assert_eq!(
            (inside, outside),
            (expected as i64, 0),
            "{t}: picks of pool {pool}\n{}",
            gateway_stats(&stats)
        );
    }
    assert_eq!(
        stats.sum_containing("infergate.picker.pool_by_base_model"),
        0,
        "{t}: every request's pool came from its route's cluster"
    );

    // The header-targeted rule wins over the split, every time.
    let canary = send_many(&stack, 60, 8, |i| {
        (
            chat(MODEL, &format!("c{i}")),
            vec![("x-canary".into(), "fp8".into())],
        )
    })
    .await;
    assert!(
        canary.iter().all(|(b, _)| *b >= 2),
        "{t}: a canary request left the canary pool: {:?}",
        canary.iter().map(|(b, _)| b).collect::<Vec<_>>()
    );

    // Sticky: 60 sessions of 4 turns; every turn of a session in its first turn's pool.
    const SESSIONS: usize = 60;
    let turns = send_many(&stack, SESSIONS * 4, 8, |i| {
        let session = format!("s{}", i % SESSIONS);
        (
            chat(STICKY, &format!("turn {i}")),
            vec![(SESSION.into(), session)],
        )
    })
    .await;
    let mut pool_of: BTreeMap<usize, BTreeSet<bool>> = BTreeMap::new();
    for (i, (b, _)) in turns.iter().enumerate() {
        pool_of.entry(i % SESSIONS).or_default().insert(*b < 2);
    }
    let moved: Vec<_> = pool_of.iter().filter(|(_, p)| p.len() > 1).collect();
    assert!(
        moved.is_empty(),
        "{t}: sessions that switched pools: {moved:?}"
    );
    let on_first = pool_of.values().filter(|p| p.contains(&true)).count();
    assert!(
        (10..=50).contains(&on_first),
        "{t}: {on_first} of {SESSIONS} sessions on the first of two equal pools"
    );
    eprintln!(
        "{t}: {first_pool} of {N} requests on the 70% pool; {on_first} of {SESSIONS} sticky \
         sessions on the first of two equal pools, none switched"
    );
}

/// Three backends in one pool: every request lands on the first endpoint of the list the
/// picker wrote, and the list names pool members only.
async fn gateway_following_epp_routing(flavor: Flavor) {
    let backends = TestBackend::many(3, QUICK).await;
    let layout = Layout::pools(vec![PoolSpec::all(MODEL)]);
    let Some(stack) = start(flavor, external(&backends), layout).await else {
        return;
    };
    let stack = Arc::new(stack);
    let t = tag(flavor);
    let members: BTreeSet<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    let answered = send_many(&stack, 100, 10, |i| (chat(MODEL, &format!("f{i}")), vec![])).await;
    let mut used = BTreeSet::new();
    for (b, headers) in &answered {
        let list = headers[DESTINATION].as_str().unwrap_or_default();
        let entries: Vec<&str> = list.split(',').map(str::trim).collect();
        assert_eq!(
            entries.first().copied(),
            Some(backends[*b].addr.to_string().as_str()),
            "{t}: served by b{b}, the picker's list was `{list}`"
        );
        assert!(
            entries.iter().all(|e| members.contains(*e)),
            "{t}: `{list}` names an endpoint outside the pool"
        );
        used.insert(*b);
    }
    assert!(used.len() >= 2, "{t}: 100 requests all on {used:?}");
    // No subset is configured here: a client naming one endpoint as its subset does not
    // confine the picks to it.
    let only = backends[2].addr.to_string();
    let steered = send_many(&stack, 30, 6, move |i| {
        (
            chat(MODEL, &format!("steer {i}")),
            vec![(SUBSET.into(), only.clone())],
        )
    })
    .await;
    let used: BTreeSet<usize> = steered.iter().map(|(b, _)| *b).collect();
    assert!(
        used.len() >= 2,
        "{t}: a client's subset header confined 30 picks to {used:?}"
    );
}

/// Two pods (127.0.0.2, 127.0.0.3) of two ranks each, every rank a simulated engine on its
/// own port; the picker's pool lists the pods with `targetPorts`.
async fn gateway_following_epp_routing_with_data_parallelism(flavor: Flavor) {
    let pods = [[127, 0, 0, 2], [127, 0, 0, 3]];
    let ports = free_ports_on_every(&pods, 2).await;
    let listen: Vec<SocketAddr> = pods
        .iter()
        .flat_map(|ip| ports.iter().map(|&p| SocketAddr::from((*ip, p))))
        .collect();
    let cfg = SimConfig {
        replicas: listen.len() as u32,
        listen: listen.clone(),
        models: vec![MODEL.into()],
        output_tokens: 4,
        ..SimConfig::default()
    };
    let pool = PoolSpec {
        target_ports: ports.clone(),
        ..PoolSpec::all(MODEL)
    };
    let Some(stack) = start(
        flavor,
        Backends::InProcess(Box::new(cfg)),
        Layout::pools(vec![pool]),
    )
    .await
    else {
        return;
    };
    let t = tag(flavor);
    assert_eq!(stack.replicas(), &listen[..], "{t}: one replica per rank");
    let stack = Arc::new(stack);
    // Concurrent streams, so in-flight load spreads them over every rank.
    let mut streams = Vec::new();
    for i in 0..16 {
        let stack = stack.clone();
        streams.push(tokio::spawn(async move {
            let url = format!("{}/v1/chat/completions", stack.picker_url());
            let mut body = chat(MODEL, &format!("rank {i}"));
            body["stream"] = json!(true);
            body["max_tokens"] = json!(24);
            let resp = post_json_streamed(&url, &body, &[]).await.unwrap();
            assert_eq!(resp.status, 200);
            served_header(&resp)
        }));
    }
    let mut served = BTreeMap::<String, usize>::new();
    for s in streams {
        let addr = s.await.unwrap();
        assert!(addr.is_some(), "a response without the served header");
        *served.entry(addr.unwrap_or_default()).or_default() += 1;
    }
    let sim = stack.sim().unwrap();
    let arrivals = sim.arrivals();
    let mut per_rank = vec![0usize; listen.len()];
    for a in &arrivals {
        per_rank[a.replica] += 1;
    }
    assert!(
        per_rank.iter().all(|&n| n > 0),
        "{t}: requests per rank {per_rank:?} ({listen:?})"
    );
    let rank_addrs: BTreeSet<String> = listen.iter().map(ToString::to_string).collect();
    assert!(
        served.keys().all(|a| rank_addrs.contains(a)),
        "{t}: served by {served:?}, ranks {rank_addrs:?}"
    );
    let stats = stack.envoy().stats().await.unwrap();
    for rank in &listen {
        let label = super::endpoint_label(rank);
        let picks: i64 = stats
            .containing("infergate.picker.picks")
            .filter(|(k, _)| k.contains(&label))
            .map(|(_, v)| v)
            .sum();
        assert!(
            picks > 0,
            "{t}: no pick of rank {rank}\n{}",
            gateway_stats(&stats)
        );
        let scrapes: i64 = stats
            .containing("infergate.scraper.scrapes")
            .filter(|(k, _)| k.contains(&label) && k.ends_with("result.ok"))
            .map(|(_, v)| v)
            .sum();
        assert!(
            scrapes > 0,
            "{t}: rank {rank} was never scraped as an endpoint of its own\n{}",
            gateway_stats(&stats)
        );
    }
    assert_eq!(
        stats.sum_containing("infergate.picker.unscraped_endpoints"),
        0,
        "{t}: a rank missing from the scraper's snapshot\n{}",
        gateway_stats(&stats)
    );
}

/// The `x-gateway-destination-endpoint-served` header of a streamed response.
fn served_header(resp: &StreamedResponse) -> Option<String> {
    resp.headers
        .get(SERVED)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `count` ports free on every one of `ips` (one port list for all, as `targetPorts` is).
async fn free_ports_on_every(ips: &[[u8; 4]], count: usize) -> Vec<u16> {
    'search: for _ in 0..50 {
        let mut held = Vec::new();
        for _ in 0..count {
            let l = tokio::net::TcpListener::bind(SocketAddr::from((ips[0], 0)))
                .await
                .unwrap();
            held.push(l);
        }
        let ports: Vec<u16> = held
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect();
        for ip in &ips[1..] {
            for &p in &ports {
                if std::net::TcpListener::bind(SocketAddr::from((*ip, p))).is_err() {
                    continue 'search;
                }
            }
        }
        return ports;
    }
    panic!("no {count} ports free on every one of {ips:?}");
}

/// b0 answers normally; a resetting replica looks like the best endpoint, so every first
/// turn is picked there with b0 as the fallback. The served header names who served; the
/// reset is retried on the fallback and the client sees success. Then the resetting
/// replica looks worst, and each conversation's second turn, now picked on b0, finds its
/// prompt's blocks there: recorded for the endpoint that served (the pick's own entries
/// age out).
async fn gateway_destination_endpoint_served(flavor: Flavor) {
    let good = TestBackend::many(1, QUICK).await;
    good[0].set_kv(0.3);
    let resetting = ResettingBackend::start(0.05).await;
    let addrs = vec![good[0].addr, resetting.addr];
    // The scripted load decides the pick here, not placement.
    let mut pool = PoolSpec::all(MODEL);
    pool.picker_config = super::epp_config_without_placement();
    let layout = Layout::pools(vec![pool]);
    let Some(stack) = start(flavor, Backends::External(addrs), layout).await else {
        return;
    };
    let t = tag(flavor);
    let good_addr = good[0].addr.to_string();
    let conversation = |i: usize| {
        // A long prompt of its own per conversation, so each has blocks to match.
        let system = format!("You are careful assistant number {i}. ").repeat(40);
        let mut body = chat(MODEL, &format!("question {i}"));
        body["messages"] = json!([
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question {i}")},
        ]);
        body
    };
    const CONVERSATIONS: usize = 5;
    for i in 0..CONVERSATIONS {
        let trace = format!("served-{i}");
        let resp = post(&stack, &conversation(i), &[("infergate-trace", &trace)]).await;
        let (b, headers) = answered_by(&stack, &resp);
        assert_eq!(b, 0, "{t}: only b0 can answer");
        assert_eq!(
            resp.header(SERVED),
            Some(good_addr.as_str()),
            "{t}: the served header names the endpoint that served"
        );
        let list = headers[DESTINATION].as_str().unwrap_or_default().to_owned();
        assert_eq!(
            list,
            format!("{},{good_addr}", resetting.addr),
            "{t}: the resetting replica first, b0 its fallback"
        );
        let log = traced(&stack, &trace).await;
        assert_eq!(log["upstream_host"], good_addr.as_str(), "{t}: {log}");
    }
    assert_eq!(
        resetting.resets(),
        CONVERSATIONS as u64,
        "{t}: each first attempt reached the resetting replica"
    );
    let stats = stack.envoy().stats().await.unwrap();
    assert_eq!(
        stats.sum_containing("infergate.picker.served_by_fallback"),
        CONVERSATIONS as i64,
        "{t}: served by the fallback\n{}",
        gateway_stats(&stats)
    );

    resetting.set_kv(0.95);
    resetting.wait_scrapes(2).await;
    for i in 0..CONVERSATIONS {
        let before = stack
            .envoy()
            .stats()
            .await
            .unwrap()
            .sum_containing("infergate.picker.prefix_matched_blocks");
        let mut body = conversation(i);
        body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "assistant", "content": "an answer"}));
        let resp = post(&stack, &body, &[]).await;
        let (_, headers) = answered_by(&stack, &resp);
        let next = headers[DESTINATION].as_str().unwrap_or_default();
        assert!(next.starts_with(&good_addr), "{t}: turn 2 picked `{next}`");
        let stats = stack.envoy().stats().await.unwrap();
        let matched = stats.sum_containing("infergate.picker.prefix_matched_blocks") - before;
        assert!(
            matched >= 4,
            "{t}: turn 2 of conversation {i} matched {matched} blocks on b0, which served \
             turn 1 only as the fallback\n{}",
            gateway_stats(&stats)
        );
    }
    drop(stack);
    no_retry_past_the_list(flavor).await;
}

/// With `fallbacks: 0` the list is the pick alone, and the picker's `x-envoy-max-retries: 0`
/// keeps Envoy from retrying past it (the pool cluster's own round robin would otherwise
/// take the good replica): the resetting pick fails the request, whatever retries the client
/// asks for.
async fn no_retry_past_the_list(flavor: Flavor) {
    let good = TestBackend::many(1, QUICK).await;
    good[0].set_kv(0.3);
    let resetting = ResettingBackend::start(0.05).await;
    let addrs = vec![good[0].addr, resetting.addr];
    let mut layout = Layout::pools(vec![PoolSpec::all(MODEL)]);
    layout.tweak = Some(Box::new(|plugins| {
        gw::picker_pool(plugins, MODEL)["fallbacks"] = json!(0);
    }));
    let Some(stack) = start(flavor, Backends::External(addrs), layout).await else {
        return;
    };
    let t = tag(flavor);
    let resp = post(
        &stack,
        &chat(MODEL, "no fallback"),
        &[("x-envoy-max-retries", "5")],
    )
    .await;
    assert_eq!(resp.status, 503, "{t}: {}", resp.text());
    assert_eq!(
        resetting.resets(),
        1,
        "{t}: one attempt, on the pick, and no retry past the list"
    );
    assert_eq!(good[0].served(), 0, "{t}: the retry left the list");
}

/// Three backends; b0 is the most attractive (lowest KV) but outside the subset hint
/// [b1, b2]: nothing reaches it. (That a client's own subset header is removed is held by
/// `gateway_following_epp_routing`, on a stack without a configured hint, where a header
/// that survived would confine the picks.)
async fn a_subset_hint_keeps_every_pick_inside_it(flavor: Flavor) {
    let backends = TestBackend::many(3, QUICK).await;
    backends[0].set_kv(0.01);
    backends[1].set_kv(0.4);
    backends[2].set_kv(0.4);
    let mut layout = Layout::pools(vec![PoolSpec::all(MODEL)]);
    layout.subset_hint = vec![1, 2];
    let Some(stack) = start(flavor, external(&backends), layout).await else {
        return;
    };
    let t = tag(flavor);
    backends[0].wait_scrapes(2).await;
    let stack = Arc::new(stack);
    let subset = send_many(&stack, 60, 6, |i| (chat(MODEL, &format!("s{i}")), vec![])).await;
    let used: BTreeSet<usize> = subset.iter().map(|(b, _)| *b).collect();
    assert!(!used.contains(&0), "{t}: a pick left the subset: {used:?}");
    assert_eq!(used.len(), 2, "{t}: both subset members serve: {used:?}");
    let resp = post(
        &stack,
        &chat(MODEL, "traced"),
        &[("infergate-trace", "subset")],
    )
    .await;
    answered_by(&stack, &resp);
    let log = traced(&stack, "subset").await;
    let expected = format!("{},{}", backends[1].addr, backends[2].addr);
    assert_eq!(log["subset_hint"], expected.as_str(), "{t}: {log}");
}

/// A `FailOpen` pool of three: with metrics, served as picked; once every scrape hangs
/// (the picker's metrics unavailable), still served, spread over every member by in-proxy
/// load.
async fn epp_un_available_fail_open(flavor: Flavor) {
    let pace = StreamPace {
        events: 20,
        gap: Duration::from_millis(50),
    };
    let backends = TestBackend::many(3, pace).await;
    let pool = PoolSpec {
        failure_mode: FailureMode::FailOpen,
        ..PoolSpec::all(MODEL)
    };
    let mut layout = Layout::pools(vec![pool]);
    // Scrapes that hang only age the metrics (the endpoints are never declared dead, which
    // the error suite covers): the picker is left with no metrics at all.
    layout.tweak = Some(Box::new(|plugins| {
        gw::picker_pool(plugins, MODEL)["maxConsecutiveFailures"] = 0.into();
    }));
    let Some(stack) = start(flavor, external(&backends), layout).await else {
        return;
    };
    let t = tag(flavor);
    let resp = post(&stack, &chat(MODEL, "with metrics"), &[]).await;
    answered_by(&stack, &resp);
    for b in &backends {
        b.set_metrics(MetricsMode::Hang);
    }
    // Older than the staleness bound (1 s): the picker has no metrics at all.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let stack = Arc::new(stack);
    let mut streams = Vec::new();
    for i in 0..6 {
        let stack = stack.clone();
        streams.push(tokio::spawn(async move {
            let url = format!("{}/v1/chat/completions", stack.picker_url());
            let mut body = chat(MODEL, &format!("open {i}"));
            body["stream"] = json!(true);
            let resp = post_json_streamed(&url, &body, &[]).await.unwrap();
            let reason = resp
                .headers
                .get("x-llm-d-request-dropped-reason")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (resp.status, served_header(&resp), reason)
        }));
        // Each stream is in flight before the next is picked.
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let mut served = BTreeMap::<String, usize>::new();
    for s in streams {
        let (status, addr, reason) = s.await.unwrap();
        assert_eq!(
            status,
            200,
            "{t}: fail-open answered {status} ({reason:?})\n{}",
            gateway_stats(&stack.envoy().stats().await.unwrap())
        );
        *served.entry(addr.unwrap_or_default()).or_default() += 1;
    }
    assert_eq!(
        served.len(),
        3,
        "{t}: six concurrent streams over three members, by in-proxy load: {served:?}"
    );
    let stats = stack.envoy().stats().await.unwrap();
    assert!(
        stats.sum_containing("infergate.picker.fail_open_picks") >= 6,
        "{t}: fail-open picks\n{}",
        gateway_stats(&stats)
    );
}
