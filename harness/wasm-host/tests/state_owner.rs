//! The Wasm flavour's one picker state per process, over the product module: several worker
//! VMs send their picks to the state owner in the scraper's VM through shared queues.
//! Conversations keep their endpoint whichever worker carries a turn, the in-flight load
//! the owner counts returns to zero, and a worker whose owner is missing, silent or fed
//! garbage still serves its requests. With one worker, that worker's VM owns the state and
//! picks without a message.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::gateway::{answer_scrapes, chat, LLAMA, LLAMA_POOL};
use common::{product_module, testdata};
use infergate_wasm_host::{Action, Host, HttpStream, SharedData};

const INFLIGHT: &str = "infergate.picker.inflight_requests.pool.llama-pool";
const FALLBACKS: &str = "infergate.picker.owner_fallbacks";

/// A scraper VM (the owner) with one answered scrape round, and `workers` picker VMs.
fn stack(workers: usize) -> (Host, Vec<Host>) {
    let shared = SharedData::new();
    let scraper = Host::builder()
        .vm_id("infergate")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    scraper
        .configure_plugin(
            "picker",
            common::picker_with_scraper(&testdata("filters/scraper.json")),
        )
        .unwrap();
    scraper.advance_time_ms(50).unwrap();
    assert_eq!(answer_scrapes(&scraper), 4);
    let workers = (0..workers)
        .map(|_| {
            let w = Host::builder()
                .vm_id("infergate")
                .shared_data(&shared)
                .time_ms(scraper.now_ms())
                .load(product_module())
                .unwrap();
            w.configure_plugin("picker", testdata("filters/picker.json"))
                .unwrap();
            w
        })
        .collect();
    (scraper, workers)
}

/// `name` on the owner's host as Envoy shows it: the owner's VM keeps its counter and
/// gauge updates until its next tick, which this fires (at the current time, so nothing
/// else falls due).
fn owner_metric(owner: &Host, name: &str) -> Option<u64> {
    owner.tick().unwrap();
    owner.metric(name)
}

/// Delivers queue messages among `hosts` until none is left.
fn exchange(hosts: &[&Host]) {
    for _ in 0..8 {
        let delivered: usize = hosts.iter().map(|h| h.deliver_queues().unwrap()).sum();
        if delivered == 0 {
            return;
        }
    }
    panic!("the VMs keep answering each other's queue messages");
}

/// Headers and the complete body of a chat request on a new stream of `worker`'s picker,
/// a worker whose VM is not the owner's: the request waits for the owner's answer.
fn send(worker: &Host, content: &str) -> HttpStream {
    send_expecting(worker, content, Action::Pause)
}

/// As [`send`], with what the body answers: `Pause` on a worker that waits for the owner,
/// `Continue` on the owner's own VM, which answers the pick as it is made.
fn send_expecting(worker: &Host, content: &str, at_body: Action) -> HttpStream {
    let s = worker.new_http_stream().unwrap();
    let headers = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("x-gateway-base-model-name", LLAMA),
        ("x-gateway-model-name", LLAMA),
    ];
    assert_eq!(s.request_headers(&headers, false).unwrap(), Action::Pause);
    assert_eq!(
        s.request_body(chat(content).as_bytes(), true).unwrap(),
        at_body,
        "waits for the owner, unless it is the owner"
    );
    if at_body == Action::Pause {
        assert_eq!(s.upstream_request_headers(), None, "nothing forwarded yet");
    } else {
        assert!(s.upstream_request_headers().is_some(), "forwarded at once");
    }
    s
}

/// What a request's body answers on `hosts[i]`: at once on the owner's VM.
fn at_body(hosts: &[&Host], i: usize) -> Action {
    if hosts[i].metric(TAKEOVERS).unwrap_or(0) > 0 {
        Action::Continue
    } else {
        Action::Pause
    }
}

fn destination(s: &HttpStream) -> String {
    assert!(s.local_response().is_none(), "{:?}", s.local_response());
    let up = s.upstream_request_headers().expect("forwarded");
    let list = up.get("x-gateway-destination-endpoint").expect("picked");
    // The pick, then its fallbacks: every one an endpoint of the pool.
    assert!(list.split(',').all(|e| LLAMA_POOL.contains(&e)), "{list}");
    list.split(',').next().unwrap_or_default().to_string()
}

