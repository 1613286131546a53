//! CPU profiles of a running process as SVG flame graphs (`bench overhead --profile`).
//!
//! [`Recording::start`] attaches `perf record` (Debian's `linux-perf`) to a process, with
//! DWARF call graphs (Envoy is built without frame pointers) at [`SAMPLE_HZ`];
//! [`Recording::finish`] stops it with SIGINT, reads the samples back with `perf script`,
//! folds the stacks and renders the flame graph with the `inferno` crate. The profile is
//! the process's own CPU whatever else the machine runs: kernel time on its behalf
//! included, other processes not.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use inferno::collapse::perf::{Folder, Options as FoldOptions};
use inferno::collapse::Collapse;
use inferno::flamegraph::{self, Options as GraphOptions};
use tokio::process::{Child, Command};

/// Samples per second and thread: few enough that a window of some seconds stays a few
/// tens of MB of DWARF stacks.
pub const SAMPLE_HZ: u32 = 499;

/// Bytes of stack copied per sample for DWARF unwinding.
const STACK_BYTES: u32 = 16_384;

/// Whether `perf` can record here (the binary exists and may attach to our own children).
pub async fn available() -> bool {
    Command::new("perf")
        .args(["record", "-q", "-o", "/dev/null", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A `perf record` attached to one process.
pub struct Recording {
    child: Child,
    data: PathBuf,
    title: String,
}

impl Recording {
    /// Starts sampling `pid` into `data` (a `perf.data` file); `title` heads the graph.
    pub fn start(pid: u32, data: &Path, title: &str) -> Result<Recording> {
        let child = Command::new("perf")
            .arg("record")
            .args(["-q", "-F", &SAMPLE_HZ.to_string()])
            .args(["--call-graph", &format!("dwarf,{STACK_BYTES}")])
            .args(["-p", &pid.to_string()])
            .arg("-o")
            .arg(data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting `perf record` (Debian package linux-perf)")?;
        Ok(Recording {
            child,
            data: data.to_path_buf(),
            title: title.to_string(),
        })
    }

    /// Stops sampling and writes the flame graph to `svg`.
    pub async fn finish(self, svg: &Path) -> Result<()> {
        if let Some(pid) = self.child.id() {
            let pid = i32::try_from(pid).context("perf's pid")?;
            // SAFETY: kill(2) on our own child's pid; no memory is involved.
            unsafe {
                libc::kill(pid, libc::SIGINT);
            }
        }
        let out = tokio::time::timeout(Duration::from_secs(60), self.child.wait_with_output())
            .await
            .context("`perf record` did not stop within 60 s")??;
        if !self.data.exists() {
            bail!(
                "`perf record` wrote no samples ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let script = Command::new("perf")
            .args(["script", "-i"])
            .arg(&self.data)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .output()
            .await
            .context("running `perf script`")?;
        if !script.status.success() {
            bail!("`perf script` failed: {}", script.status);
        }
        render(&script.stdout, &self.title, svg)
    }
}

/// Folds `perf script` output and renders it as an SVG flame graph at `svg`.
pub fn render(perf_script: &[u8], title: &str, svg: &Path) -> Result<()> {
    let mut folded = Vec::new();
    Folder::from(FoldOptions::default())
        .collapse(perf_script, &mut folded)
        .context("folding perf stacks")?;
    if folded.is_empty() {
        bail!("no samples to draw for {title}");
    }
    let mut options = GraphOptions::default();
    options.title = title.to_string();
    // perf weighs each sample by its event count: nanoseconds for cpu-clock, cycles for a
    // hardware counter.
    options.count_name = "perf event count".into();
    let file = std::fs::File::create(svg).with_context(|| format!("creating {}", svg.display()))?;
    flamegraph::from_reader(
        &mut options,
        folded.as_slice(),
        std::io::BufWriter::new(file),
    )
    .context("rendering the flame graph")?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Two samples of `perf script`'s format: the graph names both leaf functions.
    #[test]
    fn perf_script_output_becomes_a_flame_graph() {
        let script = b"envoy 100/101 [000] 1.000001: 1 cpu-clock:ppp: \n\
\t    aaaa parse_body (/lib/libinfergate_envoy.so)\n\
\t    bbbb on_request_body (/lib/libinfergate_envoy.so)\n\
\t    cccc main (/bin/envoy)\n\
\n\
envoy 100/101 [000] 1.000002: 1 cpu-clock:ppp: \n\
\t    dddd hash_blocks (/lib/libinfergate_envoy.so)\n\
\t    cccc main (/bin/envoy)\n\
\n";
        let svg = std::env::temp_dir().join(format!("infergate-flame-{}.svg", std::process::id()));
        render(script, "test arm", &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<?xml"), "{}", &text[..60.min(text.len())]);
        for name in ["parse_body", "hash_blocks", "test arm"] {
            assert!(text.contains(name), "{name} missing");
        }
        assert!(render(b"", "empty", &svg).is_err());
    }

    /// A real recording of a busy child process (where perf can attach).
    #[tokio::test]
    async fn records_a_running_process() {
        if !available().await {
            eprintln!("perf cannot record here: skipped");
            return;
        }
        let mut busy = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let dir = std::env::temp_dir();
        let data = dir.join(format!("infergate-perf-{}.data", std::process::id()));
        let svg = dir.join(format!("infergate-perf-{}.svg", std::process::id()));
        let rec = Recording::start(busy.id().unwrap(), &data, "busy sh").unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        rec.finish(&svg).await.unwrap();
        busy.kill().await.unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("busy sh") && text.contains("perf event count"));
        let _ = std::fs::remove_file(data);
    }
}
