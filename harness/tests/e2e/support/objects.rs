//! The platform's objects as the tenancy and flow-control tests write them: a
//! `TenantQuota` with one `"*"` limit, and an `InferenceObjective`.

use serde_json::{json, Value};

/// One `TenantQuota` named `name`, identified by the API key `key` (and the JWT claims
/// `jwt`, if any), injecting `name` as its fairness id and `objective`, with `limit` as its
/// `"*"` limit.
pub fn tenant_quota(
    name: &str,
    key: &str,
    objective: &str,
    limit: Value,
    jwt: Option<Value>,
) -> Value {
    let mut identity =
        json!({"apiKeyHashes": [infergate_filters::tenants::sha256_hex(key.as_bytes())]});
    if let Some(jwt) = jwt {
        identity["jwtClaims"] = jwt;
    }
    let mut limit = limit;
    limit["model"] = json!("*");
    json!({
        "apiVersion": "mini-platform.local/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": name},
        "spec": {
            "identity": identity,
            "inject": {"fairnessId": name, "objective": objective},
            "limits": [limit],
            "accounting": {"preDebit": "input_plus_max_output",
                           "settleOn": "usage_or_chunk_count",
                           "streamDisconnect": "bill_generated"}
        }
    })
}

/// An `InferenceObjective` of `priority`.
pub fn objective(name: &str, priority: i64) -> Value {
    json!({"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
           "metadata": {"name": name, "namespace": "serving"},
           "spec": {"priority": priority, "poolRef": {"name": "pool"}}})
}
