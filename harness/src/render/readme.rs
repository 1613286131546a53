//! The `README.md` written into the output directory: what each file is, and the order in
//! which to apply them.

use super::gateway::Gateway;
use super::RenderOptions;
use crate::launch::bootstrap::Flavor;
use crate::launch::eds::Membership;
use std::fmt::Write as _;

/// The README's text.
pub fn text(gw: &Gateway, opts: &RenderOptions, not_supported: &[String]) -> String {
    let flavor = opts.gateway.flavor;
    let module = gw
        .params
        .module
        .as_ref()
        .map_or_else(|| "(the module)".into(), |m| m.display().to_string());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# The gateway rendered from {}\n",
        opts.objects.display()
    );
    let _ = writeln!(
        s,
        "Flavour `{flavor}`. Files:\n\n\
         | file | what |\n|---|---|\n\
         | `envoy.yaml` | a complete Envoy 1.40 bootstrap: listener {listen}, admin {admin}, the module at `{module}` |\n\
         | `istio.yaml` | the same gateway for an Istio-run Gateway: per pool a `Service`, the `HTTPRoute`s onto them, {istio} |\n\
         | `fields.md` | every field of every object: used (how) or not supported (why) |\n",
        listen = opts.listen,
        admin = opts.admin,
        istio = if flavor == Flavor::Wasm {
            "the `WasmPlugin`s `infergate-router` and `infergate-picker`, and the `EnvoyFilter` `infergate` (the scraper singleton, the two helper filters around the picker, the clusters)"
        } else {
            "the `EnvoyFilter` `infergate` (the dynamic module's filters and scraper, the clusters)"
        }
    );
    let _ = writeln!(s, "## Plain Envoy\n");
    let _ = writeln!(
        s,
        "1. Put the module where the bootstrap names it (`{module}`): the `.so` must come \
         from a build for exactly this Envoy version.\n\
         2. Check it: `envoy --mode validate -c envoy.yaml`.\n\
         3. Run it: `envoy -c envoy.yaml`. {members}\n",
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
    let _ = writeln!(s, "## Istio\n");
    let _ = writeln!(
        s,
        "1. Put the module into the gateway's pods at `{dir}` (a volume){wasm}.\n\
         2. `kubectl apply -f istio.yaml`: first the `Service`s (Istio then sends their \
         endpoints to the gateway), the `HTTPRoute`s (same names as yours: applying them \
         replaces your routes to the `InferencePool`s), then the {plugins}.\n\
         3. Check: `istioctl proxy-config cluster <gateway pod>` lists `infergate_scrape` and \
         each pool's `outbound|PORT||<pool>-infergate…` cluster; a chat request for a routed \
         model answers with `x-gateway-destination-endpoint-served`.\n",
        dir = super::istio::MODULE_DIR,
        wasm = if flavor == Flavor::Wasm {
            ": the `WasmPlugin`s pull the OCI image themselves, but the scraper is a singleton \
             service, which no `WasmPlugin` can declare, so the `EnvoyFilter` loads it from \
             that file"
        } else {
            ""
        },
        plugins = if flavor == Flavor::Wasm {
            "`WasmPlugin`s, then the `EnvoyFilter`"
        } else {
            "`EnvoyFilter`"
        }
    );
    let _ = writeln!(
        s,
        "What Istio cannot be told here: the filters' order is Istio's (phases `AUTHZ` and \
         `STATS` for the Wasm filters; the helper filters are placed around the picker's \
         filter, which Istio names `<namespace>.infergate-picker`); the Wasm filters and the \
         singleton must share one VM id, which a `WasmPlugin` does not let you set; and a \
         sticky split across pools needs `x-gateway-split-key` on Envoy's weighted \
         clusters, which Istio's routes do not carry (Istio draws per request); the \
         routes' retry policy is Istio's, not the gateway's one retry onto the picker's \
         next endpoint; a `WasmPlugin`'s `pluginConfig` passes through a protobuf `Struct`, \
         so its numbers reach the module as JSON numbers of a double (integral values \
         print as integers). None of this was run against an Istio here.\n"
    );
    let _ = writeln!(s, "## Not supported ({})\n", not_supported.len());
    for line in not_supported {
        let _ = writeln!(s, "- {line}");
    }
    s
}