fn finish(s: &HttpStream) {
    s.response_headers(&[(":status", "200")], false).unwrap();
    s.response_body(b"data: [DONE]\n\n", true).unwrap();
    assert!(s.done().unwrap());
}

#[test]
fn turns_on_four_workers_keep_their_endpoint_and_the_load_returns_to_zero() {
    let (owner, workers) = stack(4);
    let mut hosts: Vec<&Host> = vec![&owner];
    hosts.extend(workers.iter());
    let mut endpoints_used = Vec::new();
    for conv in 0..6 {
        let mut history = format!("conversation {conv}: a long shared system prompt. ").repeat(40);
        let mut served = Vec::new();
        for turn in 0..4 {
            history.push_str(&format!(" turn {turn} question."));
            let worker = &workers[(conv + turn) % workers.len()];
            let s = send(worker, &history);
            exchange(&hosts);
            served.push(destination(&s));
            // This request, plus at most one ended request per other worker whose lease
            // waits for that worker's next pick or tick (this worker's went back with
            // this pick).
            let in_flight = owner_metric(&owner, INFLIGHT).unwrap_or(0);
            assert!(
                (1..=workers.len() as u64).contains(&in_flight),
                "the owner counts {in_flight} in flight"
            );
            finish(&s);
            exchange(&hosts);
        }
        assert!(
            served.iter().all(|e| *e == served[0]),
            "conversation {conv}: {served:?}"
        );
        endpoints_used.push(served[0].clone());
    }
    endpoints_used.sort();
    endpoints_used.dedup();
    assert!(endpoints_used.len() > 1, "load spreads: {endpoints_used:?}");
    // Idle workers give their last leases back at their next tick.
    assert!(
        owner_metric(&owner, INFLIGHT).unwrap_or(0) > 0,
        "held until a tick"
    );
    for w in &workers {
        w.advance_time_ms(250).unwrap();
    }
    exchange(&hosts);
    assert_eq!(
        owner_metric(&owner, INFLIGHT),
        Some(0),
        "released at the end"
    );
    for w in &workers {
        assert_eq!(w.metric(FALLBACKS).unwrap_or(0), 0);
        assert_eq!(w.trapped(), None);
    }
    assert_eq!(owner.trapped(), None);
}

#[test]
fn a_stream_reset_while_waiting_releases_the_lease_of_the_late_answer() {
    let (owner, workers) = stack(1);
    let hosts = [&owner, &workers[0]];
    let s = send(&workers[0], "reset before the answer");
    // The pick reaches the owner, which takes a lease ...
    owner.deliver_queues().unwrap();
    assert_eq!(owner_metric(&owner, INFLIGHT), Some(1));
    // ... but the client goes away before the answer is delivered.
    assert!(s.done().unwrap());
    exchange(&hosts);
    workers[0].advance_time_ms(250).unwrap();
    exchange(&hosts);
    assert_eq!(owner_metric(&owner, INFLIGHT), Some(0));
    // The worker still serves.
    let s = send(&workers[0], "next");
    exchange(&hosts);
    destination(&s);
}

#[test]
fn without_an_owner_the_worker_picks_in_its_own_state_and_says_so() {
    let shared = SharedData::new();
    let worker = Host::builder()
        .vm_id("infergate")
        .shared_data(&shared)
        .load(product_module())
        .unwrap();
    worker
        .configure_plugin("picker", testdata("filters/picker.json"))
        .unwrap();
    let s = worker.new_http_stream().unwrap();
    let headers = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("x-gateway-base-model-name", LLAMA),
    ];
    s.request_headers(&headers, false).unwrap();
    s.request_body(chat("alone").as_bytes(), true).unwrap();
    // No snapshot anywhere and a FailClose pool: the local pick answers 503 at once.
    assert_eq!(s.local_response().map(|r| r.status), Some(503));
    // A stream's counters reach Envoy at its root's next tick, not one hostcall each.
    assert_eq!(worker.metric(FALLBACKS).unwrap_or(0), 0);
    worker.tick().unwrap();
    assert_eq!(worker.metric(FALLBACKS), Some(1));
    assert!(worker.logged("no picker state owner"));
    assert_eq!(worker.trapped(), None);
}

