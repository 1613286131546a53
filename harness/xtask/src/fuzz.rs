//! `cargo xtask fuzz [TARGET] [--seconds N] [--log-dir DIR]`: runs each fuzz target (or
//! one) for N seconds (default 60), one after the other, with `cargo +nightly fuzz run`.
//! `cargo xtask fuzz --build` only builds them ([`build_targets`], what CI runs).
//!
//! The targets are the binaries of `harness/fuzz/fuzz/` (one per `fuzz_targets/*.rs`),
//! whose bodies are in `harness/fuzz/src` and are replayed on stable by `cargo test`. Each
//! run reads its seeds from `testdata/fuzz/<target>/` and keeps what it discovers in
//! `target/fuzz-corpus/<target>/` (a scratch corpus that later runs start from too; the
//! committed seeds never change behind anyone's back). A crash is written to
//! `target/fuzz-artifacts/<target>/`: minimise it, fix it, and add it to
//! `testdata/fuzz/<target>/` as `crash-<what>` so every test run replays it. libFuzzer's
//! output goes to `<log dir>/fuzz-<target>.log` (default `target/fuzz-logs/`); the summary
//! printed at the end gives each target's executions and coverage (`cov:` edges, `ft:`
//! features) from libFuzzer's final stats line.
//!
//! Needs the nightly toolchain and cargo-fuzz; on a fresh machine:
//! `rustup toolchain install nightly && cargo install cargo-fuzz --locked`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::artefacts::{target_dir, workspace_root};

const DEFAULT_SECONDS: u64 = 60;
const INSTALL: &str = "rustup toolchain install nightly && cargo install cargo-fuzz --locked";

/// The cargo-fuzz crate.
fn fuzz_dir() -> PathBuf {
    workspace_root().join("harness/fuzz/fuzz")
}

/// Where the fuzz builds go, apart from the stable ones (other flags, other toolchain).
fn fuzz_target_dir() -> PathBuf {
    target_dir().join("fuzz")
}

/// Every target, by name: the files of `fuzz_targets/`.
pub fn targets() -> Result<Vec<String>> {
    let dir = fuzz_dir().join("fuzz_targets");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "rs").then(|| p.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort();
    Ok(names)
}

fn cargo_fuzz(args: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly").arg("fuzz").args(args);
    cmd.current_dir(workspace_root());
    // Set by the stable `cargo run` that started xtask; the nightly build picks its own.
    cmd.env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO_TARGET_DIR");
    cmd
}

fn check_tools() -> Result<()> {
    let ok = cargo_fuzz(&["--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        bail!("`cargo +nightly fuzz` is not available; install it with: {INSTALL}");
    }
    Ok(())
}

/// Builds every fuzz target (`cargo +nightly fuzz build`), as CI does to keep them compiling.
pub fn build_targets() -> Result<()> {
    check_tools()?;
    let fuzz = fuzz_dir();
    let target = fuzz_target_dir();
    let status = cargo_fuzz(&["build", "--fuzz-dir"])
        .arg(&fuzz)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .context("running cargo +nightly fuzz build")?;
    if !status.success() {
        bail!("cargo +nightly fuzz build failed ({status})");
    }
    Ok(())
}

/// `cargo xtask fuzz --help`'s text after its first line.
pub const ABOUT: &str = "\
Each fuzz target (or one) for N seconds on nightly, or only build them.

Runs each `cargo fuzz` target (request parser, canonical prompt, Prometheus parser, snapshot
codec, handoff codec, response usage stream, tenancy objects, flow-control configuration and
queues, worker/owner messages, model rewrite objects and the body rewrite, Envoy's admin
/clusters answer, KV event batches) one after the other with `cargo +nightly fuzz run`:
seeds from testdata/fuzz/<target>/, new corpus entries kept in target/fuzz-corpus/<target>/,
a crash written to target/fuzz-artifacts/<target>/; prints each target's executions and
coverage. Needs the nightly toolchain and cargo-fuzz:
`rustup toolchain install nightly && cargo install cargo-fuzz --locked`.";

/// The command-line arguments of `cargo xtask fuzz`.
#[derive(Debug, PartialEq, Eq, clap::Args)]
pub struct FuzzArgs {
    /// Only build every target (`cargo +nightly fuzz build`), as CI does
    #[arg(long = "build")]
    build_only: bool,
    /// The one target to run (a file name of harness/fuzz/fuzz/fuzz_targets/ without
    /// `.rs`) [default: every target]
    #[arg(verbatim_doc_comment, next_line_help = true, value_name = "TARGET")]
    target: Option<String>,
    /// Seconds per target
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SECONDS, value_parser = seconds)]
    seconds: u64,
    /// Where libFuzzer's output goes, `fuzz-<target>.log` per target [default:
    /// target/fuzz-logs]
    #[arg(verbatim_doc_comment, next_line_help = true, long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
}

