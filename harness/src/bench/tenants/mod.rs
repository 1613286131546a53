//! The tenants scenario (`cargo xtask demo --scenario tenants`): two tenants share one pool
//! of 4 simulated replicas. Tenant A (premium) sends short multi-turn chats at moderate
//! concurrency; tenant B (standard, a third of A's tokens per minute) sends a batch of long
//! prompts at high concurrency. The same two-class load runs twice, each time on a fresh
//! simulated pool and a fresh Envoy: first through the gateway with the demo's
//! `TenantQuota` objects (auth, quotas, usage, a billing log), then through Envoy's
//! round-robin `/rr` (no auth, no quotas).
//!
//! A third run, the saturation phase ([`saturation`]), turns the gateway's flow control on
//! and saturates the pool with both tenants at weights 3 and 1, next to a best-effort
//! tenant C whose band overflows; [`windows`] computes its figures per time window and
//! [`saturation_report`] renders them.
//!
//! [`figures`] sums the billing log per tenant (with the conservation check) and reads the
//! replicas' own served-token counters; [`report`] renders both runs side by side and the
//! paragraph that answers who gets in, who waits, where, and what a quota counts; [`page`]
//! draws the HTML report written next to the text (`report.html` in the run's directory).

pub mod figures;
pub mod page;
pub mod report;
pub mod saturation;
pub mod saturation_report;
pub mod windows;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use self::figures::{bills, placement, served, served_since, Bill, Served};
use super::calibration;
use super::cli::{DemoFlags, Scenario, ScenarioArgs};
use super::html;
use crate::launch::{
    client, load_objects, read_billing_log, Backends, EnvoyOptions, Flavor, Stack, StackOptions,
    Tenancy, DEFAULT_MODEL,
};
use crate::load::classes::LONG_BATCH_PROMPT_TOKENS;
use crate::load::workload::filler;
use crate::load::{run_classes, ClassReport, ClassRun, LoadClass};
use crate::sim::{self, SimHandle};
use infergate_artefacts::workspace_root;
use infergate_filters::tenants::Tenants;

/// Tenant A's name: its `TenantQuota`, its fairness id and its load class.
pub const TENANT_A: &str = "tenant-a";
/// Tenant B's name.
pub const TENANT_B: &str = "tenant-b";
/// Tenant A's test key (its sha256 is in the demo's objects; see testdata/README.md).
pub const KEY_A: &str = "sk-infergate-test-tenant-a";
/// Tenant B's test key.
pub const KEY_B: &str = "sk-infergate-test-tenant-b";
/// The header the gateway sets to the tenant's fairness id, and the replicas' counters are
/// labelled by.
pub const FAIRNESS_HEADER: &str = "x-llm-d-inference-fairness-id";
/// The demo's objects, relative to the workspace root.
pub const DEFAULT_OBJECTS: &str = "testdata/tenants/demo";
/// Envoy worker threads by default: more than one, so the quotas are shown to hold per
/// Envoy process across workers.
pub const DEFAULT_WORKERS: u32 = 2;
/// A's chats start at this many per second (Poisson), the same offered load in both runs.
pub const A_RATE: f64 = 8.0;
/// A's requests in flight at most.
pub const A_CONCURRENCY: u32 = 8;
/// B's batch starts up to this many requests per second: more than the pool can prefill
/// (4 × 16k tokens/s at [`TIME_SCALE`] is about 21 prompts of 3k tokens a second), so
/// through `/rr` B's requests pile up in the replicas' queues, up to [`B_CONCURRENCY`].
/// Through the gateway B's refusals come back at once, and the rate keeps its client from
/// spinning on them.
pub const B_RATE: f64 = 32.0;
/// B's requests in flight at most: the seed's batch sends thousands at once; 128 of 3k
/// tokens (32 per replica, 98k tokens of each replica's 160k of KV) fill the queues
/// without preempting.
pub const B_CONCURRENCY: u32 = 128;
/// Simulated seconds per real second by default: real time. At the other demos' 2 the
/// machine's two cores, running the load, Envoy and the simulator, saturate before the
/// pool's prefill does, and the batch would measure the machine rather than the replicas.
pub const TIME_SCALE: f64 = 1.0;
/// Per-request timeout of the load.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// Probe requests (tenant A's) sent before the gateway run until all are answered.
const PROBES: u32 = 4;