#[test]
fn a_silent_owner_is_given_up_on_after_a_second_and_the_request_is_picked_here() {
    let (owner, workers) = stack(1);
    let worker = &workers[0];
    let s = send(worker, "the owner is busy");
    worker.advance_time_ms(500).unwrap();
    assert_eq!(s.upstream_request_headers(), None, "still waiting");
    worker.advance_time_ms(600).unwrap();
    // Picked in the worker's own state, which has the snapshot the owner's scraper published.
    assert_eq!(worker.metric(FALLBACKS), Some(1));
    let _ = destination(&s);
    finish(&s);
    // The owner's answer comes late: nobody waits for it, so its lease goes back, with
    // the worker's next tick.
    exchange(&[&owner, worker]);
    worker.advance_time_ms(250).unwrap();
    exchange(&[&owner, worker]);
    assert_eq!(owner_metric(&owner, INFLIGHT), Some(0));
    assert_eq!(worker.trapped(), None);
    assert_eq!(owner.trapped(), None);
}

#[test]
fn garbage_on_the_owners_queue_is_dropped_and_the_owner_keeps_serving() {
    let (owner, workers) = stack(1);
    let shared = owner.shared_data();
    let queue = shared
        .resolve_queue("infergate.picker.owner")
        .expect("the owner registered its queue");
    for garbage in [
        &b""[..],
        b"\x02",
        b"\x01\xff",
        &[0xAB; 300],
        b"\x02\x00\x00\x00",
    ] {
        assert!(shared.enqueue(queue, garbage));
    }
    owner.deliver_queues().unwrap();
    assert!(owner.logged("malformed message"));
    assert_eq!(owner.trapped(), None);
    let s = send(&workers[0], "after the garbage");
    exchange(&[&owner, &workers[0]]);
    destination(&s);
}

#[test]
fn a_request_its_fallback_served_moves_its_load_at_the_owner() {
    let (owner, workers) = stack(1);
    let worker = &workers[0];
    let hosts = [&owner, worker];
    let s = send(worker, "a question a retry will take to the fallback");
    exchange(&hosts);
    let list = s
        .upstream_request_headers()
        .and_then(|up| up.get("x-gateway-destination-endpoint"))
        .expect("forwarded with a destination");
    let (picked, fallback) = list.split_once(',').expect("a pick and one fallback");
    assert!(
        LLAMA_POOL.contains(&picked) && LLAMA_POOL.contains(&fallback),
        "{list}"
    );
    let gauge = |endpoint: &str| {
        owner_metric(
            &owner,
            &format!("{INFLIGHT}.endpoint.{}", endpoint.replace(['.', ':'], "_")),
        )
        .unwrap_or(0)
    };
    assert_eq!((gauge(picked), gauge(fallback)), (1, 0));
    // Envoy's retry reached the fallback: the upstream address says so at the response.
    s.set_property(&["upstream", "address"], fallback.as_bytes().to_vec())
        .unwrap();
    s.response_headers(&[(":status", "200")], false).unwrap();
    assert_eq!(
        s.response_header_map()
            .get("x-gateway-destination-endpoint-served")
            .as_deref(),
        Some(fallback)
    );
    worker.tick().unwrap();
    assert_eq!(
        worker.metric("infergate.picker.served_by_fallback.pool.llama-pool"),
        Some(1)
    );
    exchange(&hosts);
    assert_eq!(
        (gauge(picked), gauge(fallback)),
        (0, 1),
        "moved at the owner"
    );
    s.response_body(b"data: [DONE]\n\n", true).unwrap();
    assert!(s.done().unwrap());
    worker.advance_time_ms(250).unwrap();
    exchange(&hosts);
    assert_eq!((gauge(picked), gauge(fallback)), (0, 0));
    assert_eq!(owner_metric(&owner, INFLIGHT), Some(0));
    assert_eq!(worker.trapped(), None);
    assert_eq!(owner.trapped(), None);
}

const TAKEOVERS: &str = "infergate.owner.takeovers";
const RESENDS: &str = "infergate.picker.owner_resends";

/// `n` worker VMs of `vm_id ""` (Istio's), every one a candidate (its picker carries the
/// scraper), on one clock.
fn candidates(n: usize, shared: &SharedData) -> Vec<Host> {
    (0..n)
        .map(|i| {
            let w = Host::builder()
                .vm_id("")
                .shared_data(shared)
                .time_ms(1_000)
                // Distinct: the host keeps the seed's low bit set.
                .random_seed(2 * i as u64 + 1)
                .load(product_module())
                .unwrap();
            w.configure_plugin(
                "picker",
                common::picker_with_scraper(&testdata("filters/scraper.json")),
            )
            .unwrap();
            w
        })
        .collect()
}

