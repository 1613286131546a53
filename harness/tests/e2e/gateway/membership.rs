//! Both flavours: the pool is the membership of its Envoy cluster (file-based EDS), followed
//! as it changes, through a real Envoy over the engine simulator.
//!
//! - [`a_pool_scaled_4_6_3_by_eds_is_followed_within_a_second`]: six simulated replicas,
//!   the pool's EDS file first lists four. Under the calibration workload (its quick size:
//!   64 conversations × 3 turns, started at 8 per second, some 16 in flight) the file is
//!   rewritten to six members, then to three (the last three: the first three, which hold
//!   most conversations' prefixes, leave). Each new member receives a request within 1 s
//!   of its EDS change; a removed one receives none once Envoy applied the file, and the
//!   picker stops choosing it within 1 s (the pick counters per endpoint, polled). 1.5 s
//!   after their removal the removed replicas are killed: the only requests that fail are
//!   streams they still held. It prints the time from each change to the first request on
//!   a new member and to the last request on a removed one.
//! - [`an_unhealthy_member_gets_no_picks`]: four members under Envoy's active health check
//!   (`GET /health` every 200 ms); one is made to fail it. While Envoy holds it unhealthy the
//!   picker never chooses it (its pick counter stands still) and it receives no request;
//!   once it passes again it is picked again.
//! - [`a_removed_member_passing_its_health_check_gets_no_picks`]: four members under the
//!   same health check; one is removed from the EDS file while it still passes its check.
//!   Once Envoy applied the file the picker never chooses it and it receives no request
//!   (Envoy's default would keep it, flagged pending removal, among the healthy hosts).
//!
//! Both run at the suite's Envoy worker count.

use super::tag;
use crate::support::{gw, unbuilt, workers};
use infergate_harness::bench::calibration;
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::{
    Backends, EnvoyOptions, Flavor, Membership, PoolSpec, Stack, StackOptions, DEFAULT_MODEL,
};
use infergate_harness::load::runner::run_target;
use infergate_harness::load::{Assign, Connections, LoadConfig, Target};
use infergate_harness::sim::{self, SimHandle};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

for_each_flavour!(
    a_pool_scaled_4_6_3_by_eds_is_followed_within_a_second,
    an_unhealthy_member_gets_no_picks,
    a_removed_member_passing_its_health_check_gets_no_picks,
);

/// Simulated seconds per real second (the calibration's default).
const TIME_SCALE: f64 = 2.0;

/// How long after the start of the workload the pool grows to six, then shrinks to three.
const GROW_AT: Duration = Duration::from_secs(4);
const SHRINK_AT: Duration = Duration::from_secs(10);

/// Requests started per second (Poisson): some 16 in flight at the calibration's request
/// length at this time scale.
const RATE: f64 = 8.0;

/// The removed replicas are killed this long after their removal.
const KILL_AFTER: Duration = Duration::from_millis(1500);

/// A new member must receive traffic within this of its EDS change.
const NEW_MEMBER_WITHIN: Duration = Duration::from_secs(1);
/// Envoy applies a renamed EDS file within this (inotify, then every worker's copy).
const ENVOY_APPLIES_WITHIN: Duration = Duration::from_millis(250);
/// The picker stops choosing a removed member within this (the next snapshot).
const PICKER_FORGETS_WITHIN: Duration = Duration::from_secs(1);

/// A gateway of `flavor` over `sim`, the one pool on the replicas `initial`, its cluster
/// fed by EDS; `None` when the flavour is not built.
async fn start(
    flavor: Flavor,
    sim: &SimHandle,
    initial: &[usize],
    health_check: Option<Duration>,
) -> Option<Stack> {
    if unbuilt(flavor) {
        return None;
    }
    let mut opts = StackOptions::new(flavor, Backends::External(sim.addrs().to_vec()));
    // Placement gives a new member only its rendezvous share of new prompts; this suite is
    // about following the membership, so it schedules on load and prefix alone.
    let mut pool = PoolSpec::on(DEFAULT_MODEL, initial);
    pool.picker_config = super::epp_config_without_placement();
    opts.pools = vec![pool];
    opts.membership = Membership::Eds;
    opts.health_check = health_check;
    opts.envoy = EnvoyOptions {
        concurrency: workers(),
        // Envoy writes its log out this often (the default, 10 s, would hide the module's
        // membership lines from a failure message).
        extra_args: vec!["--file-flush-interval-msec".into(), "100".into()],
        ..EnvoyOptions::default()
    };
    let stack = Stack::start(opts).await.unwrap();
    gw::wait_for_publish(&stack, 1).await;
    Some(stack)
}

