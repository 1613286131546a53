//! `InferencePool`: the replicas of one model server deployment, as the Gateway API
//! inference extension defines it.

/// `inference.networking.k8s.io/v1`.
pub mod v1 {
    use crate::config::FailureMode;
    use crate::render::objects::meta::{ObjectMeta, Opened};
    use crate::render::objects::reader::{Node, ObjectError};
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersion this module reads.
    pub const API_VERSION: &str = "inference.networking.k8s.io/v1";
    /// The annotation that exports a pool to the other clusters of its ClusterSet.
    pub const EXPORT_ANNOTATION: &str = "inference.networking.x-k8s.io/export";
    /// The one value of [`EXPORT_ANNOTATION`].
    pub const EXPORT_CLUSTER_SET: &str = "ClusterSet";
    /// The kind.
    pub const KIND: &str = "InferencePool";

    /// How the pool's replicas speak to the gateway (`spec.appProtocol`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum AppProtocol {
        /// `http`: HTTP/1.1, what the pool clusters speak.
        Http,
    }

    /// `spec.endpointPickerRef`: the llm-d EPP service this gateway replaces.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct EndpointPickerRef {
        /// `name`: the EPP service's name.
        pub name: String,
        /// `failureMode`: what a pool whose metrics are stale or missing answers.
        pub failure_mode: FailureMode,
    }

    /// One `InferencePool`.
    #[derive(Clone, Debug, PartialEq)]
    pub struct InferencePool {
        /// Its name and namespace.
        pub meta: ObjectMeta,
        /// `InferencePool <namespace>/<name>`.
        pub label: String,
        /// `spec.selector` as written (`matchLabels`): the pods of the pool.
        pub selector: Json,
        /// `spec.targetPorts[].number`: the ports every pod serves on.
        pub target_ports: Vec<u16>,
        /// `spec.appProtocol`.
        pub app_protocol: AppProtocol,
        /// `spec.endpointPickerRef`.
        pub endpoint_picker_ref: Option<EndpointPickerRef>,
        /// Exported to the other clusters of its ClusterSet ([`EXPORT_ANNOTATION`]).
        pub exported: bool,
    }

    impl InferencePool {
        /// The pool's failure mode (`FailClose` when `endpointPickerRef` does not say).
        pub fn failure_mode(&self) -> FailureMode {
            self.endpoint_picker_ref
                .as_ref()
                .map_or(FailureMode::FailClose, |r| r.failure_mode)
        }
    }

    /// Reads an `InferencePool` document.
    pub fn read(doc: &Json, report: &mut Report) -> Result<InferencePool, ObjectError> {
        let object = Opened::annotated(doc, KIND, &[EXPORT_ANNOTATION], report)?;
        let label = object.label.as_str();
        let exported = match object.meta.annotation(EXPORT_ANNOTATION) {
            None => false,
            Some(EXPORT_CLUSTER_SET) => {
                report.used(
                    label,
                    &format!("metadata.annotations.{EXPORT_ANNOTATION}"),
                    "the gateway publishes the pool's load for the other clusters' gateways \
                     (GET /infergate/pools/<name>/metrics)",
                );
                true
            }
            Some(other) => {
                return Err(Node::root(label, doc).error_at(
                    &format!("metadata.annotations.{EXPORT_ANNOTATION}"),
                    format!("`{other}`: the one value is `{EXPORT_CLUSTER_SET}`"),
                ))
            }
        };
        let spec = object.spec(&[
            "selector",
            "targetPorts",
            "appProtocol",
            "endpointPickerRef",
        ])?;

        let selector = spec.required("selector")?;
        selector.node().only(&["matchLabels", "matchExpressions"])?;
        report.not_supported(
            label,
            "spec.selector",
            "pods are not watched; the pool's endpoints come from the pool cluster's EDS \
             (or --endpoints with --membership static); the Istio manifests give the \
             selector to a Service, whose endpoints Istio sends",
        );

        let mut target_ports = Vec::new();
        let ports = spec.required("targetPorts")?.node().list()?;
        if ports.is_empty() || ports.len() > 8 {
            return Err(spec.error_at("targetPorts", "must hold 1 to 8 ports"));
        }
        for port in &ports {
            let p = port.node();
            p.only(&["number"])?;
            let number = p.required("number")?;
            let n = number.node().u64()?;
            let n = u16::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| number.node().error("must be a port, 1 to 65535"))?;
            if target_ports.contains(&n) {
                return Err(number.node().error(format!("port {n} is listed twice")));
            }
            target_ports.push(n);
        }
        report.used(
            label,
            "spec.targetPorts",
            "the port of each endpoint given as a bare IP, and of the example EDS file \
             (several ports: each pod is one endpoint per port, as data-parallel ranks)",
        );

        let app_protocol = match spec.opt_string("appProtocol")? {
            None | Some("http") => AppProtocol::Http,
            Some(other) => {
                return Err(spec.error_at(
                    "appProtocol",
                    format!(
                        "`{other}` is not supported: the pool clusters speak HTTP/1.1 (`http`)"
                    ),
                ))
            }
        };
        if spec.get("appProtocol")?.is_some() {
            report.used(
                label,
                "spec.appProtocol",
                "http: the pool cluster speaks HTTP/1.1",
            );
        }

        let endpoint_picker_ref = match spec.get("endpointPickerRef")? {
            None => None,
            Some(r) => Some(endpoint_picker_ref(r.node(), label, report)?),
        };
        let selector = selector.value.clone();
        Ok(InferencePool {
            meta: object.meta,
            label: object.label,
            selector,
            target_ports,
            app_protocol,
            endpoint_picker_ref,
            exported,
        })
    }

    fn endpoint_picker_ref(
        r: Node<'_>,
        label: &str,
        report: &mut Report,
    ) -> Result<EndpointPickerRef, ObjectError> {
        r.only(&["group", "kind", "name", "port", "failureMode"])?;
        let name = r.req_string("name")?.to_owned();
        for key in ["group", "kind", "name", "port"] {
            if r.get(key)?.is_some() {
                report.not_supported(
                    label,
                    &format!("spec.endpointPickerRef.{key}"),
                    "the picker runs inside Envoy: no endpoint picker service is called",
                );
            }
        }
        if let Some(port) = r.get("port")? {
            port.node().only(&["number"])?;
        }
        let failure_mode = match r.opt_string("failureMode")? {
            None | Some("FailClose") => FailureMode::FailClose,
            Some("FailOpen") => FailureMode::FailOpen,
            Some(other) => {
                return Err(r.error_at(
                    "failureMode",
                    format!("`{other}`: expected FailClose or FailOpen"),
                ))
            }
        };
        report.used(
            label,
            "spec.endpointPickerRef.failureMode",
            "the picker pool's failureMode (stale or missing metrics)",
        );
        Ok(EndpointPickerRef { name, failure_mode })
    }
}
