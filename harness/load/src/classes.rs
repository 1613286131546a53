//! Load classes: several tenants' traffic at once against one base URL, each with its own
//! workload, concurrency, headers (its credentials) and optional mid-stream abort, each
//! reported on its own.
//!
//! Two presets make the tenant demo: [`LoadClass::short_chats`] (interactive multi-turn
//! chats at moderate concurrency) and [`LoadClass::long_batch`] (single long prompts at
//! high concurrency: a nightly batch of 30k-token prompts, scaled to what a 2-core machine
//! runs in a minute). A class is also written as one `key=value,…` string
//! ([`LoadClass::parse`]) for the command line.

use std::time::Duration;

use hyper::header::{HeaderName, HeaderValue};
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use super::client::{ChatExtras, RequestRecord};
use super::runner::{run_plan, Plan};
use super::summary::Summary;
use super::workload::Workload;
use super::{Assign, Connections};

/// One tenant's traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadClass {
    /// Name in the report (the tenant label).
    pub name: String,
    /// What the class sends.
    pub workload: Workload,
    /// Requests in flight at most.
    pub concurrency: u32,
    /// Requests started per second (Poisson); `None` = as fast as concurrency allows.
    pub rate: Option<f64>,
    /// Headers added to every request, e.g. `("authorization", "Bearer KEY")`.
    pub headers: Vec<(String, String)>,
    /// Drop each stream once this many content chunks arrived (a client that goes away).
    pub abort_after: Option<u32>,
}

/// Prompt tokens of the batch preset: the seed's 30k-token prompts scaled by 1/10.
pub const LONG_BATCH_PROMPT_TOKENS: u32 = 3000;

impl LoadClass {
    /// Tenant A's traffic: 16 conversations of 4 turns (200-token system prompts, 32-token
    /// questions, 64-token answers) with 4 requests in flight.
    pub fn short_chats(name: &str) -> Self {
        Self {
            name: name.to_string(),
            workload: Workload {
                conversations: 16,
                turns: 4,
                system_tokens: 200,
                user_tokens: 32,
                max_tokens: 64,
                ..Workload::default()
            },
            concurrency: 4,
            rate: None,
            headers: Vec::new(),
            abort_after: None,
        }
    }

    /// Tenant B's batch: 64 single requests of `prompt_tokens`-token prompts (see
    /// [`LONG_BATCH_PROMPT_TOKENS`]) and 32-token answers, 32 in flight.
    pub fn long_batch(name: &str, prompt_tokens: u32) -> Self {
        Self {
            name: name.to_string(),
            workload: Workload {
                conversations: 64,
                turns: 1,
                system_tokens: prompt_tokens,
                user_tokens: 16,
                max_tokens: 32,
                ..Workload::default()
            },
            concurrency: 32,
            rate: None,
            headers: Vec::new(),
            abort_after: None,
        }
    }

    /// Adds `Authorization: Bearer KEY`.
    pub fn bearer(self, key: &str) -> Self {
        self.header("authorization", &format!("Bearer {key}"))
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Parses `name=A,preset=chat|batch,…`: keys `name`, `preset` (first, before the
    /// fields it presets), `model`, `conversations`, `turns`, `system_tokens`
    /// (`prompt_tokens` is the same), `user_tokens`, `max_tokens`, `concurrency`, `rate`,
    /// `seed`, `ignore_eos`, `include_usage`, `continuous_usage`, `abort_after`, `api_key` (a bearer header),
    /// `header` (`Name: value`, repeatable). Values cannot contain commas.
    pub fn parse(spec: &str) -> anyhow::Result<Self> {
        let pairs: Vec<(&str, &str)> = spec
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.split_once('=')
                    .map(|(k, v)| (k.trim(), v.trim()))
                    .ok_or_else(|| anyhow::anyhow!("class field without `=`: {p}"))
            })
            .collect::<anyhow::Result<_>>()?;
        let name = pairs
            .iter()
            .find(|(k, _)| *k == "name")
            .map(|(_, v)| v.to_string())
            .ok_or_else(|| anyhow::anyhow!("class without name: {spec}"))?;
        let mut c = match pairs.iter().find(|(k, _)| *k == "preset").map(|(_, v)| *v) {
            None | Some("chat") => Self::short_chats(&name),
            Some("batch") => Self::long_batch(&name, LONG_BATCH_PROMPT_TOKENS),
            Some(other) => anyhow::bail!("preset must be chat or batch: {other}"),
        };
        for (k, v) in pairs {
            let num = || -> anyhow::Result<u32> {
                v.parse()
                    .map_err(|_| anyhow::anyhow!("class field {k}: not a count: {v}"))
            };
            let flag = || -> anyhow::Result<bool> {
                v.parse()
                    .map_err(|_| anyhow::anyhow!("class field {k}: not true/false: {v}"))
            };
            let w = &mut c.workload;
            match k {
                "name" | "preset" => {}
                "model" => w.model = v.to_string(),
                "conversations" => w.conversations = num()?,
                "turns" => w.turns = num()?,
                "system_tokens" | "prompt_tokens" => w.system_tokens = num()?,
                "user_tokens" => w.user_tokens = num()?,
                "max_tokens" => w.max_tokens = num()?,
                "seed" => w.seed = u64::from(num()?),
                "ignore_eos" => w.ignore_eos = flag()?,
                "include_usage" => w.include_usage = flag()?,
                "continuous_usage" => w.continuous_usage = flag()?,
                "concurrency" => c.concurrency = num()?,
                "abort_after" => c.abort_after = Some(num()?),
                "rate" => {
                    c.rate = Some(
                        v.parse()
                            .map_err(|_| anyhow::anyhow!("class field rate: {v}"))?,
                    )
                }
                "api_key" => c = c.bearer(v),
                "header" => {
                    let (n, val) = v
                        .split_once(':')
                        .ok_or_else(|| anyhow::anyhow!("header must be `Name: value`: {v}"))?;
                    c = c.header(n.trim(), val.trim());
                }
                _ => anyhow::bail!("unknown class field {k}"),
            }
        }
        Ok(c)
    }

