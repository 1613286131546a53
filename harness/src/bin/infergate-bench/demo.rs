//! `cargo xtask demo [--scenario calibration|hotspot|tenants|canary] …`: the README's main command. Over
//! the artefacts xtask built, brings the gateway up on a simulated pool, sends a multi-turn chat
//! workload to Envoy's round-robin `/rr` and then through the picker, prints the two side by
//! side, and stops Envoy and the simulator. Every scenario also writes its text and an HTML
//! page of charts (`report.txt`, `report.html`) into a directory of the run's own under
//! the system temp dir, and prints where.
//!
//! - `calibration` (the default): the calibration pool and workload, TTFT and cache-hit
//!   ratios.
//! - `hotspot`: the same, with one replica kept full by long-context requests sent straight
//!   to it (`infergate_harness::bench::hotspot`): TTFT p50/p99, the new requests each replica received,
//!   and whether the picker kept away from the full replica.
//! - `tenants`: two tenants with token quotas share the pool
//!   (`infergate_harness::bench::tenants`): a premium tenant's chats and a standard tenant's
//!   batch of long prompts through the gateway with tenancy, then through `/rr`: A's TTFT,
//!   B's 429s by reason, the tokens billed per tenant against the tokens the replicas served;
//!   then a saturation phase with flow control on (A weight 3 and B weight 1 in one band, a
//!   best-effort tenant C below them): service shares, queue time per priority and C's 429s
//!   per time window.
//! - `canary`: a 10% FP8 canary (`infergate_harness::bench::canary`) across two pools and
//!   through a model rewrite, each split per request and per conversation (sticky), then
//!   rolled back under load: cache-hit ratio and TTFT per build, the canary's share of
//!   conversations, the rollback's figures.

use super::bench::compare_with_baseline;
use super::Mode;
use anyhow::{bail, Result};
use infergate_harness::bench::calibration::{Columns, Route, RunSpec};
use infergate_harness::bench::canary::{self, CanaryOptions};
use infergate_harness::bench::cli::{DemoFlags, Scenario};
use infergate_harness::bench::hotspot::{self, HotspotOptions};
use infergate_harness::bench::html::{self, Block, Page};
use infergate_harness::bench::tenants::{self, TenantsOptions};
use infergate_harness::launch::runtime;
use infergate_harness::load::summary::percentile;

/// Envoy worker threads of the calibration scenario. One: on a 2-core machine the simulator
/// and the load generator need the other core. The picker's affinity does not depend on it
/// (`bench affinity` shows the same hit ratio at 1, 2, 4 and 8 workers).
const DEMO_WORKERS: u32 = 1;

/// Entry point of `cargo xtask demo`.
pub fn run(flags: &DemoFlags, mode: Mode) -> Result<()> {
    match flags.scenario {
        Scenario::Calibration => calibration(flags, mode),
        Scenario::Hotspot => {
            // Bad arguments fail in the check that comes before the build.
            let opts = HotspotOptions::from_flags(flags)?;
            if mode == Mode::Check {
                return Ok(());
            }
            eprintln!(
                "demo (hotspot): replica 0 kept full by long-context requests; the same \
                 multi-turn workload through Envoy's round-robin route, then through the \
                 gateway picker (Envoy --concurrency {})",
                opts.workers
            );
            let out = runtime()?.block_on(hotspot::run(&opts))?;
            println!("\n{out}");
            eprintln!("demo: Envoy and the simulator stopped");
            Ok(())
        }
        Scenario::Tenants => {
            let opts = TenantsOptions::from_flags(flags)?;
            if mode == Mode::Check {
                return Ok(());
            }
            eprintln!(
                "demo (tenants): tenant A's chats and tenant B's batch through the gateway \
                 with tenancy ({}, Envoy --concurrency {}), then through Envoy's round-robin \
                 route, each on a fresh simulated pool",
                opts.flavor, opts.workers
            );
            let out = runtime()?.block_on(tenants::run(&opts))?;
            println!("\n{out}");
            eprintln!("demo: Envoy and the simulator stopped");
            Ok(())
        }
        Scenario::Canary => {
            let opts = CanaryOptions::from_flags(flags)?;
            if mode == Mode::Check {
                return Ok(());
            }
            eprintln!(
                "demo (canary): a 10% FP8 canary across two pools and through a model \
                 rewrite, split per request and per conversation, then rolled back under load \
                 ({}, Envoy --concurrency {})",
                opts.args.flavor, opts.args.workers
            );
            let (out, ok) = runtime()?.block_on(canary::run(&opts))?;
            println!("\n{out}");
            eprintln!("demo: Envoy and the simulator stopped");
            if !ok {
                bail!("demo canary: a check was missed (the MISSED lines above)");
            }
            Ok(())
        }
    }
}

fn calibration(flags: &DemoFlags, mode: Mode) -> Result<()> {
    // Bad arguments fail in the check that comes before the build.
    let a = flags.calibration(DEMO_WORKERS)?;
    if mode == Mode::Check {
        return Ok(());
    }
    let mut specs = Vec::new();
    let workers = a.concurrencies.first().copied().unwrap_or(DEMO_WORKERS);
    for &f in &a.flavors {
        if specs.is_empty() {
            specs.push(RunSpec::new(
                "/rr (round-robin)",
                f,
                workers,
                Route::Baseline,
            ));
        }
        specs.push(RunSpec::new(
            format!("picker ({f})"),
            f,
            workers,
            Route::Picker,
        ));
    }
    eprintln!(
        "demo: the same multi-turn workload through Envoy's round-robin route, then through \
         the gateway picker (Envoy --concurrency {})",
        workers
    );
    let (mut out, cols) = compare_with_baseline(
        "infergate demo: round-robin vs the gateway picker",
        &a,
        &specs,
        false,
    )?;
    let page = calibration_page(&cols, &out);
    let dir = html::run_dir("calibration")?;
    out.push('\n');
    out.push_str(&html::write_run(&dir, &out, &page)?);
    println!("\n{out}");
    eprintln!("demo: Envoy and the simulator stopped");
    Ok(())
}

/// The calibration demo's HTML page: the TTFT distribution of each column, of every turn
/// and of turns 2 and later (the ones a router can make hit the cache), then `text`.
fn calibration_page(cols: &Columns, text: &str) -> Page {
    let mut page = Page::new("infergate demo: round robin vs the gateway picker");
    let sides = |later: bool| -> Vec<(String, Vec<f64>)> {
        cols.specs
            .iter()
            .zip(&cols.reports)
            .map(|(spec, r)| {
                let mut t: Vec<f64> = r
                    .records
                    .iter()
                    .filter(|x| x.ok() && (!later || x.turn > 0))
                    .filter_map(|x| x.ttft_s)
                    .collect();
                t.sort_by(f64::total_cmp);
                let label = format!(
                    "{} (p50 {:.1} ms, p99 {:.0} ms)",
                    spec.label,
                    percentile(&t, 50.0) * 1000.0,
                    percentile(&t, 99.0) * 1000.0
                );
                (label, t)
            })
            .collect()
    };
    page.push(Block::Chart(html::ttft_cdf(
        "Time to first token, every request",
        &sides(false),
    )));
    page.push(Block::Chart(html::ttft_cdf(
        "Time to first token, turns 2 and later",
        &sides(true),
    )));
    page.push(Block::Heading("The text report".into()));
    page.push(Block::Pre(text.to_string()));
    page
}
