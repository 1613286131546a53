//! Tenants: the platform's `TenantQuota` objects, compiled for the auth and quota stages.
//!
//! The configuration is a list of JSON values, the users' YAML objects as they wrote them
//! (a directory or a multi-document file is one list; `null` items, empty YAML documents,
//! are skipped):
//!
//! - `TenantQuota` (`mini-platform.local/v1alpha1`): identity (`apiKeyHashes`,
//!   `jwtClaims {issuer, tenantClaim, tenantValue}`), headers to inject (`fairnessId`,
//!   `objective`), per-model `limits` (`rpm`, `tpm`, `concurrency`,
//!   `maxCompletionTokensDefault`; model `"*"` is the fallback) and `accounting`.
//! - `InferenceObjective` (`llm-d.ai/v1alpha2`): objective name → `spec.priority`
//!   (absent: 0); `spec.poolRef` is accepted and kept.
//!
//! Every field is either implemented or refused: a field the gateway does not implement is
//! an error naming it (`TenantQuota tenant-a: spec.limits[1].burst: not supported`), never
//! ignored. `metadata` may hold any Kubernetes `ObjectMeta` key (only `name` is read);
//! `status` is ignored. Across the list, a key hash, a JWT claim rule, a tenant name, an
//! objective name and, within a tenant, a model may each appear once; when any
//! `InferenceObjective` is given, every `inject.objective` must name one of them (with none
//! given, every objective has priority 0).
//!
//! `accounting` takes only what the gateway implements: `preDebit: input_plus_max_output`,
//! `settleOn: usage_or_chunk_count | usage`, `streamDisconnect: bill_generated`; absent
//! fields take those defaults (the first of each).
//!
//! API keys are never kept: [`Tenants::by_api_key`] hashes the presented key and looks the
//! digest up.

mod error;
mod parse;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use error::TenantsError;
use parse::{Object, ObjectiveObject, TenantObject};
pub use parse::{OBJECTIVE_API_VERSION, TENANT_QUOTA_API_VERSION};

/// The model name of the fallback limit.
pub const FALLBACK_MODEL: &str = "*";

/// A tenant, by its position in [`Tenants`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TenantId(pub u32);

/// One tenant, compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// `metadata.name`.
    pub name: String,
    /// `spec.inject.fairnessId`: the `x-llm-d-inference-fairness-id` to set.
    pub fairness_id: Option<String>,
    /// `spec.inject.objective`: the `x-llm-d-inference-objective` to set.
    pub objective: Option<String>,
    /// The objective's priority (0 without an objective or when it is unknown).
    pub priority: i32,
    /// `spec.limits`, in the order given (the index is part of the bucket key).
    pub limits: Vec<ModelLimit>,
    /// `spec.accounting`.
    pub accounting: Accounting,
}

/// One `spec.limits[]` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelLimit {
    /// The request body's `model` before any rewrite; `"*"` = fallback.
    pub model: String,
    /// rpm, tpm, concurrency.
    pub limits: scheduler_core::quota::Limits,
    /// The output tokens pre-debited when a request gives no `max_completion_tokens` /
    /// `max_tokens`.
    pub max_completion_tokens_default: Option<u64>,
    /// `<tenant>/<model>`: the bucket's shared-data key and stat tag.
    pub bucket_key: String,
}

/// How the pre-debit is computed (`spec.accounting.preDebit`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PreDebit {
    /// `input_plus_max_output`: prompt estimate + min(max output asked or the default, cap).
    #[default]
    InputPlusMaxOutput,
}

/// What a request is charged at its end (`spec.accounting.settleOn`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SettleOn {
    /// `usage_or_chunk_count`: the engine's usage; without any, the prompt estimate plus
    /// the content chunks forwarded.
    #[default]
    UsageOrChunkCount,
    /// `usage`: the engine's usage only; without any, the pre-debit stands.
    Usage,
}

/// What a stream cut off mid-way is charged (`spec.accounting.streamDisconnect`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamDisconnect {
    /// `bill_generated`: what the engine generated up to the last chunk seen.
    #[default]
    BillGenerated,
}

/// `spec.accounting`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// `preDebit`.
    pub pre_debit: PreDebit,
    /// `settleOn`.
    pub settle_on: SettleOn,
    /// `streamDisconnect`.
    pub stream_disconnect: StreamDisconnect,
}

