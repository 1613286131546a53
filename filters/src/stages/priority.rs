//! The priority stage: tells a tenant which priority band its request asked for. A
//! tenant's objective (`InferenceObjective.spec.priority`) is the priority that flow
//! control's strict bands are keyed by; the stage echoes it in the response header
//! `x-gateway-priority-band` of every response an upstream sent. A request without a tenant
//! (refused before one was found) and a local reply get no header.

use std::sync::Arc;

use crate::host::{EditResponseHeaders, ServedUpstream};
use crate::pipeline::{RequestContext, Stage};

use super::tenancy::{Accounting, Tenancy};

/// The response header naming the request's priority band.
pub const PRIORITY_BAND_HEADER: &str = "x-gateway-priority-band";

/// The priority stage; shares the [`Tenancy`] whose tenants it reads.
#[derive(Clone, Debug)]
pub struct PriorityBandStage {
    tenancy: Arc<Tenancy>,
}

impl PriorityBandStage {
    /// A stage echoing the priorities of `tenancy`'s tenants.
    pub fn new(tenancy: &Arc<Tenancy>) -> PriorityBandStage {
        PriorityBandStage {
            tenancy: Arc::clone(tenancy),
        }
    }
}

impl<H: EditResponseHeaders + ServedUpstream + ?Sized> Stage<H> for PriorityBandStage {
    fn name(&self) -> &'static str {
        "priority-band"
    }

    fn on_response_headers(&self, cx: &mut RequestContext, host: &mut H, _end_of_stream: bool) {
        if host.served_upstream().is_none() {
            return;
        }
        let tenant = cx.get::<Accounting>().and_then(|acc| acc.tenant);
        let Some(tenant) = tenant.and_then(|id| self.tenancy.tenants().tenant(id)) else {
            return;
        };
        host.set_response_header(PRIORITY_BAND_HEADER, &tenant.priority.to_string());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;
    use crate::fake::FakeHost;
    use crate::pipeline::{Pipeline, Run};
    use crate::quotas::MemoryQuotas;
    use crate::stages::AuthStage;
    use crate::tenants::{sha256_hex, Tenants};

    fn pipeline() -> Pipeline<FakeHost> {
        let tenants = Tenants::from_objects(&[
            json!({"apiVersion": "mini-platform.local/v1alpha1", "kind": "TenantQuota",
                   "metadata": {"name": "a"},
                   "spec": {"identity": {"apiKeyHashes": [sha256_hex(b"sk-a")]},
                            "inject": {"objective": "premium"},
                            "limits": [{"model": "*", "rpm": 10}]}}),
            json!({"apiVersion": "llm-d.ai/v1alpha2", "kind": "InferenceObjective",
                   "metadata": {"name": "premium"}, "spec": {"priority": 100}}),
        ])
        .unwrap();
        let tenancy = Tenancy::new(tenants, Arc::new(MemoryQuotas::default()));
        Pipeline::new(vec![
            Box::new(AuthStage::new(Arc::clone(&tenancy))),
            Box::new(PriorityBandStage::new(&tenancy)),
        ])
    }

    fn respond(key: &str, served: Option<&str>) -> Option<String> {
        let p = pipeline();
        let mut host = FakeHost::new()
            .request_header("authorization", &format!("Bearer {key}"))
            .request_header(":path", "/healthz");
        let mut run = Run::new();
        run.request_headers(&p, &mut host, true);
        host.served_upstream = served.map(str::to_owned);
        run.response_headers(&p, &mut host, true);
        host.response(PRIORITY_BAND_HEADER).map(str::to_owned)
    }

    #[test]
    fn a_tenants_upstream_response_names_its_objectives_priority() {
        let upstream = Some("10.0.0.1:8000");
        assert_eq!(respond("sk-a", upstream).as_deref(), Some("100"));
        assert_eq!(respond("sk-a", None), None, "a local reply");
        assert_eq!(respond("sk-unknown", upstream), None);
    }
}