/// The scenario's flags.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantsOptions {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// A shorter load (for CI).
    pub quick: bool,
    /// The gateway's flavour.
    pub flavor: Flavor,
    /// Envoy worker threads.
    pub workers: u32,
    /// The `TenantQuota` and `InferenceObjective` objects (a directory or a file); they
    /// must give the test keys of tenants A and B.
    pub objects: PathBuf,
}

impl TenantsOptions {
    /// The flags after `--scenario tenants`.
    pub fn parse(args: &[String]) -> Result<Self> {
        Self::from_flags(&DemoFlags::parse_scenario(Scenario::Tenants, args)?)
    }

    /// The scenario's options from `demo`'s flags.
    pub fn from_flags(flags: &DemoFlags) -> Result<Self> {
        let common = flags.scenario_args(ScenarioArgs {
            time_scale: TIME_SCALE,
            quick: false,
            flavor: Flavor::Native,
            workers: DEFAULT_WORKERS,
        })?;
        Ok(TenantsOptions {
            time_scale: common.time_scale,
            quick: common.quick,
            flavor: common.flavor,
            workers: common.workers,
            objects: flags
                .tenants
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_OBJECTS)),
        })
    }

    /// The objects' path: as given when absolute or when it exists from here, else under
    /// the workspace root (the default is relative to it).
    pub fn objects_path(&self) -> PathBuf {
        if self.objects.is_absolute() || self.objects.exists() {
            self.objects.clone()
        } else {
            workspace_root().join(&self.objects)
        }
    }
}

/// The two classes: A's short chats (`quick`: 32 conversations × 4 turns, else 48 × 6) at
/// [`A_RATE`], and B's batch of 3k-token prompts (`quick`: 512, else 1152) at up to
/// [`B_RATE`] and [`B_CONCURRENCY`] in flight: at their rates both last about as long (16 s,
/// else 36 s; through `/rr` the pool's pace makes B's last longer).
pub fn classes(quick: bool) -> Vec<LoadClass> {
    let mut a = LoadClass::short_chats(TENANT_A).bearer(KEY_A);
    (a.workload.conversations, a.workload.turns) = if quick { (32, 4) } else { (48, 6) };
    a.concurrency = A_CONCURRENCY;
    a.rate = Some(A_RATE);
    let mut b = LoadClass::long_batch(TENANT_B, LONG_BATCH_PROMPT_TOKENS).bearer(KEY_B);
    b.workload.conversations = if quick { 512 } else { 1152 };
    b.rate = Some(B_RATE);
    b.concurrency = B_CONCURRENCY;
    vec![a, b]
}

/// Which way the load goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Through the gateway filters, with tenancy.
    Gateway,
    /// Through `/rr`: Envoy's round robin, no gateway filter.
    RoundRobin,
}

/// What one run produced.
#[derive(Clone, Debug)]
pub struct RunFigures {
    /// Column label.
    pub label: String,
    /// The route.
    pub route: Route,
    /// Per class, in [`classes`] order.
    pub classes: Vec<ClassReport>,
    /// Answered requests per replica (and a last slot for unknown ones), per class.
    pub placement: Vec<Vec<u64>>,
    /// What the replicas served during the load, per fairness id.
    pub served: BTreeMap<String, Served>,
    /// The billing log's records of the load, summed per tenant.
    pub bills: BTreeMap<String, Bill>,
    /// Lines the billing log got during the load.
    pub billing_lines: usize,
    /// The billing log.
    pub billing_log: PathBuf,
    /// One request of B's batch shape sent half-way through the load, through the gateway,
    /// besides the batch (it has a billing line and counts in B's bill): what it got.
    pub sample: Option<Sample>,
    /// Wall time of the load.
    pub wall_s: f64,
}

