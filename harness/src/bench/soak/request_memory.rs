//! `cargo xtask bench memory`: the most memory one request can make Envoy take, per flavour,
//! with the body limit at its default (4 MiB).
//!
//! For each worst-case body ([`WorstBody`], each just under the limit, so the router reads
//! all of it) a fresh Envoy is started (an allocator or a Wasm VM that already grew would
//! hide the cost), warmed with a few plain requests, its peak RSS reset
//! (`/proc/<pid>/clear_refs`); then the body is sent once, or `N` times at once, and the
//! peak RSS above the level before is the request's cost. The Wasm VMs' linear memory
//! growth is reported beside it: V8 never gives that memory back.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::growth::mb;
use super::hostile::{self, float_tools_body, json_string};
use super::procmem::{self, WasmMemories};
use crate::bench::cli::{flavor_or_both, flavors, parse_flags, FlavorArg};
use crate::launch::{client, Backends, EnvoyOptions, Flavor, Stack, StackOptions, DEFAULT_MODEL};

/// The router's default body limit.
pub const BODY_LIMIT: usize = 4 << 20;

/// How long one worst-case request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(180);

/// The worst bodies under the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorstBody {
    /// `tools` full of `1e308,`: each 6-byte float may be written out long in the prompt.
    FloatTools,
    /// One message whose content is one 4 MiB string.
    OneString,
    /// 100,000 short messages.
    ManyMessages,
    /// Arrays nested as deep as the body allows.
    DeepNesting,
    /// One object in `tools` with ~700k members `"k":0` (an object's members are gathered
    /// and sorted before they can be written, unlike an array's elements).
    ObjectMembers,
}

impl WorstBody {
    /// Every body.
    pub const ALL: [WorstBody; 5] = [
        WorstBody::FloatTools,
        WorstBody::OneString,
        WorstBody::ManyMessages,
        WorstBody::DeepNesting,
        WorstBody::ObjectMembers,
    ];

    /// Label for tables.
    pub fn name(self) -> &'static str {
        match self {
            WorstBody::FloatTools => "4 MiB of 1e308 in tools",
            WorstBody::OneString => "one 4 MiB string",
            WorstBody::ManyMessages => "100k messages",
            WorstBody::DeepNesting => "nesting ~2M deep",
            WorstBody::ObjectMembers => "700k members in a tool",
        }
    }

    /// The body, at most [`BODY_LIMIT`] bytes.
    pub fn build(self, model: &str) -> Vec<u8> {
        let room = BODY_LIMIT - 256;
        match self {
            WorstBody::FloatTools => float_tools_body(model, room),
            WorstBody::OneString => format!(
                "{{\"model\":{},\"max_tokens\":1,\"messages\":[{{\"role\":\"user\",\
                 \"content\":\"{}\"}}]}}",
                json_string(model),
                "abc ".repeat(room / 4)
            )
            .into_bytes(),
            WorstBody::ManyMessages => {
                let one = "{\"role\":\"user\",\"content\":\"hello world\"}";
                let n = 100_000.min(room / (one.len() + 1));
                format!(
                    "{{\"model\":{},\"max_tokens\":1,\"messages\":[{}]}}",
                    json_string(model),
                    vec![one; n].join(",")
                )
                .into_bytes()
            }
            WorstBody::ObjectMembers => {
                let member = "\"k\":0,";
                let n = (room - 128) / member.len();
                format!(
                    "{{\"model\":{},\"max_tokens\":1,\"messages\":[{{\"role\":\"user\",\
                     \"content\":\"hi\"}}],\"tools\":[{{{}\"k\":0}}]}}",
                    json_string(model),
                    member.repeat(n)
                )
                .into_bytes()
            }
            WorstBody::DeepNesting => {
                let depth = room / 2;
                format!(
                    "{{\"model\":{},\"max_tokens\":1,\"messages\":[{{\"role\":\"user\",\
                     \"content\":\"hi\"}}],\"tools\":{}{}}}",
                    json_string(model),
                    "[".repeat(depth),
                    "]".repeat(depth)
                )
                .into_bytes()
            }
        }
    }
}