/// `--seconds N`: a positive integer.
fn seconds(v: &str) -> std::result::Result<u64, String> {
    v.parse()
        .ok()
        .filter(|s| *s > 0)
        .ok_or_else(|| format!("`{v}` is not a positive integer"))
}

/// What one run reported: libFuzzer's final counts, or why there are none.
#[derive(Debug, Default, PartialEq, Eq)]
struct Stats {
    /// Executions (`#N` of the final stats line, or `Done N runs`).
    runs: Option<u64>,
    /// Covered edges (`cov:`).
    cov: Option<u64>,
    /// Coverage features (`ft:`).
    ft: Option<u64>,
    /// Corpus entries and size (`corp:`), as libFuzzer prints them.
    corpus: Option<String>,
}

/// The number after `key` in a libFuzzer status line (`cov: 123`).
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    line.get(at..)?.split_whitespace().next()
}

/// Reads the last status line (`#N ... cov: C ft: F corp: ...`) and the `Done N runs` line.
fn parse_log(log: &str) -> Stats {
    let mut s = Stats::default();
    for line in log.lines() {
        if let Some(rest) = line.strip_prefix("Done ") {
            s.runs = rest.split_whitespace().next().and_then(|n| n.parse().ok());
        } else if line.starts_with('#') && line.contains("cov: ") {
            let n = line
                .get(1..)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok());
            s.runs = n.or(s.runs);
            s.cov = field(line, "cov: ").and_then(|v| v.parse().ok());
            s.ft = field(line, "ft: ").and_then(|v| v.parse().ok());
            s.corpus = field(line, "corp: ").map(str::to_owned);
        }
    }
    s
}

fn show(v: Option<u64>) -> String {
    v.map_or_else(|| "?".into(), |n| n.to_string())
}

/// Runs one target for `seconds`, logging libFuzzer's output to `log`.
fn run_target(name: &str, seconds: u64, log: &Path) -> Result<(Stats, bool)> {
    let root = workspace_root();
    let seeds = root.join("testdata/fuzz").join(name);
    let scratch = target_dir().join("fuzz-corpus").join(name);
    let artifacts = target_dir().join("fuzz-artifacts").join(name);
    for d in [&scratch, &artifacts] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    eprintln!(
        "fuzz: {name} for {seconds} s (log {}, new corpus entries in {})",
        log.display(),
        scratch.display()
    );
    let mut cmd = cargo_fuzz(&["run", "--fuzz-dir"]);
    cmd.arg(fuzz_dir())
        .arg("--target-dir")
        .arg(fuzz_target_dir())
        .arg(name)
        // libFuzzer writes new entries to the first directory only.
        .arg(&scratch)
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={seconds}"))
        // A later flag wins over cargo-fuzz's own prefix inside the fuzz crate.
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .stdout(out)
        .stderr(err);
    let status = cmd
        .status()
        .with_context(|| format!("running cargo +nightly fuzz run {name}"))?;
    let text = std::fs::read_to_string(log).unwrap_or_default();
    Ok((parse_log(&text), status.success()))
}

