//! A proxy-wasm module as an OCI image layout (the directory form of an image: `oci-layout`,
//! `index.json`, `blobs/sha256/<hex>`), in the shape Istio's `WasmPlugin` pulls from an
//! `oci://` URL once the layout is copied to a registry.
//!
//! The shape is the *oci* variant of the Wasm image specification that Istio's image
//! fetcher implements, as the `wasme` tool pushed it:
//!
//! - an image manifest (`application/vnd.oci.image.manifest.v1+json`) whose config is the
//!   runtime config (`application/vnd.module.wasm.config.v1+json`: `type: envoy_proxy`,
//!   the proxy-wasm ABI versions, the root ids);
//! - exactly two layers, which Istio's fetcher insists on for this variant (one layer is
//!   refused with "number of layers must be 2"): the same runtime config blob, then the
//!   module bytes as they are (`application/vnd.module.wasm.content.layer.v1+wasm`, not
//!   compressed), so the Wasm layer's digest is the module's sha256;
//! - manifest annotations for the runtime type, ABI, title and version; the index entry
//!   carries the tag as `org.opencontainers.image.ref.name`.
//!
//! Nothing varies between runs (no timestamps; JSON keys sorted), so the same module gives
//! the same manifest digest, which is what Istio compares a `WasmPlugin`'s `sha256` with.

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Map, Value};
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};

/// Media type of an OCI image manifest.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of an OCI image index (`index.json`).
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// Media type of the Wasm runtime config (the manifest's config, and the first layer).
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.module.wasm.config.v1+json";
/// Media type of the layer that holds the module bytes, uncompressed.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/vnd.module.wasm.content.layer.v1+wasm";
/// The index annotation that names a manifest's tag (what `oci:<dir>:<tag>` looks up).
pub const REF_NAME_ANNOTATION: &str = "org.opencontainers.image.ref.name";
/// The version the `oci-layout` file declares.
const LAYOUT_VERSION: &str = "1.0.0";
/// Title annotations of the two layers (the file names `wasme` gave them).
const CONFIG_TITLE: &str = "runtime-config.json";
const MODULE_TITLE: &str = "plugin.wasm";
/// The first eight bytes of every Wasm binary module: `\0asm` and version 1. Istio refuses a
/// fetched binary that does not start with the magic.
const WASM_HEADER: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];

/// A content digest, `sha256:<64 lowercase hex>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest(String);

impl Digest {
    /// The sha256 digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex(&Sha256::digest(bytes))))
    }

    /// The 64 hex digits alone (a blob's file name; what `sha256sum` prints).
    pub fn hex(&self) -> &str {
        self.0.strip_prefix("sha256:").unwrap_or(&self.0)
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// What the runtime config tells a Wasm host about the module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// proxy-wasm ABI versions the module exports (`0.2.1` for `proxy_abi_version_0_2_1`).
    pub abi_versions: Vec<String>,
    /// Root contexts the module registers (a plugin's `root_id` must be one of them).
    pub root_ids: Vec<String>,
}

impl RuntimeConfig {
    /// The config blob: `{"abiVersions":[..],"config":{"rootIds":[..]},"type":"envoy_proxy"}`.
    pub fn to_json(&self) -> Vec<u8> {
        let value = json!({
            "type": "envoy_proxy",
            "abiVersions": self.abi_versions,
            "config": {"rootIds": self.root_ids},
        });
        value.to_string().into_bytes()
    }
}

/// One module to lay out as an image.
#[derive(Clone, Debug)]
pub struct WasmImage<'a> {
    /// The module's bytes, stored unchanged as the Wasm layer.
    pub module: &'a [u8],
    /// The runtime config (the manifest's config and the first layer).
    pub runtime: RuntimeConfig,
    /// The tag (`oci:<dir>:<tag>`, and the tag to push it under), e.g. the version.
    pub tag: &'a str,
    /// Extra manifest annotations (title, version, source), beside the runtime's own.
    pub annotations: Vec<(String, String)>,
}

/// Digests of what [`write_layout`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    /// The manifest's digest: the image digest a registry reports and Istio checks a
    /// `WasmPlugin`'s `sha256` (or an `@sha256:` URL) against.
    pub manifest: Digest,
    /// The runtime config's digest.
    pub config: Digest,
    /// The Wasm layer's digest: the sha256 of the module bytes.
    pub module: Digest,
}

