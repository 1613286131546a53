//! The `tenant_objects` target: the tenancy configuration compiler
//! (`infergate_filters::tenants::Tenants::from_objects`) on any JSON.

use infergate_filters::tenants::Tenants;
use serde_json::Value;

/// Any bytes: if they are JSON (an array of objects, or one object), the compiler answers a
/// config or an error naming a field, never a panic; what it accepts is usable (every
/// tenant's limits are found by their own model, bucket keys are distinct, lookups with
/// input-derived keys and claims answer).
pub fn tenant_objects(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let objects = match value {
        Value::Array(items) => items,
        other => vec![other],
    };
    let tenants = match Tenants::from_objects(&objects) {
        Ok(tenants) => tenants,
        Err(error) => {
            // An error always says where.
            assert!(!error.to_string().is_empty());
            return;
        }
    };
    let mut keys = Vec::new();
    for (id, tenant) in tenants.iter() {
        for (index, limit) in tenant.limits.iter().enumerate() {
            let found = tenants.limit_for(id, &limit.model);
            assert_eq!(found.map(|(i, _)| i), Some(index), "{}", limit.model);
            keys.push(limit.bucket_key.clone());
        }
        let _ = tenants.by_api_key(&tenant.name);
        let _ = tenants.priority_of(&tenant.name);
    }
    let count = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), count, "two limits share a bucket");
    let text = String::from_utf8_lossy(data);
    let _ = tenants.by_api_key(&text);
}
