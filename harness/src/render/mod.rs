//! `infergate render`: the user's own Kubernetes objects (`InferencePool`, `HTTPRoute`,
//! the `ConfigMap` holding the `EndpointPickerConfig`, `InferenceObjective`,
//! `InferenceModelRewrite`, `TenantQuota`) as a gateway's configuration.
//!
//! - [`objects`]: the objects, typed by kind and apiVersion;
//! - [`gateway`]: the objects as the launcher's [`crate::launch::BootstrapParams`], so the
//!   bootstrap comes from `launch::bootstrap::render`, the renderer every harness stack uses:
//!   what the tests run is what users get;
//! - [`istio`]: the same gateway as Istio manifests (`WasmPlugin` for the Wasm flavour,
//!   `EnvoyFilter` for the dynamic module);
//! - [`report`]: what became of every field.
//!
//! [`render`] writes into the output directory: `envoy.yaml` (the bootstrap), `istio.yaml`,
//! `fields.md` (the report), `README.md` (what each file is and the order to apply them),
//! and `eds/` with one example `ClusterLoadAssignment` per pool.

pub mod gateway;
pub mod istio;
pub mod objects;
mod readme;
pub mod report;

use crate::launch::bootstrap::{self, Flavor};
use anyhow::{bail, Context, Result};
use serde_yaml_ng::Value;
use std::net::SocketAddr;
use std::path::PathBuf;

pub use gateway::GatewayInputs;

/// Everything `infergate render` is given.
#[derive(Clone, Debug)]
pub struct RenderOptions {
    /// The objects' directory.
    pub objects: PathBuf,
    /// Where the files go (created if missing).
    pub out: PathBuf,
    /// The gateway's listener (`0.0.0.0:8080`).
    pub listen: SocketAddr,
    /// Envoy's admin interface (`127.0.0.1:9901`).
    pub admin: SocketAddr,
    /// The OCI image of the Wasm module, for the `WasmPlugin`'s `url`.
    pub image: String,
    /// What the objects do not say.
    pub gateway: GatewayInputs,
}

/// What [`render`] produced.
#[derive(Clone, Debug)]
pub struct Rendered {
    /// The bootstrap's path.
    pub bootstrap: PathBuf,
    /// The Istio manifests' path.
    pub istio: PathBuf,
    /// The field report's path.
    pub fields: PathBuf,
    /// The README's path.
    pub readme: PathBuf,
    /// The unsupported fields, one line each.
    pub not_supported: Vec<String>,
}

/// Renders the objects of `opts.objects` into `opts.out`.
pub fn render(opts: &RenderOptions) -> Result<Rendered> {
    if opts.gateway.flavor == Flavor::Plain {
        bail!("render needs the wasm or native flavour (plain has no gateway filters)");
    }
    let mut set = objects::load_dir(&opts.objects)?;
    let gw = gateway::build(&mut set, &opts.gateway)?;
    let mut params = gw.params.clone();
    params.listener_port = opts.listen.port();
    params.admin_port = opts.admin.port();
    let text = bootstrap::render(&params)?;
    let text = with_addresses(&text, opts.listen, opts.admin)?;
    std::fs::create_dir_all(&opts.out)
        .with_context(|| format!("creating {}", opts.out.display()))?;
    let write = |name: &str, body: &str| -> Result<PathBuf> {
        let path = opts.out.join(name);
        std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    };
    let bootstrap = write("envoy.yaml", &text)?;
    let manifests = istio::manifests(&gw, &opts.gateway, &opts.image, &mut set.report)?;
    let istio = write("istio.yaml", &manifests)?;
    let fields = write("fields.md", &set.report.to_markdown())?;
    let readme = write(
        "README.md",
        &readme::text(&gw, opts, &set.report.not_supported_lines()),
    )?;
    Ok(Rendered {
        bootstrap,
        istio,
        fields,
        readme,
        not_supported: set.report.not_supported_lines(),
    })
}

/// The bootstrap with the listener and admin bound to the given addresses (the templates
/// bind loopback, where the launcher runs them).
fn with_addresses(text: &str, listen: SocketAddr, admin: SocketAddr) -> Result<String> {
    let mut v: Value = serde_yaml_ng::from_str(text).context("re-reading the bootstrap")?;
    let set_ip = |v: &mut Value, ip: String| -> Result<()> {
        match v.get_mut("socket_address").and_then(Value::as_mapping_mut) {
            Some(m) => {
                m.insert(Value::from("address"), Value::String(ip));
                Ok(())
            }
            None => bail!("the bootstrap has no socket address where expected"),
        }
    };
    let listeners = v["static_resources"]["listeners"]
        .as_sequence_mut()
        .map(|l| l.iter_mut().collect::<Vec<_>>())
        .unwrap_or_default();
    for l in listeners {
        if let Some(addr) = l.get_mut("address") {
            set_ip(addr, listen.ip().to_string())?;
        }
    }
    if let Some(addr) = v.get_mut("admin").and_then(|a| a.get_mut("address")) {
        set_ip(addr, admin.ip().to_string())?;
    }
    serde_yaml_ng::to_string(&v).context("serialising the bootstrap")
}