/// Writes `image` as an OCI image layout into `dir` (created if missing; must not hold a
/// layout already, so nothing stale survives).
pub fn write_layout(dir: &Path, image: &WasmImage) -> Result<Written> {
    ensure!(
        image.module.starts_with(&WASM_HEADER),
        "the module does not start with the Wasm header (\\0asm, version 1)"
    );
    ensure!(
        valid_tag(image.tag),
        "tag `{}`: want 1 to 128 of [A-Za-z0-9_.-], not starting with . or -",
        image.tag
    );
    ensure!(
        !dir.join("index.json").exists(),
        "{} already holds an image layout",
        dir.display()
    );
    let config = image.runtime.to_json();
    let config_digest = write_blob(dir, &config)?;
    let module_digest = write_blob(dir, image.module)?;

    let mut annotations = Map::new();
    annotations.insert("module.wasm.runtime/type".into(), "envoy_proxy".into());
    annotations.insert(
        "module.wasm.runtime/abi_version".into(),
        image.runtime.abi_versions.join(",").into(),
    );
    for (key, value) in &image.annotations {
        annotations.insert(key.clone(), value.clone().into());
    }
    let config_descriptor = descriptor(CONFIG_MEDIA_TYPE, &config_digest, config.len(), None);
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config_descriptor,
        "layers": [
            descriptor(CONFIG_MEDIA_TYPE, &config_digest, config.len(), Some(CONFIG_TITLE)),
            descriptor(
                WASM_LAYER_MEDIA_TYPE,
                &module_digest,
                image.module.len(),
                Some(MODULE_TITLE),
            ),
        ],
        "annotations": annotations,
    })
    .to_string()
    .into_bytes();
    let manifest_digest = write_blob(dir, &manifest)?;

    let mut entry = descriptor(MANIFEST_MEDIA_TYPE, &manifest_digest, manifest.len(), None);
    entry["annotations"] = json!({ REF_NAME_ANNOTATION: image.tag });
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [entry],
    });
    write_file(
        &dir.join("oci-layout"),
        json!({ "imageLayoutVersion": LAYOUT_VERSION })
            .to_string()
            .as_bytes(),
    )?;
    // Last: a layout without its index is no layout, so a failure above leaves none.
    write_file(&dir.join("index.json"), index.to_string().as_bytes())?;
    Ok(Written {
        manifest: manifest_digest,
        config: config_digest,
        module: module_digest,
    })
}

/// What [`read_layout`] found behind a tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The manifest's digest.
    pub manifest: Digest,
    /// The Wasm layer's digest.
    pub module: Digest,
    /// The module bytes (the Wasm layer's blob).
    pub module_bytes: Vec<u8>,
    /// The runtime config, as stored.
    pub config: Value,
}

/// Reads the image tagged `tag` in the layout at `dir` and checks what Istio's fetcher and
/// the layout specification need: the index names the tag once, every blob's content
/// matches its digest and size, the manifest and config have the Wasm media types, there
/// are exactly two layers and one of them is the module, which starts with the Wasm header.
pub fn read_layout(dir: &Path, tag: &str) -> Result<Found> {
    let layout: Value = read_json(&dir.join("oci-layout"))?;
    ensure!(
        layout["imageLayoutVersion"] == LAYOUT_VERSION,
        "oci-layout: imageLayoutVersion is {}, want {LAYOUT_VERSION}",
        layout["imageLayoutVersion"]
    );
    let index: Value = read_json(&dir.join("index.json"))?;
    let tagged: Vec<&Value> = index["manifests"]
        .as_array()
        .context("index.json: manifests is not a list")?
        .iter()
        .filter(|m| m["annotations"][REF_NAME_ANNOTATION] == tag)
        .collect();
    let [entry] = tagged.as_slice() else {
        bail!(
            "index.json: {} manifests are tagged `{tag}`, want 1",
            tagged.len()
        );
    };
    expect_media_type(entry, MANIFEST_MEDIA_TYPE, "index.json: manifests[]")?;
    let (manifest_digest, manifest_bytes) = read_blob(dir, entry, "index.json: manifests[]")?;
    let manifest: Value = serde_json::from_slice(&manifest_bytes).context("manifest: not JSON")?;
    ensure!(
        manifest["schemaVersion"] == 2,
        "manifest: schemaVersion is {}, want 2",
        manifest["schemaVersion"]
    );
    expect_media_type(&manifest, MANIFEST_MEDIA_TYPE, "manifest")?;
    expect_media_type(&manifest["config"], CONFIG_MEDIA_TYPE, "manifest: config")?;
    let (_, config_bytes) = read_blob(dir, &manifest["config"], "manifest: config")?;
    let config: Value =
        serde_json::from_slice(&config_bytes).context("manifest: config: not JSON")?;
    let layers = manifest["layers"]
        .as_array()
        .context("manifest: layers is not a list")?;
    ensure!(
        layers.len() == 2,
        "manifest: layers has {} entries; Istio's fetcher takes this variant with exactly 2",
        layers.len()
    );
    let wasm: Vec<&Value> = layers
        .iter()
        .filter(|l| l["mediaType"] == WASM_LAYER_MEDIA_TYPE)
        .collect();
    let [wasm] = wasm.as_slice() else {
        bail!(
            "manifest: layers: {} have mediaType {WASM_LAYER_MEDIA_TYPE}, want 1",
            wasm.len()
        );
    };
    for (i, layer) in layers.iter().enumerate() {
        read_blob(dir, layer, &format!("manifest: layers[{i}]"))?;
    }
    let (module, module_bytes) = read_blob(dir, wasm, "manifest: wasm layer")?;
    ensure!(
        module_bytes.starts_with(&WASM_HEADER),
        "manifest: wasm layer: the blob does not start with the Wasm header"
    );
    Ok(Found {
        manifest: manifest_digest,
        module,
        module_bytes,
        config,
    })
}

