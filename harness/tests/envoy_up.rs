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

/// `up --epp-config testdata/epp/epp-config-configmap.yaml --objectives
/// testdata/tenants/objectives.yaml --tenants testdata/tenants`: the seed's ConfigMap and
/// objectives load in both gateway flavours and the stack serves a tenant, whose billing
/// record carries its objective's priority and no queue time (the pool is far from its
/// `maxConcurrency` of 128). A flavour whose module is not built is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_runs_the_seed_epp_config_map_and_objectives() {
    use infergate_harness::launch::read_billing_log;
    let testdata = infergate_artefacts::workspace_root().join("testdata");
    for flavor in [Flavor::Wasm, Flavor::Native] {
        let module = flavor.artefact().unwrap();
        if !module.is_file() {
            eprintln!("SKIPPED: {flavor}: {} is not built", module.display());
            continue;
        }
        let log = std::env::temp_dir().join(format!(
            "infergate-up-seed-{}-{flavor}.log",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&log);
        let opts = UpOptions {
            flavor,
            replicas: 2,
            concurrency: 2,
            epp_config: Some(testdata.join("epp/epp-config-configmap.yaml")),
            objectives: Some(testdata.join("tenants/objectives.yaml")),
            tenants: Some(testdata.join("tenants")),
            billing_log: Some(log.clone()),
            ..UpOptions::default()
        };
        let stack = Stack::start(stack_options(&opts).unwrap()).await.unwrap();
        let body = json!({"model": "sim-model", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]});
        let resp = post_json(
            &format!("{}/v1/chat/completions", stack.picker_url()),
            &body,
            &[("authorization", "Bearer sk-infergate-test-tenant-a")],
        )
        .await
        .unwrap();
        assert_eq!(resp.status, 200, "{flavor}: {}", resp.text());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let record = loop {
            if let Some(r) = read_billing_log(&log).unwrap().pop() {
                break r;
            }
            assert!(std::time::Instant::now() < deadline, "{flavor}: no record");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        assert_eq!(record["objective"], "premium-traffic", "{flavor}: {record}");
        assert_eq!(record["priority"], 100, "{flavor}: {record}");
        assert!(record["queued_ms"].is_null(), "{flavor}: {record}");
        drop(stack);
        let _ = std::fs::remove_file(&log);
    }
}

/// `up --gateways 2`: two Envoys over one simulator, each announced on a line of its own
/// and serving there; dropping the fleet stops both Envoys, then the simulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_with_two_gateways_serves_on_each_and_stops_everything_on_drop() {
    use infergate_harness::launch::up::fleet_announcement;
    use infergate_harness::launch::Fleet;
    let opts = UpOptions::parse(&[
        "--flavor".into(),
        "plain".into(),
        "--replicas".into(),
        "2".into(),
        "--concurrency".into(),
        "1".into(),
        "--gateways".into(),
        "2".into(),
    ])
    .unwrap();
    let fleet = Fleet::start(stack_options(&opts).unwrap(), opts.gateways)
        .await
        .unwrap();
    let lines = fleet_announcement(&fleet);
    assert_eq!(lines.len(), 3, "{lines:?}");
    let mut urls = Vec::new();
    for (k, line) in lines.iter().take(2).enumerate() {
        let url = line
            .strip_prefix(&format!("gateway {k}: "))
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(url, fleet.picker_urls()[k]);
        urls.push(url.to_string());
    }
    assert_ne!(
        urls[0], urls[1],
        "each gateway listens on a port of its own"
    );
    assert_eq!(lines[2], format!("baseline: {}/rr", urls[0]));
    assert_eq!(fleet.replicas().len(), 2);
    let body = json!({"model": "sim-model", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]});
    for url in &urls {
        let resp = post_json(&format!("{url}/rr/v1/chat/completions"), &body, &[])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{url}: {}", resp.text());
    }
    let pids: Vec<u32> = fleet
        .gateways()
        .iter()
        .map(|g| g.envoy().pid().unwrap())
        .collect();
    assert_ne!(pids[0], pids[1]);
    let replica = fleet.replicas()[0];
    drop(fleet);
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "Envoy {pid} still running"
        );
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        tokio::net::TcpStream::connect(replica).await.is_err(),
        "simulator replica still listening"
    );
}