/// The picker's pick counter of every endpoint (`infergate.picker.picks` by endpoint label).
async fn picks(stack: &Stack) -> BTreeMap<SocketAddr, i64> {
    let stats = stack.envoy().stats().await.unwrap();
    stack
        .replicas()
        .iter()
        .map(|a| {
            let label = super::endpoint_label(a);
            let n = stats
                .containing("infergate.picker.picks")
                .filter(|(k, _)| k.contains(&label))
                .map(|(_, v)| v)
                .sum();
            (*a, n)
        })
        .collect()
}

/// The pick counters polled every 50 ms until `stop` is set: (when, counters).
type PickLog = Arc<Mutex<Vec<(Instant, BTreeMap<SocketAddr, i64>)>>>;

/// When the picks of `addr` last grew in `log` (`None`: never).
fn last_pick_growth(
    log: &[(Instant, BTreeMap<SocketAddr, i64>)],
    addr: &SocketAddr,
) -> Option<Instant> {
    log.windows(2)
        .rfind(|w| w[1].1.get(addr) > w[0].1.get(addr))
        .map(|w| w[1].0)
}

async fn a_pool_scaled_4_6_3_by_eds_is_followed_within_a_second(flavor: Flavor) {
    let t = format!("{} x{}", tag(flavor), workers());
    let sim = sim::start(sim::SimConfig {
        replicas: 6,
        ..calibration::sim_config(TIME_SCALE)
    })
    .await
    .unwrap();
    let Some(stack) = start(flavor, &sim, &[0, 1, 2, 3], None).await else {
        return;
    };
    let stack = Arc::new(stack);
    let addrs = sim.addrs().to_vec();
    // Open-loop arrivals: a closed loop of equal requests moves in waves (16 start, 16 end
    // together), and a change landing between two waves would measure the wave, not the
    // gateway.
    let cfg = LoadConfig {
        workload: calibration::workload(true),
        concurrency: 32,
        rate: Some(RATE),
        ..LoadConfig::default()
    };
    let target = Target {
        label: format!("picker {t}"),
        urls: vec![stack.picker_url()],
        assign: Assign::Random,
        connections: Connections::KeepAlive,
    };

    // Poll the pick counters through the run.
    let log: PickLog = Arc::default();
    let polling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let poller = {
        let (stack, log, polling) = (stack.clone(), log.clone(), polling.clone());
        tokio::spawn(async move {
            while polling.load(std::sync::atomic::Ordering::Relaxed) {
                let p = picks(&stack).await;
                log.lock().unwrap().push((Instant::now(), p));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let started = Instant::now();
    let run = tokio::spawn(async move { run_target(&cfg, &target, 1).await });
    tokio::time::sleep_until((started + GROW_AT).into()).await;
    stack.set_members(0, &addrs[..6]).unwrap();
    let grown = Instant::now();
    eprintln!(
        "{t}: grown at unix {:?}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)
    );
    tokio::time::sleep_until((started + SHRINK_AT).into()).await;
    // The three that leave are the first three, the busiest: they hold most conversations'
    // prefixes, so a picker that kept them would keep choosing them.
    stack.set_members(0, &addrs[3..6]).unwrap();
    let shrunk = Instant::now();
    // Then they die, as pods do once they are out of the endpoints: what they still
    // stream is cut.
    tokio::time::sleep_until((shrunk + KILL_AFTER).into()).await;
    // The streams they hold at the kill instant: arrived (no new one arrives any more, they
    // left the pool 1.5 s ago) and not finished, read from each engine right before it dies.
    let mut held_at_kill = 0;
    for i in 0..3 {
        let s = sim.stats(i).await.unwrap();
        held_at_kill += s.running + s.waiting;
        sim.kill(i).unwrap();
    }
    let killed = Instant::now();
    let report = run.await.unwrap().unwrap();
    let ended = Instant::now();
    polling.store(false, std::sync::atomic::Ordering::Relaxed);
    poller.await.unwrap();

    let arrivals = sim.arrivals();
    let log = log.lock().unwrap().clone();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut lines = vec![format!(
        "{t}: {} requests, {} ok, errors {:?}; grown at {:.0} ms, shrunk at {:.0} ms, \
         ended at {:.0} ms",
        report.summary.requests,
        report.summary.ok,
        report.summary.errors,
        ms(grown - started),
        ms(shrunk - started),
        ms(ended - started)
    )];
    let first_any = arrivals
        .iter()
        .find(|a| a.at >= grown)
        .map(|a| ms(a.at - grown));
    lines.push(format!(
        "first request anywhere after the growth: {first_any:?} ms after the EDS change"
    ));
    let mut firsts = Vec::new();
    for (i, addr) in addrs.iter().enumerate().take(6).skip(4) {
        let first = arrivals
            .iter()
            .find(|a| a.replica == i && a.at >= grown)
            .map(|a| a.at - grown);
        lines.push(format!(
            "new member {i} ({addr}): first request {:?} after the EDS change",
            first.map(ms)
        ));
        firsts.push((i, first));
    }
    let mut lasts = Vec::new();
    for (i, addr) in addrs.iter().enumerate().take(3) {
        let last = arrivals
            .iter()
            .filter(|a| a.replica == i)
            .map(|a| a.at)
            .max();
        let signed = |at: Instant| {
            if at >= shrunk {
                ms(at - shrunk)
            } else {
                -ms(shrunk - at)
            }
        };
        let lag = last.map(signed);
        let pick = last_pick_growth(&log, addr).map(signed);
        lines.push(format!(
            "removed member {i} ({addr}): last request {lag:?} ms, last pick seen {pick:?} ms \
             from the EDS change (negative: before it)"
        ));
        lasts.push((i, last, last_pick_growth(&log, addr)));
    }
    // Every request that failed was on a killed replica when it died: answered by one of
    // them, and one of those it still held then.
    let killed_addrs: Vec<String> = addrs[..3].iter().map(ToString::to_string).collect();
    let failed: Vec<_> = report.records.iter().filter(|r| !r.ok()).collect();
    lines.push(format!(
        "killed 0-2 {:.0} ms after the removal, holding {held_at_kill} streams: {} requests \
         failed, served by {:?}",
        ms(killed - shrunk),
        failed.len(),
        failed
            .iter()
            .map(|r| r.served_by.clone())
            .collect::<Vec<_>>()
    ));
    let per_replica: Vec<usize> = (0..6)
        .map(|i| arrivals.iter().filter(|a| a.replica == i).count())
        .collect();
    lines.push(format!("requests per replica: {per_replica:?}"));
    let context = format!(
        "{}\n--- envoy log:\n{}",
        lines.join("\n"),
        stack.envoy().log_tail(30)
    );

    // The run spans both changes, with traffic after the last one: otherwise nothing here
    // says anything.
    assert!(
        arrivals
            .iter()
            .filter(|a| a.at > shrunk + Duration::from_secs(2))
            .count()
            >= 16,
        "the workload must keep running well after the pool shrank\n{context}"
    );
    for r in &failed {
        assert!(
            r.served_by
                .as_ref()
                .is_some_and(|s| killed_addrs.contains(s)),
            "a request failed that no killed replica held: {r:?}\n{context}"
        );
    }
    assert!(failed.len() <= held_at_kill, "{context}");
    assert!(
        arrivals.iter().all(|a| a.replica < 4 || a.at >= grown),
        "replicas 4 and 5 got traffic before they were members\n{context}"
    );
    for (i, first) in firsts {
        let first =
            first.unwrap_or_else(|| panic!("new member {i} never got a request\n{context}"));
        assert!(
            first <= NEW_MEMBER_WITHIN,
            "new member {i} got its first request {first:?} after the EDS change\n{context}"
        );
    }
    for (i, last, last_pick) in lasts {
        if let Some(last) = last {
            assert!(
                last <= shrunk + ENVOY_APPLIES_WITHIN,
                "removed member {i} got a request {:?} after its removal\n{context}",
                last - shrunk
            );
        }
        if let Some(p) = last_pick {
            assert!(
                p <= shrunk + PICKER_FORGETS_WITHIN,
                "the picker still chose removed member {i} {:?} after its removal\n{context}",
                p - shrunk
            );
        }
    }
    eprintln!("{}", lines.join("\n"));
    drop(stack);
    sim.shutdown().await;
}

/// Sends `n` distinct one-turn chats through the gateway, `parallel` at a time; every one
/// must answer 200.
async fn send(stack: &Stack, n: usize, round: &str) {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let url = url.clone();
        let body = serde_json::json!({
            "model": DEFAULT_MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": format!("{round} question {i}: say hi")}],
        });
        set.spawn(async move { post_json(&url, &body, &[]).await });
        if set.len() >= 8 {
            let r = set.join_next().await.unwrap().unwrap().unwrap();
            assert_eq!(
                r.status,
                200,
                "{round}: {}\n{}",
                r.text(),
                stack.envoy().log_tail(10)
            );
        }
    }
    while let Some(r) = set.join_next().await {
        let r = r.unwrap().unwrap();
        assert_eq!(
            r.status,
            200,
            "{round}: {}\n{}",
            r.text(),
            stack.envoy().log_tail(10)
        );
    }
}

/// Envoy's view of `addr` in the pool's cluster: whether admin `/clusters` flags it as
/// failing its active health check.
async fn failing_hc(stack: &Stack, addr: &SocketAddr) -> bool {
    let url = format!("http://{}/clusters", stack.envoy().admin());
    let text = infergate_harness::launch::client::get(&url)
        .await
        .unwrap()
        .text();
    text.lines()
        .filter(|l| l.contains(&format!("::{addr}::health_flags::")))
        .any(|l| l.contains("failed_active_hc"))
}

/// Waits until Envoy's view of `addr` is `failing`, at most 5 s.
async fn wait_hc(stack: &Stack, addr: &SocketAddr, failing: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while failing_hc(stack, addr).await != failing {
        assert!(
            Instant::now() < deadline,
            "Envoy never marked {addr} {}\n{}",
            if failing { "unhealthy" } else { "healthy" },
            stack.envoy().log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn an_unhealthy_member_gets_no_picks(flavor: Flavor) {
    let t = format!("{} x{}", tag(flavor), workers());
    let sim = sim::start(sim::SimConfig {
        replicas: 4,
        ..calibration::sim_config(TIME_SCALE)
    })
    .await
    .unwrap();
    let Some(stack) = start(
        flavor,
        &sim,
        &[0, 1, 2, 3],
        Some(Duration::from_millis(200)),
    )
    .await
    else {
        return;
    };
    let addrs = sim.addrs().to_vec();
    let sick = addrs[1];
    send(&stack, 16, "warm").await;

    sim.set_healthy(1, false).unwrap();
    wait_hc(&stack, &sick, true).await;
    // The snapshot after Envoy's verdict: membership is read every scraper tick (native)
    // or every membershipIntervalMs through admin (wasm).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = picks(&stack).await;
    let since = Instant::now();
    send(&stack, 48, "sick").await;
    let after = picks(&stack).await;
    let arrived: Vec<usize> = (0..4)
        .map(|i| {
            sim.arrivals()
                .iter()
                .filter(|a| a.replica == i && a.at >= since)
                .count()
        })
        .collect();
    let context = format!(
        "{t}: picks before {before:?}, after {after:?}; requests per replica while {sick} \
         was unhealthy: {arrived:?}\n--- envoy log:\n{}",
        stack.envoy().log_tail(20)
    );
    assert_eq!(
        after.get(&sick),
        before.get(&sick),
        "the picker chose a member Envoy holds unhealthy\n{context}"
    );
    assert_eq!(arrived[1], 0, "{context}");
    let healthy_picks: i64 = addrs
        .iter()
        .filter(|a| **a != sick)
        .map(|a| after[a] - before[a])
        .sum();
    assert_eq!(
        healthy_picks, 48,
        "every request picked a healthy member\n{context}"
    );

    // It passes again: it is a candidate again, once Envoy's healthy list has it back
    // (Envoy flags the host at once but rebuilds the healthy list a little later).
    sim.set_healthy(1, true).unwrap();
    wait_hc(&stack, &sick, false).await;
    let passed = Instant::now();
    let mut recovered = after.clone();
    while recovered[&sick] == after[&sick] {
        assert!(
            passed.elapsed() < Duration::from_secs(5),
            "a member healthy again must be picked again: {recovered:?}\n{context}\n\
             --- gateway stats:\n{}",
            gw::gateway_stats(&stack.envoy().stats().await.unwrap())
        );
        send(&stack, 16, &format!("recovered {:?}", passed.elapsed())).await;
        recovered = picks(&stack).await;
    }
    eprintln!(
        "{t}: picked again {:?} after Envoy's check passed",
        passed.elapsed()
    );
    eprintln!("{context}");
    drop(stack);
    sim.shutdown().await;
}

async fn a_removed_member_passing_its_health_check_gets_no_picks(flavor: Flavor) {
    let t = format!("{} x{}", tag(flavor), workers());
    let sim = sim::start(sim::SimConfig {
        replicas: 4,
        ..calibration::sim_config(TIME_SCALE)
    })
    .await
    .unwrap();
    let Some(stack) = start(
        flavor,
        &sim,
        &[0, 1, 2, 3],
        Some(Duration::from_millis(200)),
    )
    .await
    else {
        return;
    };
    let addrs = sim.addrs().to_vec();
    let removed = addrs[1];
    send(&stack, 16, "warm").await;
    wait_hc(&stack, &removed, false).await;

    // Out of the EDS file, still answering its health check.
    stack
        .set_members(0, &[addrs[0], addrs[2], addrs[3]])
        .unwrap();
    // Envoy applies the file, then the next membership snapshot (every scraper tick native,
    // every membershipIntervalMs through admin wasm); several health-check rounds pass, so
    // a host Envoy kept (pending removal) would have passed its check again by now.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = picks(&stack).await;
    let since = Instant::now();
    send(&stack, 48, "removed").await;
    let after = picks(&stack).await;
    let arrived: Vec<usize> = (0..4)
        .map(|i| {
            sim.arrivals()
                .iter()
                .filter(|a| a.replica == i && a.at >= since)
                .count()
        })
        .collect();
    let context = format!(
        "{t}: picks before {before:?}, after {after:?}; requests per replica after {removed} \
         left the EDS file: {arrived:?}\n--- envoy log:\n{}",
        stack.envoy().log_tail(20)
    );
    assert!(
        !failing_hc(&stack, &removed).await,
        "the removed member must still pass its check for this to say anything\n{context}"
    );
    assert_eq!(
        after.get(&removed),
        before.get(&removed),
        "the picker chose a member EDS removed\n{context}"
    );
    assert_eq!(arrived[1], 0, "{context}");
    let member_picks: i64 = addrs
        .iter()
        .filter(|a| **a != removed)
        .map(|a| after[a] - before[a])
        .sum();
    assert_eq!(member_picks, 48, "every request picked a member\n{context}");
    eprintln!("{context}");
    drop(stack);
    sim.shutdown().await;
}