/// One tenant × model limit as the gateway compiled it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TenantLimit {
    /// The tenant.
    pub tenant: String,
    /// The objective it injects, and that objective's priority.
    pub objective: Option<(String, i32)>,
    /// The model the limit applies to (`*`: any other).
    pub model: String,
    /// Requests per minute.
    pub rpm: Option<u64>,
    /// Tokens per minute.
    pub tpm: Option<u64>,
    /// Requests in flight.
    pub concurrency: Option<u64>,
    /// Output tokens pre-debited when a request names none.
    pub max_completion_tokens_default: Option<u64>,
}

impl std::fmt::Display for TenantLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = |v: Option<u64>| v.map_or("none".to_string(), |v| v.to_string());
        let objective = match &self.objective {
            Some((name, priority)) => format!("objective {name}, priority {priority}"),
            None => "no objective".into(),
        };
        write!(
            f,
            "{} ({objective}), model {}: rpm {}, tpm {}, concurrency {}, \
             maxCompletionTokensDefault {}",
            self.tenant,
            self.model,
            n(self.rpm),
            n(self.tpm),
            n(self.concurrency),
            n(self.max_completion_tokens_default),
        )
    }
}

/// Every tenant × model limit of `tenants`, in configuration order.
pub fn limits_of(tenants: &Tenants) -> Vec<TenantLimit> {
    let mut out = Vec::new();
    for (_, t) in tenants.iter() {
        for l in &t.limits {
            out.push(TenantLimit {
                tenant: t.name.clone(),
                objective: t.objective.clone().map(|o| (o, t.priority)),
                model: l.model.clone(),
                rpm: l.limits.rpm,
                tpm: l.limits.tpm,
                concurrency: l.limits.concurrency,
                max_completion_tokens_default: l.max_completion_tokens_default,
            });
        }
    }
    out
}

/// Runs the scenario and returns the report.
pub async fn run(opts: &TenantsOptions) -> Result<String> {
    let path = opts.objects_path();
    let objects = load_objects(&path).with_context(|| format!("--tenants {}", path.display()))?;
    let tenants =
        Tenants::from_objects(&objects).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    for (name, key) in [
        (TENANT_A, KEY_A),
        (TENANT_B, KEY_B),
        (saturation::TENANT_C, saturation::KEY_C),
    ] {
        let found = tenants
            .by_api_key(key)
            .and_then(|id| tenants.tenant(id))
            .map(|t| t.name.as_str());
        if found != Some(name) {
            bail!(
                "{}: the key {key} must belong to {name} (found {found:?})",
                path.display()
            );
        }
    }
    // The run's own directory holds the billing logs and the reports, kept after the demo
    // (they are what a person looks at afterwards).
    let logs = html::run_dir("tenants")?;
    let mut runs = Vec::new();
    for route in [Route::Gateway, Route::RoundRobin] {
        runs.push(run_once(opts, route, &objects, &logs).await?);
    }
    let saturated = saturation::run(opts, &objects, &logs).await?;
    let r = report::Report {
        opts,
        objects_path: &path,
        limits: limits_of(&tenants),
        classes: classes(opts.quick),
        runs: &runs,
        saturation: Some(&saturated),
    };
    let mut text = report::render(&r);
    let page = page::page(&runs, Some(&saturated), &report::answers(&r), &text);
    text.push('\n');
    text.push_str(&html::write_run(&logs, &text, &page)?);
    text.push('\n');
    Ok(text)
}

async fn run_once(
    opts: &TenantsOptions,
    route: Route,
    objects: &[Value],
    logs: &Path,
) -> Result<RunFigures> {
    // A fresh pool for each run: empty caches and queues, counters from zero.
    let sim = sim::start(calibration::sim_config(opts.time_scale))
        .await
        .context("starting the simulator")?;
    let result = run_on(&sim, opts, route, objects, logs).await;
    sim.shutdown().await;
    result
}

