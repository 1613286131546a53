//! The limits the service enforces, derived from the platform's `TenantQuota` objects: one
//! limitador [`Limit`] per tenant × model entry and counter (`rpm`, `tpm`), each a fixed
//! window of one minute.
//!
//! The gateway names the bucket set it admitted against in the descriptor entry
//! [`BUCKET_KEY`] (`tenant/model`, the same key the in-process quota stage uses, so the
//! `"*"` fallback is resolved once, in the gateway) and the counter in [`LIMIT_KEY`]. A
//! limit applies to a descriptor whose entries carry exactly its bucket and counter; the
//! `concurrency` limit is not a rate and stays in each gateway process.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use infergate_filters::tenants::Tenants;
use limitador::limit::{Limit, Predicate};
use serde::Deserialize;
use serde_json::Value as Json;

/// Descriptor entry naming the bucket set: `tenant/model` as the gateway keys it.
pub const BUCKET_KEY: &str = "infergate_bucket";
/// Descriptor entry naming the counter: [`Counter::Rpm`] or [`Counter::Tpm`].
pub const LIMIT_KEY: &str = "infergate_limit";
/// Descriptor entry carrying the reservation a stream-end settlement commits.
pub const RESERVATION_KEY: &str = "infergate_reservation";
/// The window of every limit: the quotas are per minute.
pub const WINDOW_SECONDS: u64 = 60;

/// Which counter of a bucket set a descriptor addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counter {
    /// Requests per minute.
    Rpm,
    /// Tokens (prompt + completion) per minute.
    Tpm,
}

impl Counter {
    /// The descriptor value naming this counter.
    pub fn as_str(self) -> &'static str {
        match self {
            Counter::Rpm => "rpm",
            Counter::Tpm => "tpm",
        }
    }

    /// The counter a descriptor value names.
    pub fn parse(value: &str) -> Option<Counter> {
        match value {
            "rpm" => Some(Counter::Rpm),
            "tpm" => Some(Counter::Tpm),
            _ => None,
        }
    }
}

/// The per-minute limits of one bucket set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BucketLimits {
    /// Requests per minute, if limited.
    pub rpm: Option<u64>,
    /// Tokens per minute, if limited.
    pub tpm: Option<u64>,
}

/// Every bucket set's limits, by bucket key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitTable {
    buckets: HashMap<String, BucketLimits>,
}

impl LimitTable {
    /// The limits of the tenants compiled from the platform's objects (`TenantQuota` and
    /// the `InferenceObjective` objects they name), exactly as the gateway compiles them.
    pub fn from_objects(objects: &[Json]) -> Result<LimitTable> {
        let tenants = Tenants::from_objects(objects).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut buckets = HashMap::new();
        for (_, tenant) in tenants.iter() {
            for limit in &tenant.limits {
                buckets.insert(
                    limit.bucket_key.clone(),
                    BucketLimits {
                        rpm: limit.limits.rpm,
                        tpm: limit.limits.tpm,
                    },
                );
            }
        }
        Ok(LimitTable { buckets })
    }

    /// The limits of `bucket`, if it is one.
    pub fn get(&self, bucket: &str) -> Option<BucketLimits> {
        self.buckets.get(bucket).copied()
    }

    /// How many bucket sets there are.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether there is no bucket set.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// The limitador limits in `namespace` (the rate-limit domain): one per bucket set and
    /// limited counter.
    pub fn limitador_limits(&self, namespace: &str) -> Result<Vec<Limit>> {
        let mut out = Vec::new();
        let mut keys: Vec<&String> = self.buckets.keys().collect();
        keys.sort();
        for bucket in keys {
            let limits = self.buckets[bucket];
            for (counter, max) in [(Counter::Rpm, limits.rpm), (Counter::Tpm, limits.tpm)] {
                let Some(max) = max else { continue };
                let conditions = [
                    predicate(BUCKET_KEY, bucket)?,
                    predicate(LIMIT_KEY, counter.as_str())?,
                ];
                let mut limit = Limit::new(
                    namespace,
                    max,
                    WINDOW_SECONDS,
                    conditions,
                    Vec::<limitador::limit::Expression>::new(),
                );
                limit.set_name(format!("{bucket} {}", counter.as_str()));
                out.push(limit);
            }
        }
        Ok(out)
    }
}

