//! The `README.md` written into the output directory: what each file is, and how to deploy
//! it on the target (a bare Envoy, Istio, Envoy Gateway).

use super::gateway::Gateway;
use super::istio::{MODULE_DIR, NATIVE_MODULE_FILE, OVERLAY_CONFIGMAP};
use super::kube::Target as Gw;
use super::{RenderOptions, Target};
use crate::config::bootstrap::Flavor;
use crate::config::eds::Membership;
use std::fmt::Write as _;

/// The README's text.
pub fn text(gw: &Gateway, opts: &RenderOptions, not_supported: &[String]) -> String {
    let flavor = opts.gateway.flavor;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# The gateway rendered from {} for {}\n\nFlavour `{flavor}`. Files:\n\n\
         | file | what |\n|---|---|\n\
         | `{}` | {} |\n\
         | `fields.md` | every field of every object: used (how) or not supported (why) |\n",
        opts.objects.display(),
        opts.target,
        opts.target.file(),
        match opts.target {
            Target::Envoy => "a complete Envoy 1.40 bootstrap",
            Target::Istio => "the manifests for an Istio-run Gateway",
            Target::EnvoyGateway => "the manifests for an Envoy Gateway-run Gateway",
        }
    );
    match opts.target {
        Target::Envoy => envoy(&mut s, gw, opts),
        Target::Istio => istio(&mut s, gw, opts),
        Target::EnvoyGateway => envoy_gateway(&mut s, gw, opts),
    }
    let _ = writeln!(s, "## Not supported ({})\n", not_supported.len());
    for line in not_supported {
        let _ = writeln!(s, "- {line}");
    }
    s
}

fn envoy(s: &mut String, gw: &Gateway, opts: &RenderOptions) {
    let module = gw
        .params
        .module
        .as_ref()
        .map_or_else(|| "(the module)".into(), |m| m.display().to_string());
    let _ = writeln!(
        s,
        "## Plain Envoy\n\n\
         Listener {listen}, admin {admin}, the module at `{module}`.\n\n\
         1. Put the module where the bootstrap names it (`{module}`): the `.so` must come \
         from a build for exactly this Envoy version.\n\
         2. Check it: `envoy --mode validate -c envoy.yaml`.\n\
         3. Run it: `envoy -c envoy.yaml`. {members}\n",
        listen = opts.listen,
        admin = opts.admin,
        members = match opts.membership {
            Membership::Eds => format!(
                "Each pool's cluster takes its members from its EDS file in `{}` (one \
                 `ClusterLoadAssignment` per file, `eds/<cluster>.json` here holds the \
                 `--endpoints` given, `<cluster>.example.json` the shape): as pods come and \
                 go, write the new file beside it and rename it over it; Envoy, the picker \
                 and the scraper follow at once.",
                opts.eds_dir
                    .as_ref()
                    .map_or_else(|| "eds/".to_owned(), |d| d.display().to_string())
            ),
            Membership::Static => "Each pool's cluster is STATIC: it holds the endpoints \
                 given with `--endpoints` at render time."
                .to_owned(),
        }
    );
}