/// A scenario run's stack over `sim`: the demo's flavour and workers, the tenant `objects`
/// and a fresh billing log at `billing_log` (a log left by an earlier demo of the same pid
/// would be appended to, so it is removed first).
pub(super) fn stack_options(
    sim: &SimHandle,
    opts: &TenantsOptions,
    objects: &[Value],
    billing_log: &Path,
) -> StackOptions {
    let _ = std::fs::remove_file(billing_log);
    let mut so = StackOptions::new(opts.flavor, Backends::External(sim.addrs().to_vec()));
    so.envoy = EnvoyOptions {
        concurrency: opts.workers,
        ..EnvoyOptions::default()
    };
    so.tenancy = Tenancy {
        objects: objects.to_vec(),
        jwt: None,
        billing_log: Some(billing_log.to_path_buf()),
    };
    so
}

async fn run_on(
    sim: &SimHandle,
    opts: &TenantsOptions,
    route: Route,
    objects: &[Value],
    logs: &Path,
) -> Result<RunFigures> {
    let (label, file) = match route {
        Route::Gateway => (
            format!("gateway ({}, {} workers)", opts.flavor, opts.workers),
            "billing-gateway.log",
        ),
        Route::RoundRobin => ("/rr (round robin)".to_string(), "billing-rr.log"),
    };
    let billing_log = logs.join(file);
    let so = stack_options(sim, opts, objects, &billing_log);
    let stack = Stack::start(so)
        .await
        .with_context(|| format!("starting the {} stack", opts.flavor))?;
    let mut classes = classes(opts.quick);
    let url = match route {
        Route::Gateway => {
            let probes = probe(&stack).await?;
            wait_lines(&billing_log, probes, Duration::from_secs(5)).await?;
            stack.picker_url()
        }
        Route::RoundRobin => {
            // No gateway sets the fairness id on this route; the client does, only so the
            // replicas' counters can tell the tenants apart.
            for c in &mut classes {
                let id = c.name.clone();
                *c = c.clone().header(FAIRNESS_HEADER, &id);
            }
            stack.baseline_url()
        }
    };
    let skip = read_billing_log(&billing_log)?.len();
    let served_before = served(&scrape(sim).await);
    eprintln!(
        "tenants: {label}: {} at {}",
        classes
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(" and "),
        url
    );
    let sampler = (route == Route::Gateway).then(|| {
        let url = url.clone();
        let half = classes.first().map_or(Duration::ZERO, |a| {
            let requests = f64::from(a.workload.conversations * a.workload.turns);
            Duration::from_secs_f64(requests / a.rate.unwrap_or(A_RATE) / 2.0)
        });
        tokio::spawn(async move {
            tokio::time::sleep(half).await;
            sample_b(&url).await
        })
    });
    let start = Instant::now();
    let reports = run_classes(&ClassRun {
        url: url.clone(),
        classes,
        timeout: REQUEST_TIMEOUT,
        progress: true,
    })
    .await?;
    let wall_s = start.elapsed().as_secs_f64();
    let sample = match sampler {
        Some(task) => Some(task.await.context("the mid-batch sample")?),
        None => None,
    };
    let sent: usize = reports.iter().map(|r| r.records.len()).sum::<usize>()
        + sample.as_ref().map_or(0, |s| usize::from(s.status != 0));
    let expected = match route {
        // Every request reaches the auth stage, and each gets one line.
        Route::Gateway => skip + sent,
        // No gateway filter on `/rr`: a line would be a bug; wait a few flushes to see.
        Route::RoundRobin => skip,
    };
    wait_lines(&billing_log, expected, Duration::from_secs(5)).await?;
    if route == Route::RoundRobin {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let records = read_billing_log(&billing_log)?;
    let load_records = records.get(skip..).unwrap_or_default();
    let served_after = served(&scrape(sim).await);
    drop(stack);
    Ok(RunFigures {
        label,
        route,
        placement: reports
            .iter()
            .map(|r| placement(&r.records, sim.addrs()))
            .collect(),
        classes: reports,
        served: served_since(&served_after, &served_before),
        bills: bills(load_records),
        billing_lines: load_records.len(),
        billing_log,
        sample,
        wall_s,
    })
}

/// Every replica's `/metrics` page (a page that cannot be fetched is left out).
async fn scrape(sim: &SimHandle) -> Vec<String> {
    let mut pages = Vec::new();
    for base in sim.base_urls() {
        if let Ok(r) = client::get(&format!("{base}/metrics")).await {
            if r.status == 200 {
                pages.push(r.text());
            }
        }
    }
    pages
}

/// Sends tenant A's tiny probe requests until [`PROBES`] in a row are answered 200 (every
/// worker then serves), and returns how many were sent: each leaves a billing line.
async fn probe(stack: &Stack) -> Result<usize> {
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let body = serde_json::json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
    });
    let auth = format!("Bearer {KEY_A}");
    let headers = [("authorization", auth.as_str())];
    let start = Instant::now();
    let mut sent = 0;
    let mut in_a_row = 0;
    while in_a_row < PROBES {
        sent += 1;
        match client::post_json(&url, &body, &headers).await {
            Ok(r) if r.status == 200 => in_a_row += 1,
            _ => in_a_row = 0,
        }
        if in_a_row < PROBES && start.elapsed() > Duration::from_secs(30) {
            bail!("the gateway at {url} did not answer tenant A's probes within 30 s");
        }
    }
    Ok(sent)
}

