//! `infergate-ratelimit`: Envoy's global rate-limit service for the gateway's tenant
//! quotas, its counters in Redis. Prints `listening on IP:PORT` once it serves.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use infergate_ratelimit::limits::{load_objects, LimitTable};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "infergate-ratelimit",
    about = "Envoy rate-limit service (envoy.service.ratelimit.v3) for infergate tenant quotas, over limitador and Redis"
)]
struct Args {
    /// The platform's TenantQuota objects (and the InferenceObjective objects they name):
    /// a YAML/JSON file or a directory of them, the same the gateway is given.
    #[arg(long)]
    objects: PathBuf,
    /// Redis holding the counters.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Address to serve gRPC on (port 0: the kernel chooses).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// The rate-limit domain the gateway's Envoy sends.
    #[arg(long, default_value = "infergate")]
    domain: String,
    /// Longest hold of a pre-debit, in seconds (at most one window: 60).
    #[arg(long, default_value_t = infergate_ratelimit::DEFAULT_RESERVATION_TTL.as_secs())]
    reservation_ttl_s: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let objects = load_objects(&args.objects)?;
    let table = LimitTable::from_objects(&objects)
        .with_context(|| format!("in {}", args.objects.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let service = infergate_ratelimit::connect(
            &args.redis,
            table,
            &args.domain,
            Duration::from_secs(args.reservation_ttl_s),
        )
        .await?;
        let listener = tokio::net::TcpListener::bind(&args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        println!(
            "{}",
            infergate_ratelimit::listening_line(listener.local_addr()?)
        );
        infergate_ratelimit::serve(service, listener).await
    })
}
