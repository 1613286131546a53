//! Every bootstrap template, rendered in its deployment form, with the `/rr` baseline, and
//! with routes across pools (weighted clusters, sticky on `x-gateway-split-key`, a
//! header-targeted rule, and the gateway's subset hint), passes `envoy --mode validate` of the real Envoy 1.40.0 (so the
//! Wasm plugins' `failure_policy: FAIL_RELOAD`, the client timeouts, the override_host
//! pool clusters and their retry policy are accepted). The `wasm` and
//! `native` templates load their module to validate, so they are skipped (with a printed
//! reason) when the module is not built.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use infergate_cli::config::bootstrap::{render, write_eds_files, BootstrapParams};
use infergate_harness::launch::binary::envoy_binary;
use infergate_harness::launch::process::RunDir;
use infergate_harness::launch::{
    EdsDir, Flavor, GatewaySettings, Membership, PluginConfigs, Pool, RouteSpec,
};
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
    // EDS membership (file-based EDS; the picker and the scraper follow the clusters; the
    // Wasm flavour's admin cluster) with an active health check of every member.
    if flavor != Flavor::Plain {
        let dir = RunDir::new("validate-eds").unwrap();
        let mut params = BootstrapParams::new(flavor, pools.clone());
        params.membership = Membership::Eds;
        params.eds = Some(EdsDir::create(dir.path().join("eds")).unwrap());
        params.admin_port = 19999;
        params.health_check = Some(std::time::Duration::from_millis(200));
        write_eds_files(&params).unwrap();
        let yaml = render(&params).unwrap();
        // A host EDS removes must leave the cluster even while it passes its check.
        assert_eq!(
            yaml.matches("ignore_health_on_host_removal: true").count(),
            pools.len(),
            "every pool cluster drops removed hosts at once:\n{yaml}"
        );
        validate_rendered(flavor, &yaml);
    }
    // Two pools of one model: a header-targeted rule, then a sticky split (one weight 0:
    // a rollback) and a per-request one on another model.
    let mut canary = Pool::new("org/model-a", vec![a(9004)]);
    canary.name = Some("model-a-fp8".into());
    let mut c = Pool::new("c", vec![a(9005)]);
    c.name = Some("c-bis".into());
    let pools = vec![
        pools[0].clone(),
        canary,
        pools[1].clone(),
        Pool::new("c", vec![a(9006)]),
        c,
    ];
    // The modules check their own configurations; here only Envoy's shapes are under
    // test, so they get one pool per model (two pools of one model: the e2e pools suite).
    let plugins = PluginConfigs::for_pools(
        &[pools[0].clone(), pools[2].clone(), pools[3].clone()],
        &GatewaySettings::default(),
    );
    let params = BootstrapParams {
        plugins,
        // The gateway's subset hint (set_metadata in front of the gateway filters).
        subset_hint: if flavor == Flavor::Plain {
            Vec::new()
        } else {
            vec![a(9001), a(9004)]
        },
        routes: vec![
            RouteSpec::split("org/model-a", &[(0, 100), (1, 0)]).sticky(),
            RouteSpec::to("org/model-a", 1).when_header("x-canary", "fp8"),
            RouteSpec::split("c", &[(3, 30), (4, 70)]),
        ],
        ..BootstrapParams::new(flavor, pools)
    };
    validate_rendered(flavor, &render(&params).unwrap());
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