/// `spec.identity.jwtClaims` of one tenant: a verified token whose issuer is `issuer` and
/// whose claim `claim` holds `value` belongs to `tenant`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtRule {
    /// The token's `iss`.
    pub issuer: String,
    /// The claim's name (`tenantClaim`).
    pub claim: String,
    /// The claim's value (`tenantValue`).
    pub value: String,
    /// The tenant it maps to.
    pub tenant: TenantId,
}

/// One `InferenceObjective`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Objective {
    /// `metadata.name`: the value of `x-llm-d-inference-objective`.
    pub name: String,
    /// `spec.priority`.
    pub priority: i32,
    /// `spec.poolRef.name`.
    pub pool: Option<String>,
}

/// Every tenant and objective, compiled for lookups.
#[derive(Clone, Debug, Default)]
pub struct Tenants {
    tenants: Vec<Tenant>,
    by_digest: HashMap<[u8; 32], TenantId>,
    jwt_rules: Vec<JwtRule>,
    objectives: Vec<Objective>,
    priority_of: HashMap<String, i32>,
    global_quotas: bool,
}

impl Tenants {
    /// Compiles the objects (see the module doc for what is accepted).
    pub fn from_objects(objects: &[Value]) -> Result<Tenants, TenantsError> {
        let mut tenant_objects: Vec<TenantObject> = Vec::new();
        let mut objective_objects: Vec<ObjectiveObject> = Vec::new();
        for (index, value) in objects.iter().enumerate() {
            match parse::parse_object(index, value)? {
                None => {}
                Some(Object::Tenant(t)) => tenant_objects.push(t),
                Some(Object::Objective(o)) => objective_objects.push(o),
            }
        }
        let mut out = Tenants::default();
        for o in objective_objects {
            if out.priority_of.insert(o.name.clone(), o.priority).is_some() {
                // The header carries the name only: two namespaces' objectives of one name
                // would be indistinguishable.
                return Err(TenantsError::Duplicate {
                    first: format!("an earlier {}", o.label),
                    object: o.label,
                    path: "metadata.name".into(),
                    value: o.name,
                });
            }
            out.objectives.push(Objective {
                name: o.name,
                priority: o.priority,
                pool: o.pool,
            });
        }
        let mut digest_at: HashMap<[u8; 32], String> = HashMap::new();
        for t in tenant_objects {
            out.add_tenant(t, &mut digest_at)?;
        }
        Ok(out)
    }

    fn add_tenant(
        &mut self,
        t: TenantObject,
        digest_at: &mut HashMap<[u8; 32], String>,
    ) -> Result<(), TenantsError> {
        if let Some(first) = self.tenants.iter().find(|x| x.name == t.name) {
            return Err(TenantsError::Duplicate {
                object: t.label,
                path: "metadata.name".into(),
                value: first.name.clone(),
                first: format!("TenantQuota {}", first.name),
            });
        }
        let id = TenantId(u32::try_from(self.tenants.len()).unwrap_or(u32::MAX));
        let priority = match &t.objective {
            None => 0,
            Some(name) => match self.priority_of.get(name) {
                Some(p) => *p,
                None if self.objectives.is_empty() => 0,
                None => {
                    return Err(TenantsError::UnknownObjective {
                        object: t.label,
                        path: "spec.inject.objective".into(),
                        objective: name.clone(),
                    })
                }
            },
        };
        for key in &t.key_hashes {
            let here = format!("{} {}", t.label, key.path);
            if let Some(first) = digest_at.get(&key.digest) {
                return Err(TenantsError::Duplicate {
                    object: t.label.clone(),
                    path: key.path.clone(),
                    value: hex(&key.digest),
                    first: first.clone(),
                });
            }
            digest_at.insert(key.digest, here);
            self.by_digest.insert(key.digest, id);
        }
        if let Some(jwt) = t.jwt {
            let same = |r: &&JwtRule| {
                r.issuer == jwt.issuer && r.claim == jwt.claim && r.value == jwt.value
            };
            if let Some(first) = self.jwt_rules.iter().find(same) {
                let first_name = self.tenant(first.tenant).map_or("", |x| x.name.as_str());
                return Err(TenantsError::Duplicate {
                    object: t.label,
                    path: "spec.identity.jwtClaims".into(),
                    value: format!("{} {}={}", jwt.issuer, jwt.claim, jwt.value),
                    first: format!("TenantQuota {first_name}"),
                });
            }
            self.jwt_rules.push(JwtRule {
                issuer: jwt.issuer,
                claim: jwt.claim,
                value: jwt.value,
                tenant: id,
            });
        }
        self.tenants.push(Tenant {
            name: t.name,
            fairness_id: t.fairness_id,
            objective: t.objective,
            priority,
            limits: t.limits,
            accounting: t.accounting,
        });
        Ok(())
    }

