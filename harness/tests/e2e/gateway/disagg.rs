//! Both flavours: prefill/decode disaggregation through a real Envoy, over the engine
//! simulator acting as the decode replica's sidecar.
//!
//! Three replicas: one `prefill`, two `decode` (the picker pool's `endpointRoles`). The
//! pool's `eppConfig` runs `disagg-profile-handler` with `prefix-based-pd-decider`
//! (`nonCachedTokens` 512): the decode profile (prefix affinity, then load) picks the
//! destination, and when at least 512 prompt tokens are uncached there the prefill profile
//! picks the prefiller, sent as `x-prefiller-host-port`. The simulator's decode replica
//! then has the named replica compute the prompt over HTTP, charges the KV transfer, and
//! decodes; its `x-sim-prefilled-by` / `x-sim-decoded-by` headers say who did what.
//!
//! - A long uncached prompt is prefilled on the prefill replica and decoded on a decode
//!   replica; its second turn (its prompt now cached on that decode replica) is decoded
//!   there without a remote prefill.
//! - A client-sent `x-prefiller-host-port` has no effect: a short prompt stays local
//!   whatever the client names, and a long one goes to the gateway's prefiller, not the
//!   client's.

use serde_json::{json, Value};

use crate::support::gw::{self, picker_pool, Plan};
use infergate_harness::launch::client::{post_json, HttpResponse};
use infergate_harness::launch::{Flavor, PoolSpec, Stack};
use infergate_harness::sim::disagg::{
    DECODED_BY_HEADER, KV_TRANSFER_MS_HEADER, PREFILLED_BY_HEADER, PREFILLER_HEADER,
    PREFILL_FAILED_HEADER,
};
use infergate_harness::sim::{self, SimConfig, SimHandle};

const MODEL: &str = "sim-model";

for_each_flavour!(
    a_long_uncached_prompt_is_prefilled_elsewhere_and_its_cached_second_turn_is_not,
    a_client_sent_prefiller_has_no_effect,
);

/// The pool's scheduling: decode by prefix affinity then load, prefill by load, the prompt
/// prefilled elsewhere from 512 uncached tokens on.
fn epp_config() -> Value {
    json!({
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "prefix-based-pd-decider", "parameters": {"nonCachedTokens": 512}},
            {"type": "disagg-profile-handler",
             "parameters": {"deciders": {"prefill": "prefix-based-pd-decider"}}},
            {"type": "prefix-cache-scorer"},
            {"type": "inflight-load-scorer"},
            {"type": "queue-scorer"},
            {"type": "max-score-picker"}
        ],
        "schedulingProfiles": [
            {"name": "decode", "plugins": [
                {"pluginRef": "prefix-cache-scorer", "weight": 3},
                {"pluginRef": "inflight-load-scorer"},
                {"pluginRef": "max-score-picker"}]},
            {"name": "prefill", "plugins": [
                {"pluginRef": "queue-scorer"},
                {"pluginRef": "inflight-load-scorer"},
                {"pluginRef": "max-score-picker"}]}
        ]
    })
}

struct Rig {
    stack: Stack,
    sim: SimHandle,
    url: String,
}

impl Rig {
    fn addr(&self, replica: usize) -> String {
        self.sim.addrs()[replica].to_string()
    }
}

