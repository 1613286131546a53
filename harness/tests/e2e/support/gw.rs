//! Gateway-flavour helpers: start a stack with edited plugin configurations and wait until
//! the scraper has published, read the gateway's stats whatever their flavour prefix, send
//! a chunked (length-less) body, and read the traced-request access log.

use super::{workers, ChannelBody, TestBackend};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::Request;
use hyper_util::rt::TokioIo;
use infergate_cli::config::tenancy::{read_billing_log, Tenancy};
use infergate_harness::launch::client::HttpResponse;
use infergate_harness::launch::stats::Stats;
use infergate_harness::launch::{
    Backends, ClientTimeouts, EnvoyOptions, Flavor, GatewaySettings, PluginConfigs, PoolSpec,
    Stack, StackOptions,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The billing log once it holds at least `n` records, or whatever it holds after `within`.
pub async fn billing_records(stack: &Stack, n: usize, within: Duration) -> Vec<serde_json::Value> {
    let path = stack.billing_log().unwrap().to_path_buf();
    let deadline = Instant::now() + within;
    loop {
        let records = read_billing_log(&path).unwrap_or_default();
        if records.len() >= n || Instant::now() > deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Edits the generated plugin configurations before Envoy starts.
pub type Tweak = Box<dyn FnOnce(&mut PluginConfigs) + Send>;

/// How to bring a gateway stack up over test backends.
pub struct Plan {
    /// The pools, by backend index.
    pub pools: Vec<PoolSpec>,
    /// Envoy worker threads.
    pub concurrency: u32,
    /// Scrape period, staleness bound, body limit.
    pub settings: GatewaySettings,
    /// Applied to the configurations computed from `pools` and `settings`.
    pub tweak: Option<Tweak>,
    /// The connection manager's client-side timeouts.
    pub timeouts: ClientTimeouts,
    /// The `/rr` baseline route and cluster; off is the deployment form.
    pub baseline: bool,
    /// Tenants, JWT verification and the billing log (none by default).
    pub tenancy: Tenancy,
}

impl Plan {
    /// `pools` on the suite's Envoy worker count ([`workers`]), default settings,
    /// configurations as generated.
    pub fn new(pools: Vec<PoolSpec>) -> Plan {
        Plan {
            pools,
            concurrency: workers(),
            settings: GatewaySettings::default(),
            tweak: None,
            timeouts: ClientTimeouts::default(),
            baseline: true,
            tenancy: Tenancy::default(),
        }
    }
}

/// Starts `flavor` over `backends` as `plan` says and waits until the scraper has published
/// a snapshot (before that a `FailClose` pool answers 503). `None` (after printing why)
/// when the flavour's module is not built.
pub async fn start(flavor: Flavor, backends: &[TestBackend], plan: Plan) -> Option<Stack> {
    let addrs: Vec<SocketAddr> = backends.iter().map(|b| b.addr).collect();
    start_over(flavor, addrs, plan).await
}

/// [`start`] over replicas the test runs by other means (simulators), by address.
pub async fn start_over(flavor: Flavor, addrs: Vec<SocketAddr>, plan: Plan) -> Option<Stack> {
    if super::unbuilt(flavor) {
        return None;
    }
    let stack = try_start_over(flavor, addrs, plan).await.unwrap();
    wait_for_publish(&stack, 1).await;
    Some(stack)
}

/// Starts `flavor` over `addrs` as `plan` says, or the reason it did not start (a config
/// the gateway refuses); does not wait for a snapshot.
pub async fn try_start_over(
    flavor: Flavor,
    addrs: Vec<SocketAddr>,
    plan: Plan,
) -> anyhow::Result<Stack> {
    let pools = plan
        .pools
        .iter()
        .map(|p| p.resolve(&addrs))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut plugins = PluginConfigs::for_pools(&pools, &plan.settings);
    if let Some(tweak) = plan.tweak {
        tweak(&mut plugins);
    }
    let mut opts = StackOptions::new(flavor, Backends::External(addrs));
    opts.pools = plan.pools;
    opts.settings = plan.settings;
    opts.plugins = Some(plugins);
    opts.timeouts = plan.timeouts;
    opts.baseline = plan.baseline;
    opts.tenancy = plan.tenancy;
    opts.envoy = EnvoyOptions {
        concurrency: plan.concurrency,
        // Access-log files (the trace log on stderr) are flushed this often; Envoy's
        // default (10 s) would make `traced` slow.
        extra_args: vec!["--file-flush-interval-msec".into(), "100".into()],
        ..EnvoyOptions::default()
    };
    Stack::start(opts).await
}

/// The picker configuration's entry for `base_model` (to edit in a [`Tweak`]).
pub fn picker_pool<'a>(
    plugins: &'a mut PluginConfigs,
    base_model: &str,
) -> &'a mut serde_json::Value {
    plugins.picker["pools"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["baseModel"] == base_model)
        .unwrap_or_else(|| panic!("no picker pool for {base_model}"))
}

/// Waits until the scraper's publish counter reaches `at_least`, at most 15 s.
pub async fn wait_for_publish(stack: &Stack, at_least: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let stats = stack.envoy().stats().await.unwrap();
        let published = stats.sum_containing("infergate.scraper.publishes");
        if published >= at_least {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the scraper published {published} snapshots in 15 s (waited for {at_least})\n\
             --- gateway stats:\n{}\n--- envoy log:\n{}",
            gateway_stats(&stats),
            stack.envoy().log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The gateway's own stats (`infergate.*` under any prefix), one per line, for messages.
pub fn gateway_stats(stats: &Stats) -> String {
    stats
        .containing("infergate.")
        .map(|(k, v)| format!("{k}: {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts `resp` is an OpenAI error body (`{"error": {"message", "type", "param",
/// "code"}}`) with status `status`, and returns its `error` object.
pub fn openai_error(resp: &HttpResponse, status: u16) -> serde_json::Value {
    assert_eq!(resp.status, status, "{}", resp.text());
    let ctype = resp.header("content-type").unwrap_or_default();
    assert!(ctype.contains("application/json"), "content-type {ctype}");
    let json = resp.json().unwrap();
    let error = json["error"].clone();
    assert!(error.is_object(), "not an OpenAI error: {json}");
    for field in ["message", "type", "param", "code"] {
        assert!(error.get(field).is_some(), "no `{field}` in {json}");
    }
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    error
}

/// `POST url` with `body` sent in `chunk`-byte pieces and no `content-length` (so only
/// buffering can tell the size). Envoy may answer before the upload ends.
pub async fn post_chunked(url: &str, body: Bytes, chunk: usize) -> HttpResponse {
    let uri: hyper::Uri = url.parse().unwrap();
    let authority = uri.authority().unwrap().clone();
    let stream = TcpStream::connect((authority.host(), authority.port_u16().unwrap()))
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut at = 0;
        while at < body.len() {
            let end = (at + chunk).min(body.len());
            if tx.send(body.slice(at..end)).await.is_err() {
                return;
            }
            at = end;
        }
    });
    let req = Request::post(uri.path())
        .header("host", authority.as_str())
        .header("content-type", "application/json")
        .body(ChannelBody::from_channel(rx))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    HttpResponse {
        status,
        headers,
        body,
    }
}

/// The access-log lines (JSON) of requests sent with `infergate-trace: <trace>`: Envoy
/// writes them to its stderr, flushed about once a second, so this polls up to 5 s.
pub async fn traced(stack: &Stack, trace: &str) -> serde_json::Value {
    let path = stack.envoy().log_path().with_file_name("stderr.log");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["trace"] == trace);
        if let Some(line) = found {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "no access-log line for trace {trace} in {}:\n{text}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