/// Advances every host's clock by `ms` in 50 ms ticks, answering scrapes.
fn run_for(hosts: &[&Host], ms: u64) {
    for _ in 0..ms / 50 {
        for h in hosts {
            h.advance_time_ms(50).unwrap();
            answer_scrapes(h);
        }
    }
}

/// The index of the host that scrapes (holds the owner's lease) among `hosts`.
fn scraping(hosts: &[&Host]) -> Vec<usize> {
    (0..hosts.len())
        .filter(|&i| {
            hosts[i].metric(TAKEOVERS).unwrap_or(0) > 0
                && hosts[i].metric("infergate.scraper.publishes").unwrap_or(0) > 0
        })
        .collect()
}

#[test]
fn workers_elect_one_owner_that_scrapes_and_answers_every_workers_picks() {
    let shared = SharedData::new();
    let workers = candidates(3, &shared);
    let hosts: Vec<&Host> = workers.iter().collect();
    // Configuration alone elects nobody (Envoy's canary VM is configured, never ticked).
    assert!(
        shared.keys().iter().all(|k| !k.contains("owner.lease")),
        "{:?}",
        shared.keys()
    );
    assert!(hosts.iter().all(|h| h.pending_http_calls().is_empty()));
    run_for(&hosts, 200);
    let owners: Vec<usize> = (0..3)
        .filter(|&i| hosts[i].metric(TAKEOVERS).unwrap_or(0) > 0)
        .collect();
    assert_eq!(owners.len(), 1, "exactly one owner: {owners:?}");
    assert_eq!(scraping(&hosts), owners);
    // Every shared-data key of the module carries its instance.
    assert!(
        shared.keys().iter().all(|k| k.starts_with("infergate.")),
        "{:?}",
        shared.keys()
    );
    // A conversation's turns on every worker meet one state: same endpoint, no fallback.
    let mut history = "a long shared system prompt. ".repeat(40);
    let mut served = Vec::new();
    for turn in 0..6 {
        history.push_str(&format!(" turn {turn}."));
        let i = (turn + owners[0] + 1) % 3;
        let s = send_expecting(hosts[i], &history, at_body(&hosts, i));
        exchange(&hosts);
        served.push(destination(&s));
        finish(&s);
        exchange(&hosts);
    }
    assert!(served.iter().all(|e| *e == served[0]), "{served:?}");
    for h in &hosts {
        assert_eq!(h.metric(FALLBACKS).unwrap_or(0), 0);
        assert_eq!(h.trapped(), None);
    }
}

#[test]
fn a_dead_owner_is_replaced_within_its_lease_and_waiting_picks_are_answered_by_the_next() {
    let shared = SharedData::new();
    let mut workers = candidates(3, &shared);
    {
        let hosts: Vec<&Host> = workers.iter().collect();
        run_for(&hosts, 100);
    }
    let owner = (0..3)
        .find(|&i| workers[i].metric(TAKEOVERS).unwrap_or(0) > 0)
        .expect("an owner");
    // A pick reaches the owner's queue; the owner dies before answering (its VM is gone
    // without a word: no resignation).
    let waiting_on = (owner + 1) % 3;
    let s = send(&workers[waiting_on], "a question for an owner about to die");
    let dead = workers.remove(owner);
    drop(dead);
    let hosts: Vec<&Host> = workers.iter().collect();
    let died_at = hosts[0].now_ms();
    let mut first_pick_at = None;
    for _ in 0..30 {
        for h in &hosts {
            h.advance_time_ms(50).unwrap();
            answer_scrapes(h);
        }
        exchange(&hosts);
        if first_pick_at.is_none() && s.upstream_request_headers().is_some() {
            first_pick_at = Some(hosts[0].now_ms());
        }
    }
    let failover = first_pick_at.expect("the waiting pick was answered") - died_at;
    assert!(
        failover <= 1_000,
        "answered {failover} ms after the owner died"
    );
    // Answered by the new owner (resent to it), not picked locally.
    destination(&s);
    let new_owners: Vec<usize> = (0..2)
        .filter(|&i| hosts[i].metric(TAKEOVERS).unwrap_or(0) > 0)
        .collect();
    assert_eq!(new_owners.len(), 1, "{new_owners:?}");
    assert_eq!(hosts[waiting_on.min(1)].metric(FALLBACKS).unwrap_or(0), 0);
    assert!(
        hosts
            .iter()
            .map(|h| h.metric(RESENDS).unwrap_or(0))
            .sum::<u64>()
            >= 1
    );
    assert_eq!(scraping(&hosts), new_owners);
    finish(&s);
    // The new owner's in-flight count returns to the truth once the workers' ticks give
    // the leases back.
    run_for(&hosts, 300);
    exchange(&hosts);
    assert_eq!(hosts[new_owners[0]].metric(INFLIGHT).unwrap_or(0), 0);
}

