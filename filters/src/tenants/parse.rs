//! Reading one `TenantQuota` or `InferenceObjective` from its JSON form, field by field, so
//! that every field the gateway does not implement is an error naming its path.
//!
//! Each object is checked on its own here; what needs the whole list (duplicates across
//! tenants, objectives named by tenants) is checked by the caller.

use serde_json::{Map, Value};

use super::error::TenantsError;
use super::{Accounting, ModelLimit, PreDebit, SettleOn, StreamDisconnect};
use scheduler_core::quota::Limits;

/// The platform's own schema of tenant objects.
pub const TENANT_QUOTA_API_VERSION: &str = "mini-platform.local/v1alpha1";
/// llm-d's `InferenceObjective`.
pub const OBJECTIVE_API_VERSION: &str = "llm-d.ai/v1alpha2";

/// Kubernetes `ObjectMeta` fields: accepted anywhere in `metadata`, only `name` is read.
const OBJECT_META_KEYS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Top-level keys of either kind; `status` is written by controllers and ignored.
const TOP_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

/// One `spec.identity.apiKeyHashes` entry: the digest and where it was given.
#[derive(Clone, Debug)]
pub(super) struct KeyHash {
    pub digest: [u8; 32],
    pub path: String,
}

/// `spec.identity.jwtClaims`.
#[derive(Clone, Debug)]
pub(super) struct JwtClaims {
    pub issuer: String,
    pub claim: String,
    pub value: String,
}

/// A `TenantQuota`, checked on its own.
#[derive(Clone, Debug)]
pub(super) struct TenantObject {
    /// `TenantQuota <name>`, for errors.
    pub label: String,
    pub name: String,
    pub key_hashes: Vec<KeyHash>,
    pub jwt: Option<JwtClaims>,
    pub fairness_id: Option<String>,
    pub objective: Option<String>,
    pub limits: Vec<ModelLimit>,
    pub accounting: Accounting,
}

/// An `InferenceObjective`, checked on its own.
#[derive(Clone, Debug)]
pub(super) struct ObjectiveObject {
    /// `InferenceObjective <name>`, for errors.
    pub label: String,
    pub name: String,
    pub priority: i32,
    pub pool: Option<String>,
}

/// One item of the configuration list.
#[derive(Clone, Debug)]
pub(super) enum Object {
    Tenant(TenantObject),
    Objective(ObjectiveObject),
}

/// Reads item `index` of the list; `Ok(None)` for `null` (an empty YAML document, as a
/// trailing `---` gives).
pub(super) fn parse_object(index: usize, value: &Value) -> Result<Option<Object>, TenantsError> {
    let at = format!("objects[{index}]");
    if value.is_null() {
        return Ok(None);
    }
    let Some(map) = value.as_object() else {
        return Err(TenantsError::NotAnObject { object: at });
    };
    let api_version = map.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = map.get("kind").and_then(Value::as_str).unwrap_or("");
    let expected_version = match kind {
        "TenantQuota" => TENANT_QUOTA_API_VERSION,
        "InferenceObjective" => OBJECTIVE_API_VERSION,
        _ => {
            return Err(TenantsError::WrongObject {
                object: at,
                path: "kind".into(),
                found: kind.into(),
            })
        }
    };
    let unnamed = format!("{kind} {at}");
    if api_version != expected_version {
        return Err(TenantsError::WrongObject {
            object: unnamed,
            path: "apiVersion".into(),
            found: api_version.into(),
        });
    }
    let name = object_name(&unnamed, map)?;
    let fields = Fields {
        object: format!("{kind} {name}"),
    };
    fields.only(map, "", TOP_KEYS)?;
    let spec = fields.required_map(map, "", "spec")?;
    Ok(Some(match kind {
        "TenantQuota" => Object::Tenant(tenant(fields, name, spec)?),
        _ => Object::Objective(objective(fields, name, spec)?),
    }))
}

/// `metadata.name`, checked against the other `metadata` keys.
fn object_name(unnamed: &str, map: &Map<String, Value>) -> Result<String, TenantsError> {
    let fields = Fields {
        object: unnamed.into(),
    };
    let metadata = fields.required_map(map, "", "metadata")?;
    fields.only(metadata, "metadata", OBJECT_META_KEYS)?;
    let name = fields.required_string(metadata, "metadata", "name")?;
    // The name is the first half of every bucket key (`<tenant>/<model>`).
    if name.contains('/') {
        return Err(fields.bad_value("metadata.name", name, "a name without `/`"));
    }
    Ok(name.into())
}

