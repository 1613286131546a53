//! Clients holding multi-turn conversations against a gateway for a while: the load the
//! failover scenarios keep up while they kill or reload the owner.

use infergate_harness::launch::client::post_json;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Each request's status (0: no answer), how long it took, and (not 200) the start of the
/// answer's body.
pub type Outcomes = Arc<Mutex<Vec<(u16, Duration, String)>>>;

/// Starts `clients` conversations with `model` at `url` (a chat-completions URL), each
/// turn sent when the previous one is answered, until `for_how_long` has passed. Await the
/// handles, then read the outcomes.
pub fn converse(
    url: &str,
    model: &str,
    clients: usize,
    for_how_long: Duration,
) -> (Vec<tokio::task::JoinHandle<()>>, Outcomes) {
    let outcomes: Outcomes = Arc::default();
    let stop_at = Instant::now() + for_how_long;
    let handles = (0..clients)
        .map(|c| {
            let (url, model, outcomes) = (url.to_owned(), model.to_owned(), outcomes.clone());
            tokio::spawn(async move {
                let mut messages =
                    vec![json!({"role": "system", "content": format!("client {c} ").repeat(200)})];
                let mut turn = 0;
                while Instant::now() < stop_at {
                    messages.push(json!({"role": "user", "content": format!("turn {turn}")}));
                    let body = json!({"model": model, "max_tokens": 8, "messages": messages});
                    let started = Instant::now();
                    let (status, text) = match post_json(&url, &body, &[]).await {
                        Ok(r) if r.status == 200 => (200, String::new()),
                        Ok(r) => (r.status, r.text().chars().take(160).collect()),
                        Err(e) => (0, e.to_string()),
                    };
                    if let Ok(mut o) = outcomes.lock() {
                        o.push((status, started.elapsed(), text));
                    }
                    messages.push(json!({"role": "assistant", "content": "ok"}));
                    turn += 1;
                }
            })
        })
        .collect();
    (handles, outcomes)
}