    /// Whether the requests-per-minute and tokens-per-minute limits are kept by a global
    /// rate-limit service shared by every gateway replica (Envoy's `ratelimit` filter)
    /// rather than in this process (see `stages::quota`). Concurrency is always local.
    pub fn global_quotas(&self) -> bool {
        self.global_quotas
    }

    /// Keep the per-minute limits in the global rate-limit service (or not).
    pub fn set_global_quotas(&mut self, global: bool) {
        self.global_quotas = global;
    }

    /// No tenants configured: the gateway runs without auth and quotas.
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenant whose `apiKeyHashes` holds sha256(`key`).
    pub fn by_api_key(&self, key: &str) -> Option<TenantId> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_digest.get(&digest).copied()
    }

    /// Every `jwtClaims` rule, in tenant order.
    pub fn jwt_rules(&self) -> &[JwtRule] {
        &self.jwt_rules
    }

    /// The tenant of a verified JWT payload (as `jwt_authn` writes it into dynamic
    /// metadata): the first rule whose issuer is the payload's `iss` and whose claim (a
    /// top-level key) is the rule's value, or a list holding it.
    pub fn by_jwt_payload(&self, payload: &Map<String, Value>) -> Option<TenantId> {
        let issuer = payload.get("iss")?.as_str()?;
        self.jwt_rules
            .iter()
            .filter(|r| r.issuer == issuer)
            .find(|r| match payload.get(&r.claim) {
                Some(Value::String(s)) => *s == r.value,
                Some(Value::Array(items)) => items.iter().any(|v| v.as_str() == Some(&r.value)),
                _ => false,
            })
            .map(|r| r.tenant)
    }

    /// The tenant with this id; `None` only for an id not made by this `Tenants`.
    pub fn tenant(&self, id: TenantId) -> Option<&Tenant> {
        self.tenants.get(usize::try_from(id.0).ok()?)
    }

    /// The limit for `model` (the request's model as sent): exact match first, else `"*"`;
    /// with its index in the tenant's limits.
    pub fn limit_for(&self, id: TenantId, model: &str) -> Option<(usize, &ModelLimit)> {
        let limits = &self.tenant(id)?.limits;
        // Tenants list a handful of models: a scan beats hashing the name.
        let exact = limits.iter().enumerate().find(|(_, l)| l.model == model);
        exact.or_else(|| {
            limits
                .iter()
                .enumerate()
                .find(|(_, l)| l.model == FALLBACK_MODEL)
        })
    }

    /// `<tenant>/<model>` of a limit: the key of its bucket in shared data and its stat tag.
    pub fn bucket_key(&self, id: TenantId, limit_index: usize) -> Option<&str> {
        let limit = self.tenant(id)?.limits.get(limit_index)?;
        Some(&limit.bucket_key)
    }

    /// The priority of an objective; 0 when unknown.
    pub fn priority_of(&self, objective: &str) -> i32 {
        self.priority_of.get(objective).copied().unwrap_or(0)
    }

    /// Every `InferenceObjective` given, in order.
    pub fn objectives(&self) -> &[Objective] {
        &self.objectives
    }

    /// Every tenant's name, in id order.
    pub fn tenant_names(&self) -> Vec<&str> {
        self.tenants.iter().map(|t| t.name.as_str()).collect()
    }

    /// Every tenant with its id.
    pub fn iter(&self) -> impl Iterator<Item = (TenantId, &Tenant)> {
        self.tenants
            .iter()
            .enumerate()
            .map(|(i, t)| (TenantId(u32::try_from(i).unwrap_or(u32::MAX)), t))
    }
}

/// Lower-case sha256 hex digest of `bytes`: what `apiKeyHashes` holds for a key
/// (`printf %s KEY | sha256sum`).
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes).into())
}

fn hex(digest: &[u8; 32]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(64);
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(out, "{byte:02x}");
    }
    out
}
