//! `infergate`: the gateway's command-line tool.
//!
//! `infergate explain --config <epp.yaml|json> --state <state.json> --request <body.json>
//! [--path /v1/chat/completions] [--seed N] [--now-ms T] [--rewrites FILE] [--sticky-key K]`
//! prints the decision record of one request as JSON: the pool's endpoints classified by
//! the gateway's candidate rules at `T` (dead, fresh, unknown, unscraped; fail open or
//! close), then the scheduler's record, or the rejection the gateway would answer with.
//! With `--rewrites` the request is first rewritten as the router's model rewrites would
//! (sticky on `K`, else drawn from the seed).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use infergate_harness::explain;
use scheduler_core::types::Millis;

#[derive(Parser)]
#[command(
    name = "infergate",
    version,
    about = "In-Envoy LLM inference gateway tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Schedule one request offline as the gateway would and print the decision record
    /// (JSON) on stdout; a pool the gateway would reject prints the rejection.
    Explain {
        /// EndpointPickerConfig file (`.json` as JSON, anything else as YAML).
        #[arg(long)]
        config: PathBuf,
        /// Pool state: endpoints with their scrape records, in-flight load, routing
        /// history, and the pool's failure mode and staleness bounds.
        #[arg(long)]
        state: PathBuf,
        /// Request body (JSON).
        #[arg(long)]
        request: PathBuf,
        /// API path the request was sent to.
        #[arg(long, default_value = "/v1/chat/completions")]
        path: String,
        /// Seed of the decision's random choices (ties, weighted picks).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The clock, in milliseconds: what endpoints are judged fresh against (an
        /// endpoint without `scraped_at_ms` counts as scraped now), and the scheduler's.
        #[arg(long, default_value_t = 0)]
        now_ms: u64,
        /// `InferenceModelRewrite` objects (YAML or JSON, one or more documents) the router
        /// rewrites the request's model with before it is scheduled.
        #[arg(long)]
        rewrites: Option<PathBuf>,
        /// The request's sticky key for the rewrite's split (the session header's value,
        /// else the fairness id); without it the target is drawn per request from the seed.
        #[arg(long)]
        sticky_key: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Explain {
            config,
            state,
            request,
            path,
            seed,
            now_ms,
            rewrites,
            sticky_key,
        } => explain::run(&explain::Inputs {
            config: &config,
            state: &state,
            request: &request,
            path: &path,
            seed,
            now: Millis(now_ms),
            rewrites: rewrites.as_deref(),
            sticky_key: sticky_key.as_deref(),
        }),
    };
    match result {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("infergate: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
