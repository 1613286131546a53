//! `TenantQuota`: the platform's own tenant object (identity, injected headers, per-model
//! limits, accounting).

/// `mini-platform.local/v1alpha1`.
pub mod v1alpha1 {
    use crate::render::objects::meta::{ObjectMeta, Opened};
    use crate::render::objects::reader::ObjectError;
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersion this module reads: the tenant stage's own.
    pub const API_VERSION: &str = infergate_filters::tenants::TENANT_QUOTA_API_VERSION;
    /// The kind.
    pub const KIND: &str = "TenantQuota";

    /// One `TenantQuota`.
    #[derive(Clone, Debug, PartialEq)]
    pub struct TenantQuota {
        /// Its name and namespace.
        pub meta: ObjectMeta,
        /// `TenantQuota <name>`.
        pub label: String,
        /// `spec.identity.jwtClaims.issuer`, when the tenant is known by JWT.
        pub jwt_issuer: Option<String>,
        /// The document, which the tenant stage compiles (every field checked there).
        pub document: Json,
    }

    /// Reads a `TenantQuota` document.
    pub fn read(doc: &Json, report: &mut Report) -> Result<TenantQuota, ObjectError> {
        let object = Opened::read(doc, KIND, report)?;
        let label = object.label.as_str();
        let spec = object.spec(&["identity", "inject", "limits", "accounting"])?;
        let mut jwt_issuer = None;
        if let Some(identity) = spec.get("identity")? {
            let i = identity.node();
            i.only(&["apiKeyHashes", "jwtClaims"])?;
            if let Some(claims) = i.get("jwtClaims")? {
                jwt_issuer = claims.node().opt_string("issuer")?.map(str::to_owned);
            }
        }
        for (key, how) in [
            (
                "identity",
                "the auth stage: API-key digests; JWT claims verified by Envoy's jwt_authn",
            ),
            (
                "inject",
                "the auth stage sets x-llm-d-inference-fairness-id / -objective",
            ),
            (
                "limits",
                "the quota stage's rpm / tpm / concurrency buckets per tenant and model",
            ),
            (
                "accounting",
                "pre-debit, settlement and stream-disconnect billing",
            ),
        ] {
            if spec.get(key)?.is_some() {
                report.used(label, &format!("spec.{key}"), how);
            }
        }
        Ok(TenantQuota {
            meta: object.meta,
            label: object.label,
            jwt_issuer,
            document: doc.clone(),
        })
    }
}