/// Replica 0 prefills, replicas 1 and 2 decode. `None` when the flavour is not built.
async fn rig(flavor: Flavor) -> Option<Rig> {
    let sim = sim::start(SimConfig {
        replicas: 3,
        models: vec![MODEL.into()],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let addrs: Vec<String> = sim.addrs().iter().map(ToString::to_string).collect();
    let mut plan = Plan::new(vec![PoolSpec {
        picker_config: epp_config(),
        ..PoolSpec::all(MODEL)
    }]);
    plan.tweak = Some(Box::new(move |plugins| {
        picker_pool(plugins, MODEL)["endpointRoles"] = json!({
            addrs[0].clone(): "prefill",
            addrs[1].clone(): "decode",
            // llm-d's label form.
            addrs[2].clone(): {"llm-d.ai/role": "decode"},
        });
    }));
    let stack = gw::start_over(flavor, sim.addrs().to_vec(), plan).await?;
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    Some(Rig { stack, sim, url })
}

/// A conversation's request: `messages`, 8 tokens out.
fn chat(messages: &[Value]) -> Value {
    json!({"model": MODEL, "max_tokens": 8, "messages": messages})
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// About 4,000 prompt tokens no replica has seen (`tag` makes it unique).
fn long_prompt(tag: &str) -> String {
    format!("{tag}: ") + &"the quick brown fox jumps over the lazy dog. ".repeat(360)
}

fn header<'r>(r: &'r HttpResponse, name: &str) -> &'r str {
    r.header(name).unwrap_or("")
}

async fn send(rig: &Rig, body: &Value, headers: &[(&str, &str)]) -> HttpResponse {
    let r = post_json(&rig.url, body, headers).await.unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r
}

async fn a_long_uncached_prompt_is_prefilled_elsewhere_and_its_cached_second_turn_is_not(
    flavor: Flavor,
) {
    let Some(rig) = rig(flavor).await else { return };
    let (prefiller, decoders) = (rig.addr(0), [rig.addr(1), rig.addr(2)]);

    let first = vec![user(&long_prompt("turn one"))];
    let r = send(&rig, &chat(&first), &[]).await;
    assert_eq!(
        header(&r, PREFILLED_BY_HEADER),
        prefiller,
        "{:?}",
        r.headers
    );
    let decoder = header(&r, DECODED_BY_HEADER).to_owned();
    assert!(decoders.contains(&decoder), "decoded by {decoder}");
    assert!(!header(&r, KV_TRANSFER_MS_HEADER).is_empty());
    assert_eq!(header(&r, PREFILL_FAILED_HEADER), "");
    // The prefill replica really computed the prompt: one request, one token.
    let p = rig.sim.stats(0).await.unwrap();
    assert_eq!((p.counters.finished, p.counters.generation_tokens), (1, 1));
    let answer = r.json().unwrap()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();

    // Turn two: its prompt is turn one's plus a few tokens, cached on the decoder.
    let mut second = first.clone();
    second.push(json!({"role": "assistant", "content": answer}));
    second.push(user("and then?"));
    let r = send(&rig, &chat(&second), &[]).await;
    assert_eq!(header(&r, DECODED_BY_HEADER), decoder, "{:?}", r.headers);
    assert_eq!(
        header(&r, PREFILLED_BY_HEADER),
        decoder,
        "no remote prefill"
    );
    assert_eq!(header(&r, KV_TRANSFER_MS_HEADER), "");
    let p = rig.sim.stats(0).await.unwrap();
    assert_eq!(
        p.counters.finished, 1,
        "the prefill replica saw nothing more"
    );
    // Turn one was a disaggregated pick, turn two not (in Wasm the state owner counts).
    let stats = rig.stack.envoy().stats().await.unwrap();
    assert_eq!(
        stats.sum_containing("infergate.picker.disaggregated_picks"),
        1,
        "{flavor:?}"
    );
    assert_eq!(stats.sum_containing("infergate.picker.decisions"), 2);
    drop(rig.stack);
}

async fn a_client_sent_prefiller_has_no_effect(flavor: Flavor) {
    let Some(rig) = rig(flavor).await else { return };
    let prefiller = rig.addr(0);

    // A short prompt naming the prefill replica: stripped, so decoded alone, never on the
    // prefill-only replica.
    let short = chat(&[user("a short question")]);
    let r = send(&rig, &short, &[(PREFILLER_HEADER, &prefiller)]).await;
    let decoder = header(&r, DECODED_BY_HEADER).to_owned();
    assert_ne!(decoder, prefiller);
    assert_eq!(header(&r, PREFILLED_BY_HEADER), decoder, "{:?}", r.headers);

    // A long prompt naming a decode replica (or an address outside the pool): the
    // gateway's own prefiller is used.
    for (i, claimed) in [rig.addr(1), "127.0.0.1:1".to_owned()].iter().enumerate() {
        let long = chat(&[user(&long_prompt(&format!("client {i}")))]);
        let r = send(&rig, &long, &[(PREFILLER_HEADER, claimed)]).await;
        assert_eq!(
            header(&r, PREFILLED_BY_HEADER),
            prefiller,
            "{:?}",
            r.headers
        );
        assert_eq!(header(&r, PREFILL_FAILED_HEADER), "");
    }
    drop(rig.stack);
}
