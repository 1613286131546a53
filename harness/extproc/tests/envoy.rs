//! Through a real Envoy 1.40: the `ext_proc` filter calls `infergate-extproc` in each mode
//! and body mode, and the request reaches the backend the processor named, with its body
//! whole, whatever routing header the client sent (the processor's overwrites it).
//! Without the processor's header there is no route at all (the `plain` bootstrap routes
//! only on `x-gateway-destination-endpoint`), so a processor that did not route fails.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use infergate_harness::bench::overhead::backend::BenchBackend;
use infergate_harness::bench::overhead::bodies;
use infergate_harness::launch::client;
use infergate_harness::launch::extproc::{BodyMode, ExtProcOptions, ExtProcStack, ProcessorMode};
use infergate_harness::launch::EnvoyOptions;

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_infergate-extproc"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::unwrap_used)]
async fn requests_reach_the_backend_the_processor_names() {
    // `decoy` is where the client's own header points; only `target` is the processor's.
    let decoy = BenchBackend::start(1).await.unwrap();
    let target = BenchBackend::start(1).await.unwrap();
    // About 128 KB: more than one chunk each way in full duplex.
    let body: serde_json::Value = serde_json::from_slice(&bodies(1, 32_000)[0]).unwrap();
    let len = body.to_string().len() as u64;
    for mode in [ProcessorMode::Null, ProcessorMode::Parse] {
        for body_mode in [BodyMode::FullDuplex, BodyMode::Buffered] {
            let what = format!("{} / {}", mode.name(), body_mode.wire());
            let stack = ExtProcStack::start(&ExtProcOptions {
                binary: binary(),
                mode,
                body: body_mode,
                endpoints: target.addrs().to_vec(),
                threads: 1,
                envoy: EnvoyOptions {
                    concurrency: 1,
                    ..EnvoyOptions::default()
                },
            })
            .await
            .unwrap();
            let url = format!("{}/v1/chat/completions", stack.envoy().base_url());
            let posts = |b: &BenchBackend| b.counters().posts.load(Ordering::Relaxed);
            let bytes = |b: &BenchBackend| b.counters().body_bytes.load(Ordering::Relaxed);
            let (p0, b0, d0) = (posts(&target), bytes(&target), posts(&decoy));
            let decoy_addr = decoy.addrs()[0].to_string();
            for headers in [
                vec![],
                vec![("x-gateway-destination-endpoint", decoy_addr.as_str())],
            ] {
                let r = client::post_json(&url, &body, &headers).await.unwrap();
                assert_eq!(r.status, 200, "{what}: {}", r.text());
                assert_eq!(r.json().unwrap()["object"], "chat.completion", "{what}");
            }
            assert_eq!(posts(&target) - p0, 2, "{what}: both reached the target");
            assert_eq!(
                bytes(&target) - b0,
                2 * len,
                "{what}: with their bodies whole"
            );
            assert_eq!(
                posts(&decoy),
                d0,
                "{what}: none reached the client's choice"
            );
            assert!(stack.processor().pid().is_some());
        }
    }
}
