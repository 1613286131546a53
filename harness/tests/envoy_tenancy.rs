//! The tenancy pieces of the gateway templates in the real Envoy 1.40.0: the `jwt_authn`
//! filter and the billing log.
//!
//! - The wasm and native templates rendered with a JWT provider and a billing log (and the
//!   `/rr` baseline) pass `envoy --mode validate` (skipped with a printed reason when the
//!   flavour's module is not built).
//! - The templates' own prototypes (`jwt_filter`, both flavours' `billing_log`, the
//!   baseline route's per-filter switches) run in a real Envoy without the gateway modules:
//!   Envoy's `set_metadata` and `set_filter_state` filters stand in for the gateway and set
//!   the record where each flavour's module sets it. That checks what reaches the billing
//!   log (one line per request with a record, the record's own text, nothing for other
//!   requests, on disk within a second), which bearer tokens `jwt_authn` demands be valid,
//!   and where it leaves the verified claims.
//! - A whole gateway stack of each flavour with a JWT provider and a billing log (no
//!   tenants: the gateway behaves as without tenancy) starts, and `jwt_authn` stops a bad
//!   JWT in front of it while other requests reach the engine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infergate_cli::config::bootstrap::{render, BootstrapParams};
use infergate_cli::config::template::{Template, Vars};
use infergate_harness::launch::binary::envoy_binary;
use infergate_harness::launch::client::post_json;
use infergate_harness::launch::jwt::TestIssuer;
use infergate_harness::launch::process::RunDir;
use infergate_harness::launch::stack::with_file_flush;
use infergate_harness::launch::{
    read_billing_log, Backends, Envoy, EnvoyOptions, Flavor, Pool, Stack, StackOptions, Tenancy,
};
use infergate_harness::sim::SimConfig;
use serde_json::json;
use serde_yaml_ng::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn tenancy(dir: &Path) -> Tenancy {
    Tenancy {
        objects: Vec::new(),
        jwt: Some(TestIssuer::new().provider()),
        billing_log: Some(dir.join("billing.log")),
    }
}

#[test]
fn gateway_templates_with_jwt_and_billing_log_validate() {
    for flavor in [Flavor::Wasm, Flavor::Native] {
        let module = flavor.artefact().unwrap();
        if !module.is_file() {
            eprintln!(
                "SKIPPED: validating {flavor} needs {} (cargo xtask build)",
                module.display()
            );
            continue;
        }
        let dir = RunDir::new("validate-tenancy").unwrap();
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let mut params = BootstrapParams::new(flavor, vec![Pool::new("m", vec![a(9001)])]);
        params.baseline = true;
        params.tenancy = tenancy(dir.path());
        let file = dir.path().join("bootstrap.yaml");
        let yaml = render(&params).unwrap();
        std::fs::write(&file, &yaml).unwrap();
        let out = Command::new(envoy_binary().unwrap())
            .args([
                "--mode",
                "validate",
                "--disable-hot-restart",
                "-l",
                "warning",
                "-c",
            ])
            .arg(&file)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "{flavor}: rejected:\n{text}\n--- rendered:\n{yaml}"
        );
    }
}

/// Parses YAML written in this file.
fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

