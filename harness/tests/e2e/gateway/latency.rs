//! The affinity filter's TTFT break, end to end, fed by the latency the gateway measures.
//!
//! Three simulated replicas; twelve conversations with long system prompts of their own,
//! two turns each to settle where each lives. Then the replica holding the most of them is
//! slowed down (a prefill delay: no queue forms, so its scraped metrics show nothing) and
//! the next turns go out one at a time. The replica must lose the sticky set within two
//! requests (one slow answer moves its estimate past the penalty at `smoothing` 0.5) and
//! the conversations it held must move. Restored, and once its slow estimate
//! is stale, it must win back the conversations that had no turn while it was slow: the
//! prefix it holds makes it sticky again. Each request is a line of the printed timeline
//! (time, conversation, its home, where it went, TTFT). The measured TTFT is an Envoy gauge.
//!
//! The config is the one an operator would write for this: the affinity filter with a
//! small `maxTTFTPenaltyMs`, and `latency-observation-scorer` to move the traffic once the
//! set is open (the filter only opens it; the prefix scorer alone would keep the turn where
//! its cache is). The placement scorer is left out: a single gateway's prefix index keeps
//! the conversations, and placement would vote for the slowed replica.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::tag;
use crate::support::gw::{self, Plan};
use infergate_harness::launch::client::post_json_streamed;
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use infergate_harness::sim::REPLICA_ADDR_HEADER;
use infergate_harness::sim::{self, EngineConfig, SimConfig, SimHandle, Slowdown};
use serde_json::{json, Value};

const MODEL: &str = "sim-model";
const REPLICAS: u32 = 3;
const CONVERSATIONS: usize = 12;
/// Each slow answer waits this long before its first token (simulated ms = real ms here).
const SLOW_PREFILL_MS: f64 = 900.0;
const PENALTY_MS: u64 = 200;
const MIN_SAMPLES: u32 = 2;
const STALE_AFTER_MS: u64 = 2_500;

fn epp_config() -> Value {
    json!({
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "latency-observer-producer", "parameters": {
                "smoothing": 0.5, "minSamples": MIN_SAMPLES, "staleAfterMs": STALE_AFTER_MS}},
            {"type": "prefix-cache-affinity-filter", "parameters": {
                "threshold": 0.5, "maxTTFTPenaltyMs": PENALTY_MS}},
            {"type": "prefix-cache-scorer"},
            {"type": "latency-observation-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [{"name": "default", "plugins": [
            {"pluginRef": "prefix-cache-affinity-filter"},
            {"pluginRef": "prefix-cache-scorer", "weight": 2},
            {"pluginRef": "latency-observation-scorer", "weight": 4},
            {"pluginRef": "inflight-load-scorer", "weight": 1},
            {"pluginRef": "max-score-picker"}
        ]}]
    })
}

/// One request of the timeline.
#[derive(Clone, Copy)]
struct Step {
    at: Duration,
    conversation: usize,
    home: usize,
    served: usize,
    ttft: Duration,
}

struct Run {
    stack: Stack,
    sim: SimHandle,
    history: Vec<Vec<Value>>,
    started: Instant,
    timeline: Vec<Step>,
}

