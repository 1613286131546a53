//! `infergate`: the gateway's command-line tool.
//!
//! `infergate explain --config <epp.yaml|json> --state <state.json> --request <body.json>
//! [--path /v1/chat/completions]` prints the decision record of one request as JSON.

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
    /// Schedule one request offline and print the decision record (JSON) on stdout.
    Explain {
        /// EndpointPickerConfig file (`.json` as JSON, anything else as YAML).
        #[arg(long)]
        config: PathBuf,
        /// Pool state: endpoints, metrics, in-flight load, routing history.
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
        /// The clock, in milliseconds, passed to the scheduler.
        #[arg(long, default_value_t = 0)]
        now_ms: u64,
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
        } => explain::run(&config, &state, &request, &path, seed, Millis(now_ms)),
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
