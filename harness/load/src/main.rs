//! `infergate-load`: multi-turn chat load against one or more base URLs, printed side by side.
//!
//! Each `--url` is one target, run one after the other: `[label=]URL[,URL…]`. A target with
//! several URLs is a client-side pool (`--assign random|sticky|round-robin`): the
//! simulator's replicas, for calibrating it, or several gateway replicas, with
//! `--connections per-request` as an L4 load balancer in front of them would spread the
//! turns (`--assign random --connections per-request`; see `Target::balanced`). Requests
//! go to `<URL>/v1/chat/completions`.
//!
//! With `--class SPEC` (repeatable; see `LoadClass::parse`) every class runs at once
//! against the one `--url`, and the report has one column per class; `--tenant-demo KEY_A,KEY_B`
//! adds the two classes of the tenant demo.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use infergate_load::{self as load, Assign, Connections, LoadConfig, Target, Workload};

#[derive(Debug, Parser)]
#[command(name = "infergate-load", about = "Multi-turn chat load generator")]
struct Args {
    /// Target `[label=]URL[,URL…]` (repeatable; targets run one after the other).
    #[arg(long = "url", required = true)]
    urls: Vec<String>,
    /// A load class `name=A,preset=chat|batch,api_key=K,concurrency=N,…` (repeatable): all
    /// classes run at once against the one --url, reported per class; the workload flags
    /// below do not apply to classes.
    #[arg(long = "class")]
    classes: Vec<String>,
    /// The tenant demo's two classes (short chats, long batch) with these bearer keys.
    #[arg(long, value_name = "KEY_A,KEY_B")]
    tenant_demo: Option<String>,
    /// Assignment within a multi-URL target; one for all targets or one per `--url`.
    #[arg(long = "assign", default_value = "random")]
    assign: Vec<Assign>,
    /// `keep-alive`, or `per-request`: a new connection for every request (clients behind
    /// an L4 balancer); one for all targets or one per `--url`.
    #[arg(long = "connections", default_value = "keep-alive")]
    connections: Vec<Connections>,
    /// Model name.
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// Conversations.
    #[arg(long, default_value_t = 64)]
    conversations: u32,
    /// Turns per conversation.
    #[arg(long, default_value_t = 6)]
    turns: u32,
    /// Tokens of each conversation's own system prompt.
    #[arg(long, default_value_t = 4000)]
    system_tokens: u32,
    /// Tokens of a preamble shared by all conversations.
    #[arg(long, default_value_t = 0)]
    shared_prefix_tokens: u32,
    /// Tokens per user message.
    #[arg(long, default_value_t = 64)]
    user_tokens: u32,
    /// max_tokens per request.
    #[arg(long, default_value_t = 600)]
    max_tokens: u32,
    /// Send vLLM's `ignore_eos` so every answer is exactly max_tokens long.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    ignore_eos: bool,
    /// Ask for `stream_options.include_usage` (else tokens are counted by chunks).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    include_usage: bool,
    /// Also ask for `continuous_usage_stats` (usage on every chunk).
    #[arg(long)]
    continuous_usage: bool,
    /// A LoRA adapter the conversations are for (repeatable): each conversation's `model`
    /// is one of them, drawn by a Zipf law (the first the most popular).
    #[arg(long = "adapter")]
    adapters: Vec<String>,
    /// `--adapters N`: adapters `lora-00` … `lora-<N-1>` (added to any `--adapter`).
    #[arg(long = "adapters", default_value_t = 0)]
    numbered_adapters: u32,
    /// Exponent of the Zipf law over the adapters (0: uniform).
    #[arg(long, default_value_t = 1.0)]
    adapter_zipf: f64,
    /// Tokens of the system prompt shared by each adapter's conversations.
    #[arg(long, default_value_t = 0)]
    adapter_prefix_tokens: u32,
    /// Groups of conversations sharing a system prompt (equal groups dealt in a seeded
    /// shuffle; 0: none). With `--turns 1 --system-tokens 0`, inference-perf's shared-prefix shape.
    #[arg(long, default_value_t = 0)]
    prefix_groups: u32,
    /// Tokens of each group's shared system prompt.
    #[arg(long, default_value_t = 0)]
    group_prefix_tokens: u32,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
    /// Requests started per second (Poisson); default: as fast as concurrency allows.
    #[arg(long)]
    rate: Option<f64>,
    /// Seed of text and order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// API key (repeatable); conversation i uses key i mod n.
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 300.0)]
    timeout_s: f64,
    /// Send the same text to every target (default: varied per target).
    #[arg(long)]
    same_text: bool,
    /// Print the summaries as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write every request record as JSON lines to this file.
    #[arg(long)]
    records: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

