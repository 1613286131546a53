//! The scraper's way out: an http call from inside Envoy (proxy-wasm `dispatch_http_call`,
//! or a dynamic module's callout) to the `infergate_scrape` cluster reaches the endpoint
//! named by the call's `x-gateway-destination-endpoint` header.
//!
//! Proved without the gateway module: the cluster is taken verbatim from the `wasm` and
//! `native` templates and called by a Lua filter's `httpCall`, which goes through the same
//! Envoy async HTTP client as Wasm and dynamic-module callouts.

use crate::support::{workers, TestBackend, QUICK};
use infergate_cli::config::bootstrap::{render, BootstrapParams, SCRAPE_CLUSTER};
use infergate_harness::launch::client::request;
use infergate_harness::launch::{Envoy, EnvoyOptions, Flavor, Pool};
use serde_yaml_ng::Value;

/// Calls the scrape cluster (`CLUSTER` is replaced by its name) at the `x-target` address.
const LUA: &str = r#"
function envoy_on_request(handle)
  local target = handle:headers():get("x-target")
  local headers, body = handle:httpCall("CLUSTER", {
    [":method"] = "GET", [":path"] = "/metrics", [":authority"] = "scrape",
    ["x-gateway-destination-endpoint"] = target }, "", 2000)
  handle:respond({[":status"] = "200", ["x-upstream-status"] = headers[":status"]}, body)
end
"#;

/// The `infergate_scrape` cluster exactly as the `flavor` template declares it.
fn scrape_cluster_of(flavor: Flavor) -> Value {
    let text = flavor.template();
    let raw: Value = serde_yaml_ng::from_str(text).unwrap();
    raw["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == SCRAPE_CLUSTER)
        .cloned()
        .unwrap_or_else(|| panic!("{flavor} template has no {SCRAPE_CLUSTER} cluster"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_cluster_of_both_templates_reaches_the_endpoint_named_in_the_call() {
    let backends = TestBackend::many(3, QUICK).await;
    for flavor in [Flavor::Wasm, Flavor::Native] {
        let pools = vec![Pool::new("m", backends.iter().map(|b| b.addr).collect())];
        let plain = render(&BootstrapParams::new(Flavor::Plain, pools)).unwrap();
        let mut boot: Value = serde_yaml_ng::from_str(&plain).unwrap();
        let hcm = &mut boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
            ["typed_config"];
        let lua: Value = serde_yaml_ng::from_str(&format!(
            "name: envoy.filters.http.lua\ntyped_config:\n  '@type': type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua\n  default_source_code: {{inline_string: {}}}\n",
            serde_json::to_string(&LUA.replace("CLUSTER", SCRAPE_CLUSTER)).unwrap()
        ))
        .unwrap();
        hcm["http_filters"]
            .as_sequence_mut()
            .unwrap()
            .insert(0, lua);
        boot["static_resources"]["clusters"]
            .as_sequence_mut()
            .unwrap()
            .push(scrape_cluster_of(flavor));
        let opts = EnvoyOptions {
            concurrency: workers(),
            ..EnvoyOptions::default()
        };
        let envoy = Envoy::start(&serde_yaml_ng::to_string(&boot).unwrap(), &opts)
            .await
            .unwrap();
        for (i, b) in backends.iter().enumerate().rev() {
            let target = b.addr.to_string();
            let resp = request(
                hyper::Method::GET,
                &format!("{}/anything", envoy.base_url()),
                &[("x-target", &target)],
                bytes::Bytes::new(),
            )
            .await
            .unwrap();
            assert_eq!(
                resp.header("x-upstream-status"),
                Some("200"),
                "{flavor}: {}",
                resp.text()
            );
            assert!(
                resp.text().starts_with(&format!("# backend b{i}\n")),
                "{flavor}: call for {target} answered by: {}",
                resp.text()
            );
        }
        let stats = envoy.stats().await.unwrap();
        assert_eq!(stats.cluster_requests(SCRAPE_CLUSTER), 3, "{flavor}");
    }
}