fn tenant(
    fields: Fields,
    name: String,
    spec: &Map<String, Value>,
) -> Result<TenantObject, TenantsError> {
    fields.only(
        spec,
        "spec",
        &["identity", "inject", "limits", "accounting"],
    )?;
    let identity = fields.required_map(spec, "spec", "identity")?;
    fields.only(identity, "spec.identity", &["apiKeyHashes", "jwtClaims"])?;
    let mut key_hashes = Vec::new();
    if let Some(list) = fields.optional_array(identity, "spec.identity", "apiKeyHashes")? {
        for (i, item) in list.iter().enumerate() {
            let path = format!("spec.identity.apiKeyHashes[{i}]");
            let hex = fields.string(&path, item)?;
            let Some(digest) = parse_digest(hex) else {
                return Err(fields.bad_value(&path, hex, "a sha256 digest: 64 hex digits"));
            };
            key_hashes.push(KeyHash { digest, path });
        }
    }
    let jwt = match fields.optional_map(identity, "spec.identity", "jwtClaims")? {
        None => None,
        Some(claims) => {
            let at = "spec.identity.jwtClaims";
            fields.only(claims, at, &["issuer", "tenantClaim", "tenantValue"])?;
            Some(JwtClaims {
                issuer: fields.required_string(claims, at, "issuer")?.into(),
                claim: fields.required_string(claims, at, "tenantClaim")?.into(),
                value: fields.required_string(claims, at, "tenantValue")?.into(),
            })
        }
    };
    if key_hashes.is_empty() && jwt.is_none() {
        return Err(TenantsError::NoIdentity {
            object: fields.object,
            path: "spec.identity".into(),
        });
    }
    let (fairness_id, objective) = match fields.optional_map(spec, "spec", "inject")? {
        None => (None, None),
        Some(inject) => {
            fields.only(inject, "spec.inject", &["fairnessId", "objective"])?;
            (
                fields.optional_string(inject, "spec.inject", "fairnessId")?,
                fields.optional_string(inject, "spec.inject", "objective")?,
            )
        }
    };
    let mut limits: Vec<ModelLimit> = Vec::new();
    for (i, item) in fields
        .optional_array(spec, "spec", "limits")?
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let at = format!("spec.limits[{i}]");
        let limit = model_limit(&fields, &name, &at, item)?;
        if let Some(first) = limits.iter().position(|l| l.model == limit.model) {
            return Err(TenantsError::Duplicate {
                object: fields.object,
                path: format!("{at}.model"),
                value: limit.model,
                first: format!("spec.limits[{first}].model"),
            });
        }
        limits.push(limit);
    }
    let accounting = match fields.optional_map(spec, "spec", "accounting")? {
        None => Accounting::default(),
        Some(map) => accounting(&fields, map)?,
    };
    Ok(TenantObject {
        label: fields.object,
        name,
        key_hashes,
        jwt,
        fairness_id,
        objective,
        limits,
        accounting,
    })
}

fn model_limit(
    fields: &Fields,
    tenant: &str,
    at: &str,
    item: &Value,
) -> Result<ModelLimit, TenantsError> {
    let map = fields.map(at, item)?;
    fields.only(
        map,
        at,
        &[
            "model",
            "rpm",
            "tpm",
            "concurrency",
            "maxCompletionTokensDefault",
        ],
    )?;
    let model = fields.required_string(map, at, "model")?;
    Ok(ModelLimit {
        bucket_key: format!("{tenant}/{model}"),
        model: model.into(),
        limits: Limits {
            rpm: fields.optional_u64(map, at, "rpm")?,
            tpm: fields.optional_u64(map, at, "tpm")?,
            concurrency: fields.optional_u64(map, at, "concurrency")?,
        },
        max_completion_tokens_default: fields.optional_u64(
            map,
            at,
            "maxCompletionTokensDefault",
        )?,
    })
}

fn accounting(fields: &Fields, map: &Map<String, Value>) -> Result<Accounting, TenantsError> {
    let at = "spec.accounting";
    fields.only(map, at, &["preDebit", "settleOn", "streamDisconnect"])?;
    let mut out = Accounting::default();
    if let Some(value) = fields.optional_string(map, at, "preDebit")? {
        out.pre_debit = match value.as_str() {
            "input_plus_max_output" => PreDebit::InputPlusMaxOutput,
            _ => {
                return Err(fields.bad_value(
                    "spec.accounting.preDebit",
                    &value,
                    "`input_plus_max_output`",
                ))
            }
        };
    }
    if let Some(value) = fields.optional_string(map, at, "settleOn")? {
        out.settle_on = match value.as_str() {
            "usage_or_chunk_count" => SettleOn::UsageOrChunkCount,
            "usage" => SettleOn::Usage,
            _ => {
                return Err(fields.bad_value(
                    "spec.accounting.settleOn",
                    &value,
                    "`usage_or_chunk_count` or `usage`",
                ))
            }
        };
    }
    if let Some(value) = fields.optional_string(map, at, "streamDisconnect")? {
        out.stream_disconnect = match value.as_str() {
            "bill_generated" => StreamDisconnect::BillGenerated,
            _ => {
                return Err(fields.bad_value(
                    "spec.accounting.streamDisconnect",
                    &value,
                    "`bill_generated`",
                ))
            }
        };
    }
    Ok(out)
}

