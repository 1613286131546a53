//! The tenancy of `bench overhead`'s tenancy arms: the platform's own objects
//! (`testdata/tenants/all.yaml`: two tenants, their objectives, a JWT rule) with every limit
//! raised far beyond any rate this machine reaches, so no request is ever refused while every
//! bucket is still checked, debited and settled, and tenant A's test API key
//! (`testdata/README.md`) on every request.

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::launch::{load_objects, Tenancy};
use infergate_artefacts::workspace_root;

/// Tenant A's test API key (never a real credential); its sha256 is in the testdata.
pub const API_KEY: &str = "sk-infergate-test-tenant-a";

/// The limits every `spec.limits[]` entry gets: orders of magnitude above what a 2-core
/// machine sends in a minute (about 10k requests/s × 8k tokens is 5·10⁹ tokens a minute).
const RPM: u64 = 1_000_000_000;
const TPM: u64 = 1_000_000_000_000;
const CONCURRENCY: u64 = 1_000_000;

/// The `Authorization` header every gateway arm sends (the arms without tenants pass it on
/// untouched, so the header bytes are the same on both sides of the comparison).
pub fn authorization() -> (String, String) {
    ("authorization".into(), format!("Bearer {API_KEY}"))
}

/// The testdata objects with limits that never refuse.
pub fn bench_objects() -> Result<Vec<Value>> {
    let path = workspace_root().join("testdata/tenants/all.yaml");
    let mut objects = load_objects(&path).with_context(|| format!("loading {}", path.display()))?;
    for object in &mut objects {
        if let Some(limits) = object
            .pointer_mut("/spec/limits")
            .and_then(Value::as_array_mut)
        {
            for limit in limits {
                limit["rpm"] = json!(RPM);
                limit["tpm"] = json!(TPM);
                limit["concurrency"] = json!(CONCURRENCY);
            }
        }
    }
    Ok(objects)
}

/// The tenancy of a tenancy arm: the objects only (no JWT filter, no billing log file: the
/// record still goes into the request's metadata, as in every deployment).
pub fn bench_tenancy() -> Result<Tenancy> {
    Ok(Tenancy {
        objects: bench_objects()?,
        ..Tenancy::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::launch::DEFAULT_MODEL;
    use infergate_filters::tenants::Tenants;

    #[test]
    fn the_objects_compile_and_the_key_is_tenant_a_with_limits_beyond_reach() {
        let objects = bench_objects().unwrap();
        let tenants = Tenants::from_objects(&objects).unwrap();
        let id = tenants.by_api_key(API_KEY).unwrap();
        let tenant = tenants.tenant(id).unwrap();
        assert_eq!(tenant.name, "tenant-a");
        // The bench's model is named by no entry: the `"*"` fallback applies.
        assert!(tenant.limits.iter().all(|l| l.model != DEFAULT_MODEL));
        let fallback = tenant.limits.iter().find(|l| l.model == "*").unwrap();
        assert_eq!(fallback.limits.rpm, Some(RPM));
        assert_eq!(fallback.limits.tpm, Some(TPM));
        assert_eq!(fallback.limits.concurrency, Some(CONCURRENCY));
        assert!(tenant.limits.iter().all(|l| l.limits.rpm == Some(RPM)));
        assert_eq!(authorization().1, format!("Bearer {API_KEY}"));
    }
}