/// `descriptors[0].<key> == "<value>"`, the value as a CEL string literal.
fn predicate(key: &str, value: &str) -> Result<Predicate> {
    let mut literal = String::with_capacity(value.len() + 2);
    literal.push('"');
    for c in value.chars() {
        match c {
            '"' => literal.push_str("\\\""),
            '\\' => literal.push_str("\\\\"),
            c if c.is_control() => bail!("bucket {value:?} holds a control character"),
            c => literal.push(c),
        }
    }
    literal.push('"');
    let source = format!("descriptors[0].{key} == {literal}");
    Predicate::parse(source.clone()).map_err(|e| anyhow::anyhow!("limit condition {source}: {e}"))
}

/// The objects at `path`: a directory (every `*.yaml`, `*.yml` and `*.json` file in it, in
/// name order) or one file, each holding one or more YAML documents. Errors name the file.
pub fn load_objects(path: &Path) -> Result<Vec<Json>> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        for entry in
            std::fs::read_dir(path).with_context(|| format!("listing {}", path.display()))?
        {
            let file = entry
                .with_context(|| format!("listing {}", path.display()))?
                .path();
            let object_file = matches!(
                file.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            );
            if object_file && file.is_file() {
                files.push(file);
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        for (i, document) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
            let value = Json::deserialize(document)
                .with_context(|| format!("{} document {}", file.display(), i + 1))?;
            match value {
                Json::Null => {}
                Json::Object(_) => {
                    if !objects.contains(&value) {
                        objects.push(value);
                    }
                }
                _ => bail!("{} document {} is not a mapping", file.display(), i + 1),
            }
        }
    }
    Ok(objects)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use limitador::limit::Context;

    fn objects() -> Vec<Json> {
        vec![serde_json::json!({
            "apiVersion": "mini-platform.local/v1alpha1",
            "kind": "TenantQuota",
            "metadata": {"name": "tenant-a"},
            "spec": {
                "identity": {"apiKeyHashes": [infergate_filters::tenants::sha256_hex(b"k")]},
                "limits": [
                    {"model": "m\"1", "rpm": 5, "tpm": 100},
                    {"model": "*", "tpm": 7}
                ]
            }
        })]
    }

    fn context(bucket: &str, counter: &str) -> Context<'static> {
        let mut ctx = Context::default();
        ctx.list_binding(
            "descriptors".into(),
            vec![HashMap::from([
                (BUCKET_KEY.to_owned(), bucket.to_owned()),
                (LIMIT_KEY.to_owned(), counter.to_owned()),
            ])],
        );
        ctx
    }

    #[test]
    fn each_bucket_and_counter_is_one_limit_applying_to_its_own_descriptor_only() {
        let table = LimitTable::from_objects(&objects()).unwrap();
        assert_eq!(
            table.get("tenant-a/m\"1"),
            Some(BucketLimits {
                rpm: Some(5),
                tpm: Some(100)
            })
        );
        let limits = table.limitador_limits("infergate").unwrap();
        // rpm + tpm for the first entry, tpm only for "*".
        assert_eq!(limits.len(), 3);
        let applying = |bucket: &str, counter: &str| -> Vec<u64> {
            let ctx = context(bucket, counter);
            limits
                .iter()
                .filter(|l| l.applies(&ctx))
                .map(Limit::max_value)
                .collect()
        };
        assert_eq!(applying("tenant-a/m\"1", "tpm"), [100]);
        assert_eq!(applying("tenant-a/m\"1", "rpm"), [5]);
        assert_eq!(applying("tenant-a/*", "tpm"), [7]);
        assert!(applying("tenant-a/*", "rpm").is_empty());
        assert!(applying("tenant-b/m\"1", "tpm").is_empty());
    }

    #[test]
    fn bad_objects_are_refused_with_their_reason() {
        let mut bad = objects();
        bad[0]["spec"]["limits"][0]["rpm"] = serde_json::json!("many");
        let err = LimitTable::from_objects(&bad).unwrap_err().to_string();
        assert!(err.contains("rpm"), "{err}");
    }
}