/// Entry point of `cargo xtask fuzz`.
pub fn run(a: FuzzArgs) -> Result<()> {
    if a.build_only {
        return build_targets();
    }
    let all = targets()?;
    let chosen: Vec<String> = match &a.target {
        Some(t) if all.contains(t) => vec![t.clone()],
        Some(t) => bail!("no fuzz target `{t}` (known: {})", all.join(", ")),
        None => all,
    };
    check_tools()?;
    let log_dir = a
        .log_dir
        .clone()
        .unwrap_or_else(|| target_dir().join("fuzz-logs"));
    std::fs::create_dir_all(&log_dir).with_context(|| format!("creating {}", log_dir.display()))?;
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for name in &chosen {
        let log = log_dir.join(format!("fuzz-{name}.log"));
        let (stats, ok) = run_target(name, a.seconds, &log)?;
        if !ok {
            failed.push(format!("{name} (see {})", log.display()));
        }
        rows.push((name.clone(), stats, ok));
    }
    println!(
        "{:<20} {:>12} {:>8} {:>8}  {:<14} result",
        "target", "executions", "cov", "ft", "corpus"
    );
    for (name, s, ok) in &rows {
        println!(
            "{:<20} {:>12} {:>8} {:>8}  {:<14} {}",
            name,
            show(s.runs),
            show(s.cov),
            show(s.ft),
            s.corpus.as_deref().unwrap_or("?"),
            if *ok { "ok" } else { "FAILED" }
        );
    }
    if !failed.is_empty() {
        bail!(
            "fuzzing found a failure in: {}; reproducers are in {}",
            failed.join(", "),
            target_dir().join("fuzz-artifacts").display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn parse_args(args: &[&str]) -> std::result::Result<FuzzArgs, clap::Error> {
        match crate::tests::parse(&[&["fuzz"][..], args].concat()) {
            Ok(crate::Command::Fuzz(args)) => Ok(args),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        }
    }

    #[test]
    fn arguments() {
        assert_eq!(
            parse_args(&[]).unwrap(),
            FuzzArgs {
                build_only: false,
                target: None,
                seconds: 60,
                log_dir: None
            }
        );
        let a = parse_args(&["request_parser", "--seconds", "5"]).unwrap();
        assert_eq!(
            (a.target.as_deref(), a.seconds),
            (Some("request_parser"), 5)
        );
        let a = parse_args(&["--log-dir", "/tmp/l", "--seconds", "5", "--seconds", "7"]).unwrap();
        assert_eq!((a.log_dir, a.seconds), (Some(PathBuf::from("/tmp/l")), 7));
        assert!(parse_args(&["--seconds", "0"]).is_err());
        assert!(parse_args(&["--seconds"]).is_err());
        assert!(parse_args(&["a", "b"]).is_err());
        assert!(parse_args(&["--fast"]).is_err());
        assert!(parse_args(&["--build"]).unwrap().build_only);
        assert!(parse_args(&["--build", "--build"]).unwrap().build_only);
    }

    #[test]
    fn final_stats_are_read_from_the_log() {
        let log = "INFO: Seed: 1\n#2\tINITED cov: 10 ft: 11 corp: 3/1b exec/s: 0 rss: 30Mb\n\
                   #900\tNEW    cov: 2100 ft: 7000 corp: 900/600Kb lim: 4096 exec/s: 7000 rss: 400Mb L: 3/9 MS: 1 ChangeBit-\n\
                   #72346\tDONE   cov: 2181 ft: 7848 corp: 1021/693Kb lim: 9029 exec/s: 6576 rss: 441Mb\n\
                   Done 72346 runs in 11 second(s)\n";
        assert_eq!(
            parse_log(log),
            Stats {
                runs: Some(72346),
                cov: Some(2181),
                ft: Some(7848),
                corpus: Some("1021/693Kb".into())
            }
        );
        assert_eq!(parse_log("garbage"), Stats::default());
    }

    #[test]
    fn every_target_has_seeds() {
        let names = targets().unwrap();
        assert!(names.len() >= 9, "{names:?}");
        for n in names {
            let seeds = workspace_root().join("testdata/fuzz").join(&n);
            assert!(seeds.is_dir(), "{}", seeds.display());
        }
    }
}
