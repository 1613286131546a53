//! `cargo xtask up` without the signals: the stack it starts serves on the announced URLs,
//! and dropping it stops Envoy and the simulator (the SIGINT/SIGTERM wait around it is
//! `tokio::select!` on two signal streams).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infergate_harness::launch::client::post_json;
use infergate_harness::launch::up::{announcement, stack_options};
use infergate_harness::launch::{Flavor, Stack, UpOptions};
use serde_json::json;
use std::path::Path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_serves_on_the_announced_urls_and_stops_everything_on_drop() {
    let opts = UpOptions {
        flavor: Flavor::Plain,
        replicas: 3,
        concurrency: 1,
        sim_config: None,
        ..UpOptions::default()
    };
    let stack = Stack::start(stack_options(&opts).unwrap()).await.unwrap();
    let [picker, baseline] = announcement(&stack);
    let picker = picker.strip_prefix("picker: http://127.0.0.1:").unwrap();
    assert!(picker.parse::<u16>().is_ok(), "{picker}");
    let baseline = baseline.strip_prefix("baseline: ").unwrap().to_string();
    assert!(baseline.ends_with("/rr"), "{baseline}");
    assert_eq!(stack.replicas().len(), 3);
    let body = json!({"model": "sim-model", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]});
    let resp = post_json(&format!("{baseline}/v1/chat/completions"), &body, &[])
        .await
        .unwrap();
    assert_eq!(resp.status, 200, "{}", resp.text());

    let pid = stack.envoy().pid().unwrap();
    let replica = stack.replicas()[0];
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    drop(stack);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "Envoy still running"
    );
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        tokio::net::TcpStream::connect(replica).await.is_err(),
        "simulator replica still listening"
    );
}