/// Runs `--class`/`--tenant-demo` classes at once against the one `--url`.
async fn run_classes(a: &Args) -> anyhow::Result<()> {
    let [url] = a.urls.as_slice() else {
        anyhow::bail!("classes run against exactly one --url");
    };
    let mut classes = a
        .classes
        .iter()
        .map(|c| load::LoadClass::parse(c))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let Some(keys) = &a.tenant_demo {
        let Some((ka, kb)) = keys.split_once(',') else {
            anyhow::bail!("--tenant-demo takes KEY_A,KEY_B");
        };
        classes.extend(load::tenant_demo(ka, kb));
    }
    let run = load::ClassRun {
        url: url.clone(),
        classes,
        timeout: Duration::from_secs_f64(a.timeout_s.max(0.001)),
        progress: !a.quiet,
    };
    let reports = load::run_classes(&run).await?;
    if let Some(path) = &a.records {
        let groups = reports
            .iter()
            .map(|r| (r.name.as_str(), r.records.as_slice()));
        write_records(path, "class", groups)?;
    }
    let summaries: Vec<_> = reports.into_iter().map(|r| r.summary).collect();
    print_summaries(a.json, "classes", &summaries, load::class_table)
}

/// Writes every record as one JSON line, with its group's label under `key`.
fn write_records<'a>(
    path: &std::path::Path,
    key: &str,
    groups: impl Iterator<Item = (&'a str, &'a [load::RequestRecord])>,
) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (label, records) in groups {
        for rec in records {
            let mut v = serde_json::to_value(rec)?;
            if let Some(o) = v.as_object_mut() {
                o.insert(key.into(), serde_json::Value::String(label.to_owned()));
            }
            writeln!(f, "{v}")?;
        }
    }
    f.flush()?;
    Ok(())
}

/// Prints the summaries as JSON (under `key`) or as the text `table`.
fn print_summaries(
    json: bool,
    key: &str,
    summaries: &[load::Summary],
    table: fn(&[load::Summary]) -> String,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        let value = serde_json::json!({ key: summaries });
        writeln!(out, "{}", serde_json::to_string_pretty(&value)?)?;
    } else {
        write!(out, "{}", table(summaries))?;
    }
    out.flush()?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    if !a.classes.is_empty() || a.tenant_demo.is_some() {
        return run_classes(&a).await;
    }
    let mut targets = Vec::new();
    for (i, spec) in a.urls.iter().enumerate() {
        let assign = a
            .assign
            .get(i)
            .or(a.assign.last())
            .copied()
            .unwrap_or(Assign::Random);
        let mut target = Target::parse(spec, assign)?;
        target.connections = a
            .connections
            .get(i)
            .or(a.connections.last())
            .copied()
            .unwrap_or_default();
        targets.push(target);
    }
    let cfg = LoadConfig {
        workload: Workload {
            model: a.model,
            conversations: a.conversations,
            turns: a.turns,
            system_tokens: a.system_tokens,
            shared_prefix_tokens: a.shared_prefix_tokens,
            user_tokens: a.user_tokens,
            max_tokens: a.max_tokens,
            ignore_eos: a.ignore_eos,
            seed: a.seed,
            include_usage: a.include_usage,
            continuous_usage: a.continuous_usage,
            adapters: a
                .adapters
                .iter()
                .cloned()
                .chain(load::workload::numbered_adapters(a.numbered_adapters))
                .collect(),
            adapter_zipf: a.adapter_zipf,
            adapter_prefix_tokens: a.adapter_prefix_tokens,
            prefix_groups: a.prefix_groups,
            group_prefix_tokens: a.group_prefix_tokens,
        },
        targets,
        concurrency: a.concurrency,
        rate: a.rate,
        api_keys: a.api_keys,
        timeout: Duration::from_secs_f64(a.timeout_s.max(0.001)),
        progress: !a.quiet,
        same_text: a.same_text,
    };
    let reports = load::run(&cfg).await?;
    if let Some(path) = &a.records {
        let groups = reports
            .iter()
            .zip(&cfg.targets)
            .map(|(r, t)| (t.label.as_str(), r.records.as_slice()));
        write_records(path, "target", groups)?;
    }
    let summaries: Vec<_> = reports.into_iter().map(|r| r.summary).collect();
    print_summaries(a.json, "targets", &summaries, load::table)
}