#[test]
fn an_owner_that_goes_away_resigns_and_the_next_tick_takes_over_at_once() {
    let shared = SharedData::new();
    let workers = candidates(2, &shared);
    let hosts: Vec<&Host> = workers.iter().collect();
    run_for(&hosts, 100);
    let owner = (0..2)
        .find(|&i| hosts[i].metric(TAKEOVERS).unwrap_or(0) > 0)
        .expect("an owner");
    let other = 1 - owner;
    // The owner's root is replaced (a configuration update): the old root resigns.
    let old = hosts[owner].root_context_id("picker").unwrap();
    hosts[owner]
        .configure_plugin("picker", testdata("filters/picker.json"))
        .unwrap();
    hosts[owner].remove_plugin(old).unwrap();
    hosts[other].advance_time_ms(50).unwrap();
    assert_eq!(
        hosts[other].metric(TAKEOVERS),
        Some(1),
        "taken at the next tick"
    );
    assert!(!hosts[other].pending_http_calls().is_empty(), "and scrapes");
}

#[test]
fn another_plugins_shared_data_in_the_same_vm_id_does_not_disturb_the_gateway() {
    let shared = SharedData::new();
    // Another vendor's plugin in vm_id "" writes keys of its own, one of them the bare
    // name a module without an instance prefix would have used.
    for (k, v) in [
        ("owner.lease", &b"theirs"[..]),
        ("snapshot", b"x"),
        ("picker.owner", b"y"),
    ] {
        shared.set(k, v, 0).unwrap();
    }
    let workers = candidates(2, &shared);
    let hosts: Vec<&Host> = workers.iter().collect();
    run_for(&hosts, 100);
    let s = send_expecting(hosts[0], "hello", at_body(&hosts, 0));
    exchange(&hosts);
    destination(&s);
    assert_eq!(hosts[0].metric(FALLBACKS).unwrap_or(0), 0);
    assert_eq!(
        shared.get("owner.lease").map(|(v, _)| v),
        Some(b"theirs".to_vec())
    );
}

const EXPIRED: &str = "infergate.owner.leases_expired";

/// Advances `hosts` by `ms` in 50 ms steps, answering the scrapes and the queue messages.
fn live_for(hosts: &[&Host], ms: u64) {
    for _ in 0..ms / 50 {
        for h in hosts {
            h.advance_time_ms(50).unwrap();
            answer_scrapes(h);
        }
        exchange(hosts);
    }
}

#[test]
fn the_leases_of_a_worker_vm_that_dies_expire_and_a_living_workers_long_request_keeps_its_own() {
    let (owner, mut workers) = stack(2);
    let living = workers.pop().unwrap();
    let dying = workers.pop().unwrap();
    let everyone = [&owner, &dying, &living];
    let doomed: Vec<HttpStream> = (0..2)
        .map(|i| send(&dying, &format!("request {i} of a worker about to die")))
        .collect();
    exchange(&everyone);
    for s in &doomed {
        destination(s);
    }
    let long = send(&living, "a long request on a worker that lives on");
    exchange(&everyone);
    destination(&long);
    assert_eq!(owner_metric(&owner, INFLIGHT), Some(3));
    // The dying worker's VM is destroyed with its streams, as Envoy replaces a VM after a
    // trap: none of its code runs again, so its leases never come back.
    drop(doomed);
    drop(dying);
    let survivors = [&owner, &living];
    live_for(&survivors, 1_500);
    assert_eq!(
        owner_metric(&owner, INFLIGHT),
        Some(3),
        "kept within the holder's TTL"
    );
    assert_eq!(owner_metric(&owner, EXPIRED).unwrap_or(0), 0);
    live_for(&survivors, 2_500);
    assert_eq!(
        owner_metric(&owner, EXPIRED),
        Some(2),
        "the dead worker's leases expired"
    );
    assert_eq!(
        owner_metric(&owner, INFLIGHT),
        Some(1),
        "the living worker's request, 4 s long, keeps its lease"
    );
    finish(&long);
    live_for(&survivors, 300);
    assert_eq!(owner_metric(&owner, INFLIGHT), Some(0));
    assert_eq!(owner_metric(&owner, EXPIRED), Some(2));
    assert_eq!(living.metric(FALLBACKS).unwrap_or(0), 0);
    assert_eq!(living.trapped(), None);
    assert_eq!(owner.trapped(), None);
}