impl Run {
    /// Sends conversation `c`'s next turn, streamed; the replica that served it.
    async fn turn(&mut self, c: usize, home: usize) -> usize {
        let turn = self.history[c].len();
        self.history[c].push(json!({"role": "user",
            "content": format!("turn {turn} of conversation {c}: go on, please.")}));
        let body = json!({"model": MODEL, "messages": self.history[c], "max_tokens": 8,
            "stream": true});
        let url = format!("{}/v1/chat/completions", self.stack.picker_url());
        let resp = post_json_streamed(&url, &body, &[]).await.unwrap();
        assert_eq!(
            resp.status,
            200,
            "{}",
            String::from_utf8_lossy(&resp.body())
        );
        let addr = resp
            .headers
            .get(REPLICA_ADDR_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let served = self
            .sim
            .addrs()
            .iter()
            .position(|a| a.to_string() == addr)
            .unwrap_or_else(|| panic!("served by {addr}, not a replica"));
        self.history[c].push(json!({"role": "assistant", "content": "ok"}));
        self.timeline.push(Step {
            at: self.started.elapsed(),
            conversation: c,
            home,
            served,
            ttft: resp.chunks.first().map_or(Duration::ZERO, |ch| ch.at),
        });
        served
    }

    fn print(&self, label: &str) {
        eprintln!("{label}: time, conversation, home → served, TTFT (home - : not settled yet)");
        for s in &self.timeline {
            let home = if s.home == usize::MAX {
                "- ".to_string()
            } else {
                format!("r{}", s.home)
            };
            eprintln!(
                "  {:>6} ms  c{:<2} {home} → r{}  {:>5} ms",
                s.at.as_millis(),
                s.conversation,
                s.served,
                s.ttft.as_millis()
            );
        }
    }
}

/// The slowed replica's measured TTFT gauge, in µs (summed over the stat's flavours).
async fn measured_ttft_us(stack: &Stack, replica: &std::net::SocketAddr) -> i64 {
    let label = super::endpoint_label(replica);
    let stats = stack.envoy().stats().await.unwrap();
    stats
        .containing("infergate.picker.observed_ttft_us")
        .filter(|(k, _)| k.ends_with(&label))
        .map(|(_, v)| v)
        .max()
        .unwrap_or(0)
}

async fn a_slowed_replica_loses_the_sticky_set_and_wins_it_back(flavor: Flavor, workers: u32) {
    let label = format!("{} at {workers} worker(s)", tag(flavor));
    let sim = sim::start(SimConfig {
        replicas: REPLICAS,
        models: vec![MODEL.into()],
        engine: EngineConfig::default(),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let mut pool = PoolSpec::all(MODEL);
    pool.picker_config = epp_config();
    let mut plan = Plan::new(vec![pool]);
    plan.concurrency = workers;
    let Some(stack) = gw::start_over(flavor, sim.addrs().to_vec(), plan).await else {
        return;
    };
    let history = (0..CONVERSATIONS)
        .map(|c| {
            let system = format!(
                "conversation {c} of the TTFT break. {}",
                "Think about the question, then answer in one short line. ".repeat(40)
            );
            vec![json!({"role": "system", "content": system})]
        })
        .collect();
    let mut run = Run {
        stack,
        sim,
        history,
        started: Instant::now(),
        timeline: Vec::new(),
    };

    // Settle: two turns each; a conversation lives where its second turn went.
    let mut home = Vec::with_capacity(CONVERSATIONS);
    for c in 0..CONVERSATIONS {
        run.turn(c, usize::MAX).await;
        home.push(run.turn(c, usize::MAX).await);
    }
    let mut held: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (c, h) in home.iter().enumerate() {
        held.entry(*h).or_default().push(c);
    }
    let (&slow, mine) = held.iter().max_by_key(|(_, cs)| cs.len()).unwrap();
    let mine = mine.clone();
    assert!(
        mine.len() >= MIN_SAMPLES as usize + 2,
        "{label}: the busiest replica holds {mine:?}; the test needs more conversations there"
    );

    // Slow it. Turns go out one at a time: first those of the slow replica's conversations
    // but the last, then every other conversation once.
    run.sim
        .set_slowdown(slow, Slowdown::new(1.0, SLOW_PREFILL_MS).unwrap())
        .await
        .unwrap();
    let slow_phase = run.timeline.len();
    let (untouched, moved) = mine.split_last().unwrap();
    for &c in moved {
        run.turn(c, slow).await;
    }
    for c in (0..CONVERSATIONS).filter(|c| home[*c] != slow) {
        run.turn(c, home[c]).await;
    }
    let after_slow: Vec<Step> = run.timeline[slow_phase..].to_vec();
    let to_slow = after_slow.iter().filter(|s| s.served == slow).count();
    let measured = measured_ttft_us(&run.stack, &run.sim.addrs()[slow]).await;

    // Restore it, let its slow estimate go stale, and send the conversation it still holds
    // alone, then the others.
    run.sim.set_slowdown(slow, Slowdown::NONE).await.unwrap();
    tokio::time::sleep(Duration::from_millis(STALE_AFTER_MS + 500)).await;
    let recovered = run.timeline.len();
    let back = run.turn(*untouched, slow).await;
    for c in (0..CONVERSATIONS).filter(|c| home[*c] != slow) {
        run.turn(c, home[c]).await;
    }
    run.print(&label);

    // One slow answer moves the estimate (smoothing 0.5) past the penalty; a second may
    // reach the replica while the first one's timing is on its way to the Wasm owner.
    assert!(
        (1..=MIN_SAMPLES as usize).contains(&to_slow),
        "{label}: {to_slow} turns reached r{slow} after the slowdown"
    );
    assert!(
        after_slow[..to_slow].iter().all(|s| s.served == slow),
        "{label}: the turns that reached r{slow} are the first ones after the slowdown"
    );
    for s in &after_slow[to_slow..] {
        assert_ne!(
            s.served, slow,
            "{label}: c{} still sent to r{slow}",
            s.conversation
        );
        if s.home != slow {
            assert_eq!(
                s.served, s.home,
                "{label}: c{} left its healthy home",
                s.conversation
            );
        }
    }
    assert!(
        measured >= (SLOW_PREFILL_MS as i64) * 1_000 / 3,
        "{label}: r{slow}'s measured TTFT gauge reads {measured} µs"
    );
    assert_eq!(
        back, slow,
        "{label}: restored, r{slow} wins back c{untouched}"
    );
    for s in &run.timeline[recovered + 1..] {
        assert_eq!(
            s.served, s.home,
            "{label}: c{} after recovery",
            s.conversation
        );
    }
}

pub(super) async fn a_slowed_replica_loses_the_sticky_set_at_one_worker(flavor: Flavor) {
    a_slowed_replica_loses_the_sticky_set_and_wins_it_back(flavor, 1).await;
}

pub(super) async fn a_slowed_replica_loses_the_sticky_set_at_four_workers(flavor: Flavor) {
    a_slowed_replica_loses_the_sticky_set_and_wins_it_back(flavor, 4).await;
}