/// A gateway-shaped bootstrap around the templates' tenancy prototypes, with Envoy's own
/// filters setting the billing record in place of the gateway:
/// - `/billed...`: `set_metadata` puts `record` into `infergate.usage` (the native
///   module's place) and `set_filter_state` puts `wasm.infergate.usage` (where Envoy keeps
///   the Wasm module's `infergate.usage` property), with the request path in it;
/// - `/unbilled`: both switched off, so no record;
/// - `/rr/`: the baseline route's per-filter switches, taken from the template.
///
/// Every route answers 200 itself (no upstream). A third log, `claims.log`, holds each
/// request's path and the `jwt_authn` payload it left in metadata.
fn fixture(dir: &Path, native: &Template, wasm: &Template) -> String {
    let native_log = dir.join("native-billing.log");
    let wasm_log = dir.join("wasm-billing.log");
    let mut jwt = tenancy(dir);
    jwt.billing_log = Some(native_log);
    let native_splices = jwt.splices(native).unwrap();
    jwt.billing_log = Some(wasm_log);
    let wasm_splices = jwt.splices(wasm).unwrap();
    assert_eq!(
        native_splices.jwt_filters, wasm_splices.jwt_filters,
        "both flavours verify JWTs the same way"
    );
    let mut vars = Vars::new();
    vars.insert("rr_lb_endpoints".into(), Value::Sequence(Vec::new()));
    let baseline = native.prototype("baseline_route", &vars).unwrap();
    let off = yaml(
        r#"{"@type": type.googleapis.com/envoy.config.route.v3.FilterConfig, disabled: true}"#,
    );
    let mut unbilled = serde_yaml_ng::Mapping::new();
    unbilled.insert("fixture.set_metadata".into(), off.clone());
    unbilled.insert("fixture.set_filter_state".into(), off);
    let route = |prefix: &str, per_filter: Value| {
        let mut r = yaml(&format!(
            "{{match: {{prefix: '{prefix}'}}, direct_response: {{status: 200, body: {{inline_string: ok}}}}}}"
        ));
        r["typed_per_filter_config"] = per_filter;
        r
    };
    let routes = vec![
        route("/rr/", baseline["typed_per_filter_config"].clone()),
        route("/unbilled", Value::Mapping(unbilled)),
        route("/", Value::Mapping(serde_yaml_ng::Mapping::new())),
    ];
    let claims_log = yaml(&format!(
        r#"
name: envoy.access_loggers.file
typed_config:
  "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
  path: {}
  log_format: {{text_format_source: {{inline_string: "%REQ(:PATH)% %RESPONSE_CODE% %DYNAMIC_METADATA(envoy.filters.http.jwt_authn:jwt_payload)%\n"}}}}
"#,
        dir.join("claims.log").display()
    ));
    let stand_ins = yaml(
        r#"
- name: fixture.set_metadata
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
    metadata:
    - metadata_namespace: infergate.usage
      value: {record: '{"tenant":"tenant-a","charged":7}'}
- name: fixture.set_filter_state
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.set_filter_state.v3.Config
    on_request_headers:
    - object_key: wasm.infergate.usage
      factory_key: envoy.string
      format_string: {text_format_source: {inline_string: '{"tenant":"tenant-w","path":"%REQ(:PATH)%"}'}}
- name: envoy.filters.http.router
  typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
"#,
    );
    let mut filters = native_splices.jwt_filters.clone();
    filters.extend(stand_ins.as_sequence().unwrap().iter().cloned());
    let mut logs = native_splices.billing_logs.clone();
    logs.extend(wasm_splices.billing_logs.clone());
    logs.push(claims_log);
    let mut hcm = yaml(
        r#"
"@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
stat_prefix: gateway
route_config: {name: gateway, virtual_hosts: [{name: gateway, domains: ["*"]}]}
"#,
    );
    hcm["route_config"]["virtual_hosts"][0]["routes"] = Value::Sequence(routes);
    hcm["http_filters"] = Value::Sequence(filters);
    hcm["access_log"] = Value::Sequence(logs);
    let mut bootstrap = yaml(
        r#"
admin: {address: {socket_address: {address: 127.0.0.1, port_value: 0}}}
static_resources:
  listeners:
  - name: gateway
    address: {socket_address: {address: 127.0.0.1, port_value: 0}}
    filter_chains: [{filters: [{name: envoy.filters.network.http_connection_manager}]}]
"#,
    );
    bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"] = hcm;
    serde_yaml_ng::to_string(&bootstrap).unwrap()
}

fn template(flavor: Flavor) -> Template {
    Template::parse(flavor.template()).unwrap()
}