/// Waits until the billing log holds at least `lines` lines (Envoy flushes it every
/// 100 ms).
async fn wait_lines(file: &Path, lines: usize, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let have = read_billing_log(file)?.len();
        if have >= lines {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!(
                "the billing log {} has {have} lines after {} s, {lines} expected",
                file.display(),
                timeout.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one sampled request got: its status and the headers that say why and for how long.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// HTTP status (0: no response).
    pub status: u16,
    /// [`SAMPLE_HEADERS`] present on the response, in that order.
    pub headers: Vec<(String, String)>,
    /// Why no response came, when none did.
    pub error: Option<String>,
}

/// The response headers a sample keeps.
pub const SAMPLE_HEADERS: [&str; 6] = [
    "x-llm-d-request-dropped-reason",
    "retry-after",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-requests",
];

impl Sample {
    /// The value of header `name`, if kept.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The status and the kept headers, as one line.
    pub fn line(&self) -> String {
        if let Some(e) = &self.error {
            return format!("no response: {e}");
        }
        let mut parts = vec![self.status.to_string()];
        parts.extend(self.headers.iter().map(|(n, v)| format!("{n}: {v}")));
        parts.join(", ")
    }
}

/// One request of B's batch shape through the gateway.
async fn sample_b(base: &str) -> Sample {
    let url = format!("{base}/v1/chat/completions");
    let body = serde_json::json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": filler(0xb, LONG_BATCH_PROMPT_TOKENS)}],
        "max_tokens": 32,
    });
    let auth = format!("Bearer {KEY_B}");
    match client::post_json(&url, &body, &[("authorization", auth.as_str())]).await {
        Ok(r) => Sample {
            status: r.status,
            headers: SAMPLE_HEADERS
                .iter()
                .filter_map(|h| r.header(h).map(|v| (h.to_string(), v.to_string())))
                .collect(),
            error: None,
        },
        Err(e) => Sample {
            error: Some(format!("{e:#}")),
            ..Sample::default()
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_parse_with_defaults() {
        let o = TenantsOptions::parse(&[]).unwrap();
        assert_eq!((o.flavor, o.workers, o.quick), (Flavor::Native, 2, false));
        assert_eq!(o.objects, PathBuf::from(DEFAULT_OBJECTS));
        let o = TenantsOptions::parse(&strings(&[
            "--flavor",
            "wasm",
            "--workers",
            "1",
            "--quick",
            "--tenants",
            "/x",
        ]))
        .unwrap();
        assert_eq!(
            (o.flavor, o.workers, o.quick, o.objects_path()),
            (Flavor::Wasm, 1, true, PathBuf::from("/x"))
        );
        for bad in [
            &["--flavor", "plain"][..],
            &["--workers", "0"],
            &["--time-scale", "0"],
            &["--tenants"],
            &["--nope"],
        ] {
            assert!(TenantsOptions::parse(&strings(bad)).is_err(), "{bad:?}");
        }
    }

    /// The demo's objects compile, give the test keys to A and B, and keep B's tokens per
    /// minute at a third of A's.
    #[test]
    fn the_demo_objects_compile_with_b_at_a_third_of_a() {
        let o = TenantsOptions::parse(&[]).unwrap();
        let objects = load_objects(&o.objects_path()).unwrap();
        let tenants = Tenants::from_objects(&objects).unwrap();
        let limit = |key: &str| {
            let id = tenants.by_api_key(key).unwrap();
            tenants.limit_for(id, DEFAULT_MODEL).unwrap().1.limits
        };
        let (a, b) = (limit(KEY_A), limit(KEY_B));
        assert_eq!(a.tpm.unwrap(), 3 * b.tpm.unwrap());
        let name = |key: &str| {
            let id = tenants.by_api_key(key).unwrap();
            let t = tenants.tenant(id).unwrap();
            (t.name.clone(), t.objective.clone(), t.priority)
        };
        assert_eq!(
            name(KEY_A),
            (TENANT_A.into(), Some("premium-traffic".into()), 100)
        );
        assert_eq!(
            name(KEY_B),
            (TENANT_B.into(), Some("standard-traffic".into()), 0)
        );
        let limits = limits_of(&tenants);
        assert_eq!(limits.len(), 3, "A, B and the best-effort C");
        assert_eq!(limits[1].tpm, b.tpm);
        let line = limits[1].to_string();
        assert!(
            line.starts_with(
                "tenant-b (objective standard-traffic, priority 0), model sim-model: rpm "
            ),
            "{line}"
        );
        assert!(line.contains(&format!("tpm {},", b.tpm.unwrap())), "{line}");
    }

    /// The load is sized against the objects: B offers many times its tokens per minute,
    /// A's offer fits in its own, and B's client keeps more in flight than B may.
    #[test]
    fn the_load_overruns_b_and_not_a() {
        let objects = load_objects(&TenantsOptions::parse(&[]).unwrap().objects_path()).unwrap();
        let tenants = Tenants::from_objects(&objects).unwrap();
        let limit = |key: &str| {
            let id = tenants.by_api_key(key).unwrap();
            tenants.limit_for(id, DEFAULT_MODEL).unwrap().1.limits
        };
        for quick in [true, false] {
            let c = classes(quick);
            let (a, b) = (&c[0], &c[1]);
            assert_eq!((a.name.as_str(), b.name.as_str()), (TENANT_A, TENANT_B));
            // Tokens per second each offers (prompt + answer, at its start rate).
            let b_offer = b.rate.unwrap()
                * f64::from(
                    b.workload.system_tokens + b.workload.user_tokens + b.workload.max_tokens,
                );
            let b_tpm = limit(KEY_B).tpm.unwrap() as f64 / 60.0;
            assert!(b_offer > 10.0 * b_tpm, "{b_offer} vs {b_tpm}");
            // A's mean request: turn t's prompt is the system prompt, t + 1 questions and
            // t answers; each asks for max_tokens more.
            let w = &a.workload;
            let turns = f64::from(w.turns);
            let mean = f64::from(w.system_tokens)
                + f64::from(w.user_tokens) * (turns + 1.0) / 2.0
                + f64::from(w.max_tokens) * ((turns - 1.0) / 2.0 + 1.0);
            let a_offer = a.rate.unwrap() * mean;
            let a_tpm = limit(KEY_A).tpm.unwrap() as f64 / 60.0;
            assert!(a_offer < a_tpm, "{a_offer} vs {a_tpm}");
            assert!(u64::from(b.concurrency) > limit(KEY_B).concurrency.unwrap());
            assert!(u64::from(a.concurrency) <= limit(KEY_A).concurrency.unwrap());
            // Both classes last about as long at their rates.
            let a_s = f64::from(w.conversations * w.turns) / a.rate.unwrap();
            let b_s = f64::from(b.workload.conversations) / b.rate.unwrap();
            assert!((a_s / b_s - 1.0).abs() < 0.25, "{a_s} s vs {b_s} s");
        }
    }
}