/// What the command measures.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryOptions {
    /// Flavours.
    pub flavors: Vec<Flavor>,
    /// Requests sent at once in the parallel measurement.
    pub parallel: usize,
}

/// `bench memory`'s flags.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct MemoryFlags {
    /// Flavours, comma-separated: wasm, native or both [default: both].
    #[arg(
        long,
        alias = "flavour",
        value_name = "FLAVOR",
        value_delimiter = ',',
        value_parser = flavor_or_both
    )]
    pub flavor: Vec<FlavorArg>,
    /// Requests sent at once in the parallel measurement, 1..=64.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = parallel)]
    pub parallel: usize,
}

/// `--parallel`: 1..=64.
fn parallel(s: &str) -> Result<usize> {
    let n: usize = s.trim().parse()?;
    if !(1..=64).contains(&n) {
        bail!("must be 1..=64");
    }
    Ok(n)
}

impl MemoryFlags {
    /// The measurement these flags ask for.
    pub fn options(self) -> MemoryOptions {
        MemoryOptions {
            flavors: flavors(&self.flavor, &[Flavor::Wasm, Flavor::Native]),
            parallel: self.parallel,
        }
    }
}

impl MemoryOptions {
    /// Parses `--flavor wasm|native|both` and `--parallel N`.
    pub fn parse(args: &[String]) -> Result<Self> {
        Ok(parse_flags::<MemoryFlags>(args)?.options())
    }
}

/// One measurement: `n` copies of a body at once through a fresh Envoy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measurement {
    /// Answers by status (0: none).
    pub statuses: BTreeMap<u16, usize>,
    /// RSS just before, bytes.
    pub rss_before: u64,
    /// Peak RSS while the requests ran, bytes.
    pub rss_peak: u64,
    /// RSS once they were answered, bytes.
    pub rss_after: u64,
    /// Wasm linear memories before and after.
    pub wasm_before: WasmMemories,
    /// See `wasm_before`.
    pub wasm_after: WasmMemories,
    /// Until the last answer.
    pub elapsed: Duration,
}

impl Measurement {
    /// Peak RSS above the level before, bytes.
    pub fn peak_delta(&self) -> u64 {
        self.rss_peak.saturating_sub(self.rss_before)
    }