fn objective(
    fields: Fields,
    name: String,
    spec: &Map<String, Value>,
) -> Result<ObjectiveObject, TenantsError> {
    fields.only(spec, "spec", &["priority", "poolRef"])?;
    let priority = match spec.get("priority").filter(|v| !v.is_null()) {
        None => 0,
        Some(v) => v
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| fields.wrong_type("spec.priority", "a 32-bit integer"))?,
    };
    let pool = match fields.optional_map(spec, "spec", "poolRef")? {
        None => None,
        Some(pool_ref) => {
            fields.only(pool_ref, "spec.poolRef", &["group", "kind", "name"])?;
            let _ = fields.optional_string(pool_ref, "spec.poolRef", "group")?;
            let _ = fields.optional_string(pool_ref, "spec.poolRef", "kind")?;
            Some(
                fields
                    .required_string(pool_ref, "spec.poolRef", "name")?
                    .into(),
            )
        }
    };
    Ok(ObjectiveObject {
        label: fields.object,
        name,
        priority,
        pool,
    })
}

/// 64 hex digits (either case) → the 32 digest bytes.
fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let high = char::from(*pair.first()?).to_digit(16)?;
        let low = char::from(*pair.get(1)?).to_digit(16)?;
        *byte = u8::try_from(high * 16 + low).ok()?;
    }
    Some(out)
}

/// Typed access to one object's fields, with errors that name the object and the path.
/// A `null` value (a YAML key with nothing after it) counts as absent.
struct Fields {
    object: String,
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.into()
    } else {
        format!("{prefix}.{key}")
    }
}

impl Fields {
    /// Errors on the first key of `map` not in `allowed`.
    fn only(
        &self,
        map: &Map<String, Value>,
        prefix: &str,
        allowed: &[&str],
    ) -> Result<(), TenantsError> {
        match map.keys().find(|k| !allowed.contains(&k.as_str())) {
            None => Ok(()),
            Some(key) => Err(TenantsError::NotSupported {
                object: self.object.clone(),
                path: join(prefix, key),
            }),
        }
    }

    fn wrong_type(&self, path: &str, expected: &'static str) -> TenantsError {
        TenantsError::WrongType {
            object: self.object.clone(),
            path: path.into(),
            expected,
        }
    }

    fn bad_value(&self, path: &str, value: &str, expected: &str) -> TenantsError {
        TenantsError::BadValue {
            object: self.object.clone(),
            path: path.into(),
            value: value.into(),
            expected: expected.into(),
        }
    }

    fn get<'v>(map: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
        map.get(key).filter(|v| !v.is_null())
    }

    fn required<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v Value, TenantsError> {
        Self::get(map, key).ok_or_else(|| TenantsError::Required {
            object: self.object.clone(),
            path: join(prefix, key),
        })
    }

    fn map<'v>(
        &self,
        path: &str,
        value: &'v Value,
    ) -> Result<&'v Map<String, Value>, TenantsError> {
        value
            .as_object()
            .ok_or_else(|| self.wrong_type(path, "a mapping"))
    }

    /// A non-empty string.
    fn string<'v>(&self, path: &str, value: &'v Value) -> Result<&'v str, TenantsError> {
        let s = value
            .as_str()
            .ok_or_else(|| self.wrong_type(path, "a string"))?;
        if s.is_empty() {
            return Err(self.bad_value(path, s, "a non-empty string"));
        }
        Ok(s)
    }

    fn required_map<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v Map<String, Value>, TenantsError> {
        self.map(&join(prefix, key), self.required(map, prefix, key)?)
    }

    fn optional_map<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v Map<String, Value>>, TenantsError> {
        Self::get(map, key)
            .map(|v| self.map(&join(prefix, key), v))
            .transpose()
    }

    fn optional_array<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<&'v Vec<Value>>, TenantsError> {
        Self::get(map, key)
            .map(|v| {
                v.as_array()
                    .ok_or_else(|| self.wrong_type(&join(prefix, key), "a list"))
            })
            .transpose()
    }

    fn required_string<'v>(
        &self,
        map: &'v Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<&'v str, TenantsError> {
        self.string(&join(prefix, key), self.required(map, prefix, key)?)
    }

    fn optional_string(
        &self,
        map: &Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<String>, TenantsError> {
        Self::get(map, key)
            .map(|v| self.string(&join(prefix, key), v).map(String::from))
            .transpose()
    }

    fn optional_u64(
        &self,
        map: &Map<String, Value>,
        prefix: &str,
        key: &str,
    ) -> Result<Option<u64>, TenantsError> {
        Self::get(map, key)
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| self.wrong_type(&join(prefix, key), "a non-negative integer"))
            })
            .transpose()
    }
}
