//! The book's plugin reference (`docs/src/generated/plugins.md`) is what the code says:
//! the committed page equals `infergate_cli::catalogue::markdown()`, and `infergate plugins`
//! prints it. With `INFERGATE_BLESS=1` the test rewrites the page instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use infergate_cli::catalogue::{markdown, PAGE, TEST};
use infergate_cli::reference::check_or_bless;

#[test]
fn the_committed_page_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PAGE);
    if let Err(e) = check_or_bless(&path, &markdown().unwrap(), TEST) {
        panic!("{e}");
    }
}

#[test]
fn infergate_plugins_prints_the_page() {
    let out = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("plugins")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), markdown().unwrap());
}

/// A reader that stops early (`infergate plugins | head`) ends the output quietly: no panic
/// on the closed pipe, exit 0.
#[test]
fn a_closed_pipe_ends_the_output_without_a_panic() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .arg("plugins")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before the child has started writing (it has yet to build its page).
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
