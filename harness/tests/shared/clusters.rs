//! What the multi-cluster tests of the e2e and control-plane suites share: a pool that
//! queues easily, the long requests that saturate it, and a conversation's turns (each
//! suite includes this file as a module).

use infergate_harness::launch::client::post_json_streamed;
use infergate_harness::sim::{self, EngineConfig, SimConfig, SimHandle};
use serde_json::{json, Value};

/// Two replicas of `model` running one sequence each, so a few long requests make a queue.
pub async fn queueing_pool(model: &str) -> SimHandle {
    sim::start(SimConfig {
        replicas: 2,
        models: vec![model.into()],
        engine: EngineConfig {
            max_num_seqs: 1,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap()
}

/// Long requests for `model` straight to each of `pool`'s replicas: one runs, `waiting`
/// queue behind it.
pub fn hog(pool: &SimHandle, model: &str, waiting: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let mut hogs = Vec::new();
    for &addr in pool.addrs() {
        for i in 0..=waiting {
            let body = json!({"model": model, "stream": true, "max_tokens": 400,
                "ignore_eos": true,
                "messages": [{"role": "user", "content": format!("hog {i}")}]});
            hogs.push(tokio::spawn(async move {
                let url = format!("http://{addr}/v1/chat/completions");
                let _ = post_json_streamed(&url, &body, &[]).await;
            }));
        }
    }
    hogs
}

/// Turn `turn` of conversation `label` for `model`: its whole history so far (each earlier
/// turn's question and the answer it got), then the new question.
pub fn turn_body(model: &str, label: &str, turn: usize) -> Value {
    let mut messages = vec![json!({"role": "system",
        "content": format!("{label}: you are helping with a long task. ").repeat(12)})];
    for t in 0..=turn {
        messages.push(json!({"role": "user",
            "content": format!("{label} question {t}: tell me more about step {t}. ").repeat(4)}));
        if t < turn {
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
    }
    json!({"model": model, "max_tokens": 1, "messages": messages})
}
