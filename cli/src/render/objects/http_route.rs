//! `HTTPRoute`: the Gateway API route from a model name to its pools.

/// `gateway.networking.k8s.io/v1`.
pub mod v1 {
    use crate::render::objects::meta::{ObjectMeta, Opened};
    use crate::render::objects::reader::{Node, ObjectError};
    use crate::render::report::Report;
    use serde_json::Value as Json;

    /// The apiVersion this module reads.
    pub const API_VERSION: &str = "gateway.networking.k8s.io/v1";
    /// The kind.
    pub const KIND: &str = "HTTPRoute";
    /// The header every route matches the model on (set by the body router).
    pub const MODEL_HEADER: &str = "x-gateway-base-model-name";
    /// The group of an `InferencePool` backend.
    pub const POOL_GROUP: &str = "inference.networking.k8s.io";
    /// The group of an `InferencePoolImport` backend.
    pub const IMPORT_GROUP: &str = "inference.networking.x-k8s.io";

    /// `spec.parentRefs[]`: the Gateway the route attaches to.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct ParentRef {
        /// `name`.
        pub name: String,
        /// `namespace`; `None`: the route's own.
        pub namespace: Option<String>,
        /// `sectionName`: the Gateway listener the route attaches to.
        pub section_name: Option<String>,
    }

    /// One backend of a rule: an `InferencePool` and its weight.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Backend {
        /// The pool's name (in the route's namespace).
        pub pool: String,
        /// `weight` (1 when absent).
        pub weight: u32,
        /// Where it was written (`spec.rules[0].backendRefs[1]`).
        pub path: String,
        /// An `InferencePoolImport` (the pool exported from other clusters), not an
        /// `InferencePool`.
        pub import: bool,
    }

    /// One match of a rule.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Match {
        /// The model (`X-Gateway-Base-Model-Name`, exact).
        pub model: String,
        /// One more exact header (a targeted canary), lower-case name.
        pub header: Option<(String, String)>,
        /// `path: {type: PathPrefix, value}`; `None`: every path.
        pub path_prefix: Option<String>,
    }

    /// One rule.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Rule {
        /// `spec.rules[i]`.
        pub path: String,
        /// Its matches (at least one).
        pub matches: Vec<Match>,
        /// Its backends (at least one).
        pub backends: Vec<Backend>,
    }

    /// One `HTTPRoute`.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct HttpRoute {
        /// Its name and namespace.
        pub meta: ObjectMeta,
        /// `HTTPRoute <namespace>/<name>`.
        pub label: String,
        /// `spec.parentRefs`.
        pub parents: Vec<ParentRef>,
        /// `spec.rules`.
        pub rules: Vec<Rule>,
    }

    /// Reads an `HTTPRoute` document.
    pub fn read(doc: &Json, report: &mut Report) -> Result<HttpRoute, ObjectError> {
        let object = Opened::read(doc, KIND, report)?;
        let label = object.label.as_str();
        let spec = object.spec(&["parentRefs", "hostnames", "rules"])?;
        if spec.get("hostnames")?.is_some() {
            return Err(spec.error_at(
                "hostnames",
                "not supported: the gateway's routes serve every host name; remove it or \
                 front the gateway with a listener per host",
            ));
        }
        let mut parents = Vec::new();
        for p in spec.opt_list("parentRefs")? {
            let n = p.node();
            n.only(&["group", "kind", "namespace", "name", "sectionName", "port"])?;
            if let Some(kind) = n.opt_string("kind")? {
                if kind != "Gateway" {
                    return Err(n.error_at("kind", format!("`{kind}`: only a Gateway")));
                }
            }
            parents.push(ParentRef {
                name: n.req_string("name")?.to_owned(),
                namespace: n.opt_string("namespace")?.map(str::to_owned),
                section_name: n.opt_string("sectionName")?.map(str::to_owned),
            });
            if n.get("sectionName")?.is_some() {
                report.used(
                    label,
                    &format!("{}.sectionName", p.path),
                    "the Envoy Gateway manifests patch this listener; the bare-Envoy \
                     bootstrap has one listener and the route is on it",
                );
            }
            if n.get("port")?.is_some() {
                report.not_supported(
                    label,
                    &format!("{}.port", p.path),
                    "the rendered gateway has one listener; the route is on it",
                );
            }
        }
        if !parents.is_empty() {
            report.used(
                label,
                "spec.parentRefs",
                "the Istio manifests attach the gateway filters to this Gateway (the \
                 rendered bootstrap is the gateway itself)",
            );
        }
        let mut rules = Vec::new();
        let list = spec.required("rules")?.node().list()?;
        if list.is_empty() {
            return Err(spec.error_at("rules", "no rule"));
        }
        for r in &list {
            rules.push(rule(r.node(), label, report)?);
        }
        Ok(HttpRoute {
            meta: object.meta,
            label: object.label,
            parents,
            rules,
        })
    }

    fn rule(r: Node<'_>, label: &str, report: &mut Report) -> Result<Rule, ObjectError> {
        r.only(&[
            "name",
            "matches",
            "filters",
            "backendRefs",
            "timeouts",
            "retry",
            "sessionPersistence",
        ])?;
        let at = r.path().to_owned();
        if r.get("filters")?.is_some() {
            return Err(r.error_at(
                "filters",
                "not supported: the gateway's routes modify no request or response",
            ));
        }
        if r.get("name")?.is_some() {
            report.not_supported(label, &format!("{at}.name"), "routes are named by model");
        }
        for (key, why) in [
            (
                "retry",
                "every pool route retries a reset once, on the picker's next endpoint",
            ),
            (
                "sessionPersistence",
                "affinity is the picker's (prefix cache, the pool's sessionHeader)",
            ),
        ] {
            if r.get(key)?.is_some() {
                report.not_supported(label, &format!("{at}.{key}"), why);
            }
        }
        if let Some(t) = r.get("timeouts")? {
            let t = t.node();
            t.only(&["request", "backendRequest"])?;
            for key in ["request", "backendRequest"] {
                match t.opt_string(key)? {
                    None => {}
                    Some("0s") => report.used(
                        label,
                        &format!("{at}.timeouts.{key}"),
                        "0s: the pool route has no timeout (`timeout: 0s`), so streams \
                         run as long as they last",
                    ),
                    Some(other) => report.not_supported(
                        label,
                        &format!("{at}.timeouts.{key}"),
                        format!(
                            "`{other}`: pool routes never time out (`timeout: 0s`); the \
                             connection manager bounds only how long a request may take to \
                             arrive"
                        ),
                    ),
                }
            }
        }
        let mut backends = Vec::new();
        let refs = r.required("backendRefs")?.node().list()?;
        if refs.is_empty() {
            return Err(r.error_at("backendRefs", "no backend"));
        }
        for b in &refs {
            let n = b.node();
            n.only(&[
                "group",
                "kind",
                "name",
                "namespace",
                "port",
                "weight",
                "filters",
            ])?;
            let kind = n.opt_string("kind")?.unwrap_or("Service");
            // An InferencePool without its group is taken as the inference extension's.
            let group = n.opt_string("group")?;
            let import = match (kind, group) {
                ("InferencePool", None | Some(POOL_GROUP)) => false,
                ("InferencePoolImport", Some(IMPORT_GROUP)) => true,
                (kind, group) => {
                    return Err(n.error(format!(
                        "a {kind} backend (group `{}`): only InferencePool ({POOL_GROUP}) \
                         or InferencePoolImport ({IMPORT_GROUP})",
                        group.unwrap_or("")
                    )))
                }
            };
            for key in ["namespace", "port", "filters"] {
                if n.get(key)?.is_some() {
                    return Err(n.error_at(
                        key,
                        "not supported: an InferencePool backend is named in the route's \
                         namespace, takes its ports from the pool and has no filters",
                    ));
                }
            }
            let weight = match n.get("weight")? {
                None => 1,
                Some(w) => {
                    let v = w.node().u64()?;
                    u32::try_from(v)
                        .ok()
                        .filter(|v| *v <= 1_000_000)
                        .ok_or_else(|| w.node().error("must be at most 1000000"))?
                }
            };
            backends.push(Backend {
                pool: n.req_string("name")?.to_owned(),
                weight,
                path: b.path.clone(),
                import,
            });
        }
        if backends.len() > 1 && backends.iter().all(|b| b.weight == 0) {
            return Err(r.error_at("backendRefs", "every weight is 0"));
        }
        report.used(
            label,
            &format!("{at}.backendRefs"),
            "the pools' clusters (several: Envoy's weighted clusters, sticky on \
             x-gateway-split-key)",
        );
        let mut matches = Vec::new();
        let list = r.required("matches")?.node().list()?;
        if list.is_empty() {
            return Err(r.error_at(
                "matches",
                format!("no match naming the model with {MODEL_HEADER}"),
            ));
        }
        for m in &list {
            matches.push(read_match(m.node())?);
        }
        report.used(
            label,
            &format!("{at}.matches"),
            "the route's match: the model header the body router sets, the path prefix, \
             at most one more exact header (a targeted canary, placed first)",
        );
        Ok(Rule {
            path: at,
            matches,
            backends,
        })
    }

    fn read_match(m: Node<'_>) -> Result<Match, ObjectError> {
        m.only(&["path", "headers", "queryParams", "method"])?;
        for key in ["queryParams", "method"] {
            if m.get(key)?.is_some() {
                return Err(m.error_at(key, "not supported: routes match the model and headers"));
            }
        }
        let path_prefix = match m.get("path")? {
            None => None,
            Some(p) => {
                let p = p.node();
                p.only(&["type", "value"])?;
                let kind = p.opt_string("type")?.unwrap_or("PathPrefix");
                if kind != "PathPrefix" {
                    return Err(p.error_at("type", format!("`{kind}`: only PathPrefix")));
                }
                let value = p.opt_string("value")?.unwrap_or("/");
                if !value.starts_with('/') {
                    return Err(p.error_at("value", "must start with /"));
                }
                (value != "/").then(|| value.to_owned())
            }
        };
        let mut model = None;
        let mut other = Vec::new();
        for h in m.opt_list("headers")? {
            let n = h.node();
            n.only(&["type", "name", "value"])?;
            if let Some(kind) = n.opt_string("type")? {
                if kind != "Exact" {
                    return Err(n.error_at("type", format!("`{kind}`: only Exact")));
                }
            }
            let name = n.req_string("name")?.to_ascii_lowercase();
            let value = n.req_string("value")?.to_owned();
            if name == MODEL_HEADER {
                model = Some(value);
            } else {
                other.push((name, value));
            }
        }
        let Some(model) = model else {
            return Err(m.error(format!(
                "no header match on {MODEL_HEADER}: every route matches the model the body \
                 router sets"
            )));
        };
        if other.len() > 1 {
            return Err(m.error_at("headers", "at most one header beside the model"));
        }
        Ok(Match {
            model,
            header: other.pop(),
            path_prefix,
        })
    }
}
