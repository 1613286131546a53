//! The book's plugin reference (`docs/src/generated/plugins.md`) is what the code says:
//! the committed page equals `infergate_cli::catalogue::markdown()`, and `infergate plugins`
//! prints it. With `INFERGATE_BLESS=1` the test rewrites the page instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use infergate_cli::catalogue::{markdown, BLESS, PAGE};

#[test]
fn the_committed_page_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PAGE);
    let rendered = markdown().unwrap();
    if std::env::var("INFERGATE_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &rendered).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == rendered {
        return;
    }
    let line = committed
        .lines()
        .zip(rendered.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(rendered.lines().count()));
    let shown = |text: &str| text.lines().nth(line).unwrap_or("(end of file)").to_owned();
    panic!(
        "{PAGE} is not what the plugin catalogue says (line {}: committed `{}`, code `{}`); \
         regenerate it with `{BLESS}` and commit it",
        line + 1,
        shown(&committed),
        shown(&rendered)
    );
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