    fn extras(&self) -> anyhow::Result<ChatExtras> {
        let headers = self
            .headers
            .iter()
            .map(|(n, v)| {
                Ok((
                    HeaderName::from_bytes(n.as_bytes())
                        .map_err(|e| anyhow::anyhow!("header name {n}: {e}"))?,
                    HeaderValue::from_str(v).map_err(|e| anyhow::anyhow!("header {n}: {e}"))?,
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(ChatExtras {
            headers,
            abort_after: self.abort_after,
        })
    }
}

/// The demo's two tenants: A's short chats with `key_a`, B's long batch with `key_b`.
pub fn tenant_demo(key_a: &str, key_b: &str) -> Vec<LoadClass> {
    vec![
        LoadClass::short_chats("tenant-a").bearer(key_a),
        LoadClass::long_batch("tenant-b", LONG_BATCH_PROMPT_TOKENS).bearer(key_b),
    ]
}

/// Classes run at once against one base URL.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassRun {
    /// The base URL every class sends to (`<url>/v1/chat/completions`).
    pub url: String,
    /// The classes.
    pub classes: Vec<LoadClass>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Progress lines on stderr.
    pub progress: bool,
}

/// What one class got.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    /// The class name.
    pub name: String,
    /// Figures (labelled with the class name).
    pub summary: Summary,
    /// Every request, in completion order.
    pub records: Vec<RequestRecord>,
}

/// Runs every class at once until each has sent its whole workload. Each class's text is
/// its own (salted by its name), so one class never warms another's cache.
pub async fn run_classes(run: &ClassRun) -> anyhow::Result<Vec<ClassReport>> {
    let mut tasks = Vec::new();
    for class in &run.classes {
        let plan = Plan {
            label: class.name.clone(),
            workload: class.workload.clone(),
            urls: vec![run.url.clone()],
            assign: Assign::RoundRobin,
            connections: Connections::KeepAlive,
            concurrency: class.concurrency,
            rate: class.rate,
            api_keys: Vec::new(),
            extras: class.extras()?,
            timeout: run.timeout,
            progress: run.progress,
            salt: xxh3_64(class.name.as_bytes()),
        };
        tasks.push(tokio::spawn(async move { run_plan(&plan).await }));
    }
    let mut out = Vec::new();
    for (task, class) in tasks.into_iter().zip(&run.classes) {
        let report = task.await??;
        out.push(ClassReport {
            name: class.name.clone(),
            summary: report.summary,
            records: report.records,
        });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn parse_presets_and_fields() {
        let a = LoadClass::parse("name=a,api_key=ka,concurrency=2,turns=3").unwrap();
        assert_eq!(a.name, "a");
        assert_eq!(a.concurrency, 2);
        assert_eq!(a.workload.turns, 3);
        assert_eq!(a.workload.system_tokens, 200, "chat preset");
        assert_eq!(
            a.headers,
            vec![("authorization".to_string(), "Bearer ka".to_string())]
        );
        let b = LoadClass::parse(
            "preset=batch,name=b,prompt_tokens=500,header=x-tenant: b,abort_after=3,include_usage=false,rate=2.5",
        )
        .unwrap();
        assert_eq!(b.workload.turns, 1);
        assert_eq!(b.workload.system_tokens, 500);
        assert_eq!(b.concurrency, 32);
        assert_eq!(b.abort_after, Some(3));
        assert!(!b.workload.include_usage);
        assert_eq!(b.rate, Some(2.5));
        assert_eq!(b.headers, vec![("x-tenant".to_string(), "b".to_string())]);
        for bad in [
            "concurrency=2",
            "name=a,bogus=1",
            "name=a,turns=x",
            "name=a,preset=other",
            "name=a,header=nocolon",
            "name=a,turns",
        ] {
            assert!(LoadClass::parse(bad).is_err(), "{bad}");
        }
        assert!(LoadClass::short_chats("x")
            .header("bad name", "v")
            .extras()
            .is_err());
    }

    #[test]
    fn demo_pair() {
        let d = tenant_demo("ka", "kb");
        assert_eq!(d.len(), 2);
        assert!(d[1].concurrency > d[0].concurrency);
        assert!(d[1].workload.system_tokens > 10 * d[0].workload.system_tokens);
        assert_eq!(d[1].headers[0].1, "Bearer kb");
    }
}
