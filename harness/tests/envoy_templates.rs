//! Every bootstrap template, rendered in its deployment form and with the `/rr` baseline,
//! passes `envoy --mode validate` of the real Envoy 1.40.0 (so the Wasm plugins'
//! `failure_policy: FAIL_RELOAD` and the client timeouts are accepted). The `wasm` and
//! `native` templates load their module to validate, so they are skipped (with a printed
//! reason) when the module is not built.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infergate_harness::launch::binary::envoy_binary;
use infergate_harness::launch::bootstrap::{render, BootstrapParams};
use infergate_harness::launch::process::RunDir;
use infergate_harness::launch::{Flavor, Pool};
use std::net::SocketAddr;
use std::process::Command;

fn validate(flavor: Flavor) {
    if let Some(module) = flavor.artefact() {
        if !module.is_file() {
            eprintln!(
                "SKIPPED: validating {flavor} needs {} (cargo xtask build)",
                module.display()
            );
            return;
        }
    }
    let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let mut b = Pool::new("base", vec![a(9003)]);
    b.adapters = vec!["base-lora".into()];
    let pools = vec![Pool::new("org/model-a", vec![a(9001), a(9002)]), b];
    for baseline in [false, true] {
        let params = BootstrapParams {
            baseline,
            ..BootstrapParams::new(flavor, pools.clone())
        };
        validate_rendered(flavor, &render(&params).unwrap());
    }
}

fn validate_rendered(flavor: Flavor, yaml: &str) {
    let dir = RunDir::new("validate").unwrap();
    let file = dir.path().join(format!("{flavor}.yaml"));
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(envoy_binary().unwrap())
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "warning",
            "-c",
        ])
        .arg(&file)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{flavor} template rejected:\n{text}\n--- rendered:\n{yaml}"
    );
    assert!(text.contains("OK"), "{text}");
}

#[test]
fn plain_template_validates() {
    validate(Flavor::Plain);
}

#[test]
fn wasm_template_validates() {
    validate(Flavor::Wasm);
}

#[test]
fn native_template_validates() {
    validate(Flavor::Native);
}

#[test]
fn a_broken_bootstrap_is_rejected_by_validate() {
    // Proves the validation above can fail: an unknown cluster in a route is an error.
    let params = BootstrapParams {
        baseline: true,
        ..BootstrapParams::new(Flavor::Plain, vec![Pool::new("m", vec![])])
    };
    let yaml = render(&params)
        .unwrap()
        .replace("cluster: rr\n", "cluster: no-such-cluster\n");
    let dir = RunDir::new("validate-bad").unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(envoy_binary().unwrap())
        .args(["--mode", "validate", "-l", "warning", "-c"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
}