/// The proxy-wasm ABI versions `module` exports (`proxy_abi_version_0_2_1` → `0.2.1`),
/// read from its export section.
pub fn abi_versions(module: &[u8]) -> Result<Vec<String>> {
    const PREFIX: &str = "proxy_abi_version_";
    let versions: Vec<String> = export_names(module)?
        .iter()
        .filter_map(|name| name.strip_prefix(PREFIX))
        .map(|v| v.replace('_', "."))
        .collect();
    ensure!(
        !versions.is_empty(),
        "the module exports no {PREFIX}* function: not a proxy-wasm module"
    );
    Ok(versions)
}

/// The names in a Wasm module's export section (empty when it has none).
pub fn export_names(module: &[u8]) -> Result<Vec<String>> {
    const EXPORT_SECTION: u8 = 7;
    let mut bytes = Reader {
        bytes: module,
        at: 0,
    };
    ensure!(
        bytes.take(WASM_HEADER.len())? == WASM_HEADER,
        "not a Wasm binary module (version 1)"
    );
    while !bytes.done() {
        let id = bytes.take(1)?[0];
        let size = bytes.leb_u32()? as usize;
        let body = bytes.take(size)?;
        if id != EXPORT_SECTION {
            continue;
        }
        let mut section = Reader { bytes: body, at: 0 };
        let count = section.leb_u32()?;
        let mut names = Vec::new();
        for _ in 0..count {
            let len = section.leb_u32()? as usize;
            let name = std::str::from_utf8(section.take(len)?)
                .context("export section: a name is not UTF-8")?;
            names.push(name.to_string());
            section.take(1)?; // export kind
            section.leb_u32()?; // index
        }
        return Ok(names);
    }
    Ok(Vec::new())
}

/// A cursor over a module's bytes; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            bail!(
                "truncated Wasm module: {n} bytes wanted at offset {}",
                self.at
            );
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    /// An unsigned LEB128 of at most 5 bytes (a `u32`).
    fn leb_u32(&mut self) -> Result<u32> {
        let mut value: u32 = 0;
        for shift in (0..35).step_by(7) {
            let byte = self.take(1)?[0];
            value |= u32::from(byte & 0x7f).checked_shl(shift).unwrap_or(0);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        bail!("a LEB128 at offset {} is longer than 5 bytes", self.at)
    }
}

/// A tag as the OCI distribution specification allows it.
fn valid_tag(tag: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    (1..=128).contains(&tag.len()) && tag.chars().all(ok_char) && !tag.starts_with(['.', '-'])
}

fn descriptor(media_type: &str, digest: &Digest, size: usize, title: Option<&str>) -> Value {
    let mut out = json!({
        "mediaType": media_type,
        "digest": digest.as_str(),
        "size": size,
    });
    if let Some(title) = title {
        out["annotations"] = json!({ "org.opencontainers.image.title": title });
    }
    out
}

fn blob_path(dir: &Path, digest: &Digest) -> PathBuf {
    dir.join("blobs").join("sha256").join(digest.hex())
}

fn write_blob(dir: &Path, bytes: &[u8]) -> Result<Digest> {
    let digest = Digest::of(bytes);
    write_file(&blob_path(dir, &digest), bytes)?;
    Ok(digest)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{}: not JSON", path.display()))
}

fn expect_media_type(value: &Value, want: &str, what: &str) -> Result<()> {
    ensure!(
        value["mediaType"] == want,
        "{what}: mediaType is {}, want {want}",
        value["mediaType"]
    );
    Ok(())
}

/// The blob a descriptor names, checked against the descriptor's digest and size.
fn read_blob(dir: &Path, descriptor: &Value, what: &str) -> Result<(Digest, Vec<u8>)> {
    let digest = descriptor["digest"]
        .as_str()
        .with_context(|| format!("{what}: digest is not a string"))?;
    let hex_part = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .with_context(|| format!("{what}: digest `{digest}` is not sha256:<64 hex>"))?;
    let path = dir.join("blobs").join("sha256").join(hex_part);
    let bytes =
        std::fs::read(&path).with_context(|| format!("{what}: reading {}", path.display()))?;
    let actual = Digest::of(&bytes);
    ensure!(
        actual.as_str() == digest,
        "{what}: blob {} has digest {actual}",
        path.display()
    );
    let size = descriptor["size"].as_u64();
    ensure!(
        size == Some(bytes.len() as u64),
        "{what}: size is {}, the blob has {} bytes",
        descriptor["size"],
        bytes.len()
    );
    Ok((actual, bytes))
}
