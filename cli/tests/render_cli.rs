//! `infergate render` as an operator runs it: the built binary on the seed's objects
//! (`testdata/objects/`, verbatim), from a directory outside the repository.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

/// `testdata/objects/`: the seed's Kubernetes objects.
fn seed_objects() -> PathBuf {
    infergate_artefacts::workspace_root().join("testdata/objects")
}

/// The command line: what it wrote and every unsupported field on stdout; the seed's
/// placeholder hashes, rendered as they are, fail it with the field's path on stderr.
#[test]
fn the_command_prints_what_it_wrote_and_what_it_does_not_support() {
    let dir = tempfile::TempDir::new().unwrap();
    // Outside the repository: the templates are compiled in, as for an installed binary.
    let cwd = tempfile::TempDir::new().unwrap();
    let run = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["render", "--objects"])
            .arg(seed_objects())
            .args(["--flavor", "native", "--out"])
            .arg(dir.path())
            .args(extra)
            .current_dir(cwd.path())
            .output()
            .unwrap()
    };
    let ok = run(&[
        "--no-tenants",
        "--endpoints",
        "llama-70b-bf16=10.0.0.1,10.0.0.2",
    ]);
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for expected in [
        "envoy.yaml",
        "fields.md",
        "InferencePool serving/llama-70b-bf16 spec.selector: pods are not watched",
    ] {
        assert!(stdout.contains(expected), "`{expected}` not in:\n{stdout}");
    }
    // The bare IPs took the pool's target port.
    let eds = std::fs::read_to_string(dir.path().join("eds/pool-0-llama-70b-bf16.json")).unwrap();
    assert!(eds.contains("\"port_value\": 8000"), "{eds}");
    let refused = run(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("TenantQuota tenant-a: spec.identity.apiKeyHashes[0]"),
        "{stderr}"
    );
}