#[test]
fn a_worker_root_that_goes_away_sends_the_releases_it_still_batches() {
    let (owner, workers) = stack(1);
    let worker = &workers[0];
    let s = send(worker, "ended before a configuration update");
    exchange(&[&owner, worker]);
    destination(&s);
    finish(&s);
    exchange(&[&owner, worker]);
    assert_eq!(
        owner_metric(&owner, INFLIGHT),
        Some(1),
        "batched for the next tick"
    );
    // A configuration update replaces the worker's root before that tick.
    let old = worker.root_context_id("picker").unwrap();
    worker
        .configure_plugin("picker", testdata("filters/picker.json"))
        .unwrap();
    worker.remove_plugin(old).unwrap();
    owner.deliver_queues().unwrap();
    assert_eq!(
        owner_metric(&owner, INFLIGHT),
        Some(0),
        "given back at once, not expired"
    );
    assert_eq!(owner_metric(&owner, EXPIRED).unwrap_or(0), 0);
}

/// Envoy with one worker: two candidates, the main thread's VM (which never gets a stream)
/// and the worker's. Whichever was elected, once the worker serves requests it owns the
/// state: it claims the lease from an idle holder at its first stream, and from then on its
/// picks are answered in its own VM as they are made, with no queue message; the old holder
/// steps down at its next tick and stops scraping.
#[test]
fn the_one_worker_that_serves_requests_owns_the_state_and_picks_without_a_message() {
    let shared = SharedData::new();
    let vms = candidates(2, &shared);
    let hosts: Vec<&Host> = vms.iter().collect();
    // Past the roster's settling time, so the first stream claims at once.
    run_for(&hosts, 200 + infergate_filters::election::CLAIM_SETTLE_MS);
    let first = (0..2)
        .find(|&i| hosts[i].metric(TAKEOVERS).unwrap_or(0) > 0)
        .expect("an owner");
    // The worker is the VM that did not win the first election (the harder case).
    let (main, worker) = (hosts[first], hosts[1 - first]);
    let mut history = "a long shared system prompt. ".repeat(40);
    let mut served = Vec::new();
    for turn in 0..4 {
        history.push_str(&format!(" turn {turn}."));
        let s = send_expecting(worker, &history, Action::Continue);
        served.push(destination(&s));
        finish(&s);
    }
    assert!(served.iter().all(|e| *e == served[0]), "{served:?}");
    worker.tick().unwrap();
    assert_eq!(worker.metric("infergate.owner.claims"), Some(1));
    assert_eq!(worker.metric(TAKEOVERS), Some(1));
    // The old holder steps down at its tick; the worker scrapes from then on.
    const PUBLISHES: &str = "infergate.scraper.publishes";
    run_for(&hosts, 100);
    let published = |h: &Host| h.metric(PUBLISHES).unwrap_or(0);
    let (main_before, worker_before) = (published(main), published(worker));
    run_for(&hosts, 500);
    assert_eq!(
        published(main),
        main_before,
        "the old holder stopped scraping"
    );
    assert!(published(worker) > worker_before, "the worker scrapes");
    assert_eq!(main.metric("infergate.owner.claims").unwrap_or(0), 0);
    // Its messages counted at its tick: a hello and a pick per turn (releases ride on picks).
    assert!(worker.metric("infergate.owner.local_messages").unwrap_or(0) >= 4);
    // Nothing waits in the old owner's queue and no lease is left in flight.
    assert_eq!(exchange_count(&hosts), 0);
    worker.advance_time_ms(250).unwrap();
    assert_eq!(worker.metric(INFLIGHT), Some(0));
    for h in &hosts {
        assert_eq!(h.metric(FALLBACKS).unwrap_or(0), 0);
        assert_eq!(h.trapped(), None);
    }
}

/// How many queue messages are waiting among `hosts` (delivered now).
fn exchange_count(hosts: &[&Host]) -> usize {
    hosts.iter().map(|h| h.deliver_queues().unwrap()).sum()
}