    fn statuses_text(&self) -> String {
        self.statuses
            .iter()
            .map(|(s, n)| {
                let s = if *s == 0 {
                    "none".to_string()
                } else {
                    s.to_string()
                };
                if *n == 1 {
                    s
                } else {
                    format!("{n}×{s}")
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Runs every flavour × body, once alone and `parallel` at once; renders the table.
pub async fn run(opts: &MemoryOptions) -> Result<String> {
    let mut out = format!(
        "memory one request can cause in Envoy, body limit {} MiB (peak RSS above the level \
         before, a fresh Envoy with 2 workers per measurement)\n",
        BODY_LIMIT >> 20
    );
    for &flavor in &opts.flavors {
        let _ = writeln!(out, "\n{flavor} flavour:");
        let _ = writeln!(
            out,
            "  {:<26} {:>8}  {:>12}  {:>9}  {:>18}  {:>13}  wasm memory grown (1 / {})",
            "body",
            "size",
            "1: status",
            "peak Δ",
            format!("{}: statuses", opts.parallel),
            "peak Δ / req",
            opts.parallel
        );
        for body in WorstBody::ALL {
            let bytes = Arc::new(body.build(DEFAULT_MODEL));
            let one = measure(flavor, bytes.clone(), 1).await?;
            let many = measure(flavor, bytes.clone(), opts.parallel).await?;
            let grown = |m: &Measurement| {
                if m.wasm_after.count == 0 {
                    "-".to_string()
                } else {
                    mb(m.wasm_after
                        .size_bytes
                        .saturating_sub(m.wasm_before.size_bytes) as f64)
                }
            };
            let line = format!(
                "  {:<26} {:>8}  {:>12}  {:>9}  {:>18}  {:>13}  {} / {}",
                body.name(),
                mb(bytes.len() as f64),
                one.statuses_text(),
                mb(one.peak_delta() as f64),
                many.statuses_text(),
                mb(many.peak_delta() as f64 / opts.parallel as f64),
                grown(&one),
                grown(&many)
            );
            eprintln!("{flavor}: {line}");
            out.push_str(&line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// Sends `n` copies of `body` at once through a fresh stack of `flavor`.
pub async fn measure(flavor: Flavor, body: Arc<Vec<u8>>, n: usize) -> Result<Measurement> {
    let mut opts = StackOptions::new(
        flavor,
        Backends::Simulator {
            replicas: 2,
            args: vec!["--time-scale".into(), "10".into()],
        },
    );
    opts.envoy = EnvoyOptions {
        concurrency: 2,
        ..EnvoyOptions::default()
    };
    let stack = Stack::start(opts).await?;
    let pid = stack.envoy().pid().context("Envoy has no pid")?;
    let url = format!("{}/v1/chat/completions", stack.picker_url());
    let plain = serde_json::json!({
        "model": DEFAULT_MODEL,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": "warm up"}],
    });
    super::wait_serving(&stack).await?;
    for _ in 0..20 {
        let r = client::post_json(&url, &plain, &[]).await?;
        if r.status != 200 {
            bail!("{flavor}: a warm-up request was answered {}", r.status);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    procmem::reset_peak(pid)?;
    let rss_before = procmem::rss_bytes(pid)?;
    let wasm_before = procmem::wasm_memories(pid).unwrap_or_default();
    let listener = stack.envoy().listener();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let body = body.clone();
        tasks.spawn(async move {
            hostile::exchange(
                listener,
                "/v1/chat/completions",
                b"",
                &body,
                REQUEST_TIMEOUT,
            )
            .await
        });
    }
    let mut statuses = BTreeMap::new();
    while let Some(j) = tasks.join_next().await {
        *statuses.entry(j?.status).or_insert(0) += 1;
    }
    let elapsed = start.elapsed();
    let m = Measurement {
        statuses,
        rss_before,
        rss_peak: procmem::peak_rss_bytes(pid)?,
        rss_after: procmem::rss_bytes(pid)?,
        wasm_before,
        wasm_after: procmem::wasm_memories(pid).unwrap_or_default(),
        elapsed,
    };
    drop(stack);
    Ok(m)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn worst_bodies_fit_the_limit_and_say_what_they_are() {
        for b in WorstBody::ALL {
            let body = b.build("sim-model");
            assert!(body.len() <= BODY_LIMIT, "{b:?}: {}", body.len());
            assert!(body.len() > BODY_LIMIT * 3 / 4, "{b:?}: {}", body.len());
        }
        let many: serde_json::Value =
            serde_json::from_slice(&WorstBody::ManyMessages.build("m")).unwrap();
        assert_eq!(many["messages"].as_array().unwrap().len(), 100_000);
        let floats: serde_json::Value =
            serde_json::from_slice(&WorstBody::FloatTools.build("m")).unwrap();
        assert!(floats["tools"].as_array().unwrap().len() > 600_000);
        let members = WorstBody::ObjectMembers.build("m");
        assert!(serde_json::from_slice::<serde_json::Value>(&members).is_ok());
        assert!(members.windows(6).filter(|w| w == b"\"k\":0,").count() > 600_000);
        let m = MemoryOptions::parse(&["--parallel".into(), "4".into()]).unwrap();
        assert_eq!(m.parallel, 4);
        assert!(MemoryOptions::parse(&["--parallel".into(), "0".into()]).is_err());
        let meas = Measurement {
            statuses: [(200, 1), (400, 7)].into_iter().collect(),
            rss_before: 10,
            rss_peak: 25,
            ..Measurement::default()
        };
        assert_eq!(meas.peak_delta(), 15);
        assert_eq!(meas.statuses_text(), "200 7×400");
    }
}
