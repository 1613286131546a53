//! Reading one `TenantQuota` or `InferenceObjective` from its JSON form, field by field, so
//! that every field the gateway does not implement is an error naming its path.
//!
//! Each object is checked on its own here; what needs the whole list (duplicates across
//! tenants, objectives named by tenants) is checked by the caller.

use serde_json::{Map, Value};

use super::error::TenantsError;
use super::{Accounting, ModelLimit, PreDebit, SettleOn, StreamDisconnect};
use crate::objects::{self, Fields, ObjectError};
use scheduler_core::quota::Limits;

/// The platform's own schema of tenant objects.
pub const TENANT_QUOTA_API_VERSION: &str = "mini-platform.local/v1alpha1";
/// llm-d's `InferenceObjective`.
pub const OBJECTIVE_API_VERSION: &str = "llm-d.ai/v1alpha2";

/// What a nested object must be, in errors.
const MAPPING: &str = "a mapping";

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
    let Some(map) = objects::list_item(&at, value, "a TenantQuota or an InferenceObjective")?
    else {
        return Ok(None);
    };
    let api_version = objects::type_field(map, "apiVersion");
    let kind = objects::type_field(map, "kind");
    let expected_version = match kind {
        "TenantQuota" => TENANT_QUOTA_API_VERSION,
        "InferenceObjective" => OBJECTIVE_API_VERSION,
        _ => return Err(ObjectError::wrong_object(at, "kind", kind, kinds_taken()).into()),
    };
    let unnamed = format!("{kind} {at}");
    if api_version != expected_version {
        return Err(
            ObjectError::wrong_object(unnamed, "apiVersion", api_version, kinds_taken()).into(),
        );
    }
    let name = object_name(&unnamed, map)?;
    let fields = Fields::new(format!("{kind} {name}"), MAPPING);
    fields.only(map, "", TOP_KEYS)?;
    let spec = fields.required_map(map, "", "spec")?;
    Ok(Some(match kind {
        "TenantQuota" => Object::Tenant(tenant(fields, name, spec)?),
        _ => Object::Objective(objective(fields, name, spec)?),
    }))
}

/// `metadata.name`, checked against the other `metadata` keys.
fn object_name(unnamed: &str, map: &Map<String, Value>) -> Result<String, TenantsError> {
    let fields = Fields::new(unnamed.into(), MAPPING);
    let metadata = fields.required_map(map, "", "metadata")?;
    fields.only(metadata, "metadata", crate::objects::OBJECT_META_KEYS)?;
    let name = fields.required_string(metadata, "metadata", "name")?;
    // The name is the first half of every bucket key (`<tenant>/<model>`).
    if name.contains('/') {
        return Err(fields
            .bad_value("metadata.name", name, "a name without `/`")
            .into());
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
                return Err(fields
                    .bad_value(&path, hex, "a sha256 digest: 64 hex digits")
                    .into());
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
                fields
                    .optional_string(inject, "spec.inject", "fairnessId")?
                    .map(String::from),
                fields
                    .optional_string(inject, "spec.inject", "objective")?
                    .map(String::from),
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
        out.pre_debit = match value {
            "input_plus_max_output" => PreDebit::InputPlusMaxOutput,
            _ => {
                return Err(fields
                    .bad_value("spec.accounting.preDebit", value, "`input_plus_max_output`")
                    .into())
            }
        };
    }
    if let Some(value) = fields.optional_string(map, at, "settleOn")? {
        out.settle_on = match value {
            "usage_or_chunk_count" => SettleOn::UsageOrChunkCount,
            "usage" => SettleOn::Usage,
            _ => {
                return Err(fields
                    .bad_value(
                        "spec.accounting.settleOn",
                        value,
                        "`usage_or_chunk_count` or `usage`",
                    )
                    .into())
            }
        };
    }
    if let Some(value) = fields.optional_string(map, at, "streamDisconnect")? {
        out.stream_disconnect = match value {
            "bill_generated" => StreamDisconnect::BillGenerated,
            _ => {
                return Err(fields
                    .bad_value(
                        "spec.accounting.streamDisconnect",
                        value,
                        "`bill_generated`",
                    )
                    .into())
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

/// The kinds and versions taken, for a wrong `kind` or `apiVersion`.
fn kinds_taken() -> String {
    format!(
        "apiVersion `{TENANT_QUOTA_API_VERSION}` kind `TenantQuota`, or apiVersion \
         `{OBJECTIVE_API_VERSION}` kind `InferenceObjective`"
    )
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