/// The lines of `file` once it has `want` of them (waiting up to `within`), then after a
/// further flush interval, so a line too many shows too.
async fn lines_once(file: &Path, want: usize, within: Duration) -> Vec<String> {
    let read = || -> Vec<String> {
        std::fs::read_to_string(file)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let deadline = Instant::now() + within;
    while read().len() < want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    read()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn billing_log_lines_and_jwt_authn_in_a_real_envoy() {
    let dir = RunDir::new("tenancy-envoy").unwrap();
    let bootstrap = fixture(
        dir.path(),
        &template(Flavor::Native),
        &template(Flavor::Wasm),
    );
    let mut opts = EnvoyOptions {
        concurrency: 1,
        ..EnvoyOptions::default()
    };
    with_file_flush(&mut opts.extra_args);
    let envoy = Envoy::start(&bootstrap, &opts).await.unwrap();
    let url = |path: &str| format!("{}{path}", envoy.base_url());

    let issuer = TestIssuer::new();
    let claims = issuer.claims(json!({"org": "product-team", "sub": "u1"}));
    let good = format!("Bearer {}", issuer.mint(&claims));
    let bad = format!("Bearer {}", issuer.mint_bad_signature(&claims));
    let other_issuer = format!(
        "Bearer {}",
        issuer.mint(&json!({"iss": "https://elsewhere.test", "org": "x"}))
    );
    // (path, authorization, expected status)
    let cases: [(&str, Option<&str>, u16); 8] = [
        ("/billed/none", None, 200),
        ("/billed/key", Some("Bearer sk-tenant-a-0123456789"), 200),
        ("/billed/jwt", Some(good.as_str()), 200),
        ("/billed/bad", Some(bad.as_str()), 401),
        ("/billed/issuer", Some(other_issuer.as_str()), 401),
        ("/unbilled", Some(good.as_str()), 200),
        ("/unbilled", None, 200),
        ("/rr/v1/models", Some(bad.as_str()), 200),
    ];
    let started = Instant::now();
    for (path, auth, status) in cases {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        let resp = post_json(&url(path), &json!({}), &headers).await.unwrap();
        assert_eq!(resp.status, status, "{path} {auth:?}: {}", resp.text());
    }
    // Billed: the three `/billed` requests jwt_authn let through, and `/rr/` (the stand-ins
    // are not switched off there; the gateway modules are, so it has no record for real).
    let billed = [
        "/billed/none",
        "/billed/key",
        "/billed/jwt",
        "/rr/v1/models",
    ];
    let within = Duration::from_millis(1500);
    let native = lines_once(&dir.path().join("native-billing.log"), 4, within).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "log lines took {:?}",
        started.elapsed()
    );
    assert_eq!(
        native,
        vec![r#"{"tenant":"tenant-a","charged":7}"#; 4],
        "{native:?}"
    );
    let wasm = lines_once(&dir.path().join("wasm-billing.log"), 4, within).await;
    let expected: Vec<String> = billed
        .iter()
        .map(|p| format!(r#"{{"tenant":"tenant-w","path":"{p}"}}"#))
        .collect();
    assert_eq!(wasm, expected);

    // jwt_authn leaves the verified claims in `envoy.filters.http.jwt_authn` / `jwt_payload`,
    // and nothing for requests whose bearer token is not a JWT.
    let claims_lines = lines_once(&dir.path().join("claims.log"), cases.len(), within).await;
    assert_eq!(claims_lines.len(), cases.len(), "{claims_lines:?}");
    let payload_of = |line: &str| -> serde_json::Value {
        let json = line.splitn(3, ' ').nth(2).unwrap();
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null)
    };
    assert_eq!(payload_of(&claims_lines[2]), claims, "{}", claims_lines[2]);
    assert_eq!(payload_of(&claims_lines[5]), claims, "{}", claims_lines[5]);
    for i in [0, 1, 3, 4, 6, 7] {
        assert!(
            payload_of(&claims_lines[i]).is_null(),
            "{}",
            claims_lines[i]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stack_runs_behind_jwt_authn_with_a_billing_log() {
    for flavor in [Flavor::Native, Flavor::Wasm] {
        let module = flavor.artefact().unwrap();
        if !module.is_file() {
            eprintln!(
                "SKIPPED: {flavor} needs {} (cargo xtask build)",
                module.display()
            );
            continue;
        }
        let dir = RunDir::new("tenancy-stack").unwrap();
        let sim = SimConfig {
            replicas: 1,
            ..SimConfig::default()
        };
        let mut opts = StackOptions::new(flavor, Backends::InProcess(Box::new(sim)));
        opts.envoy.concurrency = 1;
        opts.tenancy = tenancy(dir.path());
        let stack = Stack::start(opts).await.unwrap();
        let log = stack.billing_log().unwrap().to_path_buf();
        assert_eq!(log, dir.path().join("billing.log"));
        let flags =
            std::fs::read_to_string(format!("/proc/{}/cmdline", stack.envoy().pid().unwrap()))
                .unwrap()
                .replace('\0', " ");
        assert!(flags.contains("--file-flush-interval-msec 100"), "{flags}");

        let issuer = TestIssuer::new();
        let claims = issuer.claims(json!({"org": "product-team"}));
        let body = json!({"model": "sim-model", "max_tokens": 2,
                          "messages": [{"role": "user", "content": "hi"}]});
        let url = format!("{}/v1/chat/completions", stack.picker_url());
        let bad = format!("Bearer {}", issuer.mint_bad_signature(&claims));
        let good = format!("Bearer {}", issuer.mint(&claims));
        for (auth, status) in [
            (None, 200),
            (Some("Bearer sk-some-key"), 200),
            (Some(good.as_str()), 200),
            (Some(bad.as_str()), 401),
        ] {
            let headers: Vec<(&str, &str)> =
                auth.map(|a| ("authorization", a)).into_iter().collect();
            let resp = post_json(&url, &body, &headers).await.unwrap();
            assert_eq!(resp.status, status, "{flavor} {auth:?}: {}", resp.text());
        }
        // The baseline keeps jwt_authn off.
        let rr = format!("{}/v1/chat/completions", stack.baseline_url());
        let resp = post_json(&rr, &body, &[("authorization", &bad)])
            .await
            .unwrap();
        assert_eq!(resp.status, 200, "{flavor} /rr: {}", resp.text());
        // No tenants, so no billing record: the log stays empty.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(read_billing_log(&log).unwrap().is_empty(), "{flavor}");
    }
}