fn istio(s: &mut String, gw: &Gateway, opts: &RenderOptions) {
    let target = Gw::of(gw);
    let wasm = opts.gateway.flavor == Flavor::Wasm;
    let version = opts.istio_version;
    let _ = writeln!(
        s,
        "## Istio {version}\n\n\
         For Istio 1.28, 1.29 and 1.30 (rendered for {version}: `--istio-version`), the \
         Gateway `{ns}/{name}` (Gateway API, Istio's gateway class). Nothing here is a \
         bootstrap patch (Istio ≥ 1.21 accepts `applyTo: BOOTSTRAP` and never applies it): \
         the scraper's configuration is inside the picker's, `instance` `{instance}` \
         prefixes the module's shared data, and every filter is inserted before \
         `envoy.filters.http.router`, the one filter name every listener has (a patch \
         anchored on a missing name inserts nothing, silently).\n",
        ns = target.namespace,
        name = target.name,
        instance = target.instance(),
    );
    if wasm {
        let _ = writeln!(
            s,
            "**Delivery: `EnvoyFilter` + ECDS, not `WasmPlugin`.** The router, the `headers` \
             filter and the picker are `HTTP_FILTER` patches whose filters use \
             `config_discovery`, each with an `EXTENSION_CONFIG` `ADD` holding its Wasm \
             configuration, the module `{image}`: istiod serves them over ECDS and \
             istio-agent fetches the OCI image exactly as for a `WasmPlugin`. Chosen because \
             the order matters (router → Envoy's `buffer` → headers → route refresh → picker \
             → destination metadata → Envoy's router) and the native helper filters must sit \
             between ours; a `WasmPlugin`'s filter is named per version \
             (`extensions.istio.io/wasmplugin/<ns>.<name>` up to 1.29, \
             `extensions.istio.io/trafficextension/<ns>.<name>~istio-translated-wasmplugin` \
             in 1.30) and ordered by phase. Each plugin is configured as a `WasmPlugin` would \
             be: `vm_id \"\"` (shared with every other plugin of the proxy: the module's keys \
             all start with the instance), no `allow_on_headers_stop_iteration`, \
             `failure_policy: FAIL_RELOAD`, a VM of its own.\n\n\
             1. `kubectl apply -f istio.yaml`: the `Service`s (one per pool; Istio sends their \
             endpoints to the gateway), the `HTTPRoute`s (same names as yours: applying them \
             replaces your routes to the `InferencePool`s), then the `EnvoyFilter` \
             `infergate`.\n\
             2. Check: `istioctl proxy-config listener <gateway pod> -o json` shows \
             `infergate.router`, `infergate.buffer`, `infergate.headers`, \
             `infergate.route_refresh`, `infergate.picker`, `infergate.destination_metadata` \
             just before `envoy.filters.http.router`; \
             `istioctl proxy-config cluster <gateway pod>` lists `infergate_scrape`, \
             `infergate_admin` and each pool's `outbound|PORT||<service>…`; a chat request \
             for a routed model answers with `x-gateway-destination-endpoint-served`.\n",
            image = super::istio::oci_url(&opts.image),
        );
    } else {
        let _ = writeln!(
            s,
            "**The native module** comes from an image volume: the image `{image}` must hold \
             `{NATIVE_MODULE_FILE}` at its root, built for exactly the Envoy of your Istio \
             proxy (a proxy with dynamic modules), and the cluster must support image volumes \
             (Kubernetes `ImageVolume`); otherwise replace the volume in the `ConfigMap` by \
             an `emptyDir` that an init container fills.\n\n\
             1. `kubectl apply -f istio.yaml`: the `Service`s, the `HTTPRoute`s, the \
             `ConfigMap` `{OVERLAY_CONFIGMAP}` (its `deployment` key mounts the module at \
             `{MODULE_DIR}` and sets `ENVOY_DYNAMIC_MODULES_SEARCH_PATH`), then the \
             `EnvoyFilter` `infergate`.\n\
             2. Point the Gateway at the overlay (Istio then rolls its Deployment): \
             `kubectl -n {ns} patch gateway {name} --type merge -p \
             '{{\"spec\":{{\"infrastructure\":{{\"parametersRef\":{{\"group\":\"\",\"kind\":\"ConfigMap\",\"name\":\"{OVERLAY_CONFIGMAP}\"}}}}}}}}'`.\n\
             3. Check: `istioctl proxy-config listener <gateway pod> -o json` shows \
             `infergate.router` and `infergate.picker` just before \
             `envoy.filters.http.router`. {lb}\n",
            image = opts.image,
            ns = target.namespace,
            name = target.name,
            lb = if version.has_dynamic_module_lb() {
                "The pool clusters fall back to the module's `infergate-membership` policy, \
                 which also tells the scraper the members."
            } else {
                "Istio ≤ 1.29 does not know the dynamic-modules LB policy (its webhook \
                 would refuse it) nor `DynamicModuleConfig.module`: the pool clusters fall \
                 back to round robin, the scraper reads the members from the admin (:15000), \
                 and the module is found by name on the search path."
            }
        );
    }
    let _ = writeln!(
        s,
        "What Istio does not do here: a sticky split across pools (Istio draws a weighted \
         split per request); the routes' retry policy is Istio's; the billing log, if any, \
         goes to the proxy's stdout (the gateway's file system is read-only). Nothing was \
         applied to a cluster here: the manifests are checked against the schemas the tests \
         vendor and the facts of each control plane's sources.\n"
    );
}

fn envoy_gateway(s: &mut String, gw: &Gateway, opts: &RenderOptions) {
    let target = Gw::of(gw);
    let wasm = opts.gateway.flavor == Flavor::Wasm;
    let _ = writeln!(
        s,
        "## Envoy Gateway\n\n\
         For Envoy Gateway ≥ 1.9 (dynamic modules; `EnvoyPatchPolicy` must be enabled: \
         `extensionApis.enableEnvoyPatchPolicy: true` in the Envoy Gateway configuration), \
         the Gateway `{ns}/{name}`.\n\n\
         1. {proxy}\n\
         2. `kubectl apply -f envoy-gateway.yaml`: the `Service`s (one per pool), the \
         `HTTPRoute`s (same names as yours; each path prefix has an entry rule without the \
         model header, which Envoy Gateway needs to enable the gateway's filters before the \
         body router has read the model), the `EnvoyExtensionPolicy` `infergate` ({ext}), \
         the `BackendTrafficPolicy` `infergate` (the pool routes' `endpointOverride` on \
         `x-gateway-destination-endpoint`: Envoy's `override_host`), the `EnvoyPatchPolicy` \
         `infergate` (the scrape and admin clusters; Wasm: Envoy's buffer filter before the \
         `headers` filter and the route refresh before the picker, inserted in the listener \
         `{ns}/{name}/<section>`).\n\
         3. Check: `egctl config envoy-proxy cluster -n <ns> <envoy pod>` lists \
         `infergate_scrape`, `infergate_admin` and `httproute/<ns>/<route>/rule/<i>`; a chat \
         request answers with `x-gateway-destination-endpoint-served`.\n",
        ns = target.namespace,
        name = target.name,
        proxy = if wasm {
            "Nothing to install on the proxy: Envoy Gateway pulls the Wasm image itself.".to_owned()
        } else {
            format!(
                "Apply the `EnvoyProxy` `infergate` first and reference it from the Gateway's \
                 `spec.infrastructure.parametersRef` (or its GatewayClass's): it allows the \
                 module `infergate` (`{MODULE_DIR}/{NATIVE_MODULE_FILE}`) and mounts the image \
                 `{}` there.",
                opts.image
            )
        },
        ext = if wasm {
            "the Wasm router and picker from the OCI image"
        } else {
            "the module's router and picker filters"
        },
    );
    let _ = writeln!(
        s,
        "What Envoy Gateway cannot be told (see `fields.md`): a rule's several backends are \
         one cluster (no split across pools); each Wasm filter has its own VM id, no \
         `allow_on_headers_stop_iteration` and no `FAIL_RELOAD` (a Wasm VM that traps stays \
         down on its worker until the next configuration: prefer the native flavour there).\n"
    );
}
