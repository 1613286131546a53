//! Native build: a panic inside the dynamic module (injected by the test-only
//! `x-infergate-test-panic` header of the `panic-injection` feature) fails that one request
//! with 500, and Envoy keeps serving the requests around it.

use super::{chat, served_by, tag};
use crate::support::gw::{self, Plan};
use crate::support::{TestBackend, QUICK};
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::{Flavor, PoolSpec};

const MODEL: &str = "model-a";
const HEADER: &str = "x-infergate-test-panic";

fn served(backends: &[TestBackend]) -> u64 {
    backends.iter().map(TestBackend::served).sum()
}

/// Whether the module at the flavour's artefact path was built with `panic-injection`:
/// only then does it hold the injected panic's message.
fn has_panic_injection(flavor: Flavor) -> bool {
    let Some(path) = flavor.artefact() else {
        return false;
    };
    let needle = b"injected test panic";
    std::fs::read(&path)
        .map(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
        .unwrap_or(false)
}

pub(super) async fn a_panic_fails_one_request_and_envoy_keeps_serving(flavor: Flavor) {
    if flavor.artefact().is_some_and(|p| p.is_file()) && !has_panic_injection(flavor) {
        eprintln!(
            "SKIPPED: the {flavor} module was built without `--features panic-injection` \
             (cargo build -p infergate-envoy --release --features panic-injection)"
        );
        return;
    }
    let backends = TestBackend::many(2, QUICK).await;
    let Some(stack) = gw::start(flavor, &backends, Plan::new(vec![PoolSpec::all(MODEL)])).await
    else {
        return;
    };
    let pid = stack.envoy().pid();
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let body = |phase: &str| chat(MODEL, &format!("panic in {phase}"));
    served_by(&stack, &chat(MODEL, "before"), &[]).await;
    // Request path: the module answers 500 itself and the request never reaches a replica.
    for phase in ["1", "request-headers", "request-body"] {
        let served_before = served(&backends);
        let resp = post_json(&url, &body(phase), &[(HEADER, phase)])
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{}: panic in {phase}: {e:#}\n--- envoy log:\n{}",
                    tag(flavor),
                    stack.envoy().log_tail(30)
                )
            });
        // `openai_error` checks the status and the OpenAI error shape of the body.
        let error = gw::openai_error(&resp, 500);
        assert_eq!(error["code"], "internal_error", "{}: {error}", tag(flavor));
        assert_eq!(
            served(&backends),
            served_before,
            "{phase}: a request that failed in the request path reached a replica"
        );
        for i in 0..3 {
            served_by(&stack, &chat(MODEL, &format!("after {phase} {i}")), &[]).await;
        }
    }
    // Response path: the replica has answered; the module fails the response (a 500 if
    // Envoy can still replace it, else the stream is reset), never Envoy.
    let served_before = served(&backends);
    let phase = "response-headers";
    match post_json(&url, &body(phase), &[(HEADER, phase)]).await {
        Ok(resp) => assert_eq!(resp.status, 500, "{phase}: {}", resp.text()),
        Err(e) => eprintln!(
            "{}: panic in {phase}: the stream was reset ({e:#})",
            tag(flavor)
        ),
    }
    assert_eq!(served(&backends), served_before + 1);
    for i in 0..3 {
        served_by(&stack, &chat(MODEL, &format!("after {phase} {i}")), &[]).await;
    }
    assert_eq!(stack.envoy().pid(), pid);
    let stats = stack.envoy().stats().await.unwrap();
    assert_eq!(stats.value("server.live"), 1);
}
