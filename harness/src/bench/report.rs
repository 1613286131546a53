//! Small helpers shared by the benchmark reports: percentiles of latency samples, a
//! plain-text table, and the CPU time a process has used (so a proxy's cost per request can
//! be read independently of how busy the shared machine was).

use std::fmt::Write;
use std::time::Duration;

/// Nearest-rank percentile of sorted microsecond samples (0 when empty).
pub fn percentile_us(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len()) - 1)
        .copied()
        .unwrap_or(0)
}

/// Median of unsorted values (0 when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v.get(n / 2).copied().unwrap_or(0.0),
        _ => {
            let a = v.get(n / 2 - 1).copied().unwrap_or(0.0);
            let b = v.get(n / 2).copied().unwrap_or(0.0);
            (a + b) / 2.0
        }
    }
}

/// A plain-text table: a header row, then one row per `(label, cells)`, right-aligned.
pub fn table(header: &[String], rows: &[(String, Vec<String>)]) -> String {
    let label_w = rows
        .iter()
        .map(|r| r.0.len())
        .chain(header.first().map(String::len))
        .max()
        .unwrap_or(0);
    let columns = header.len().saturating_sub(1);
    let col_w: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.1.get(i))
                .chain(header.get(i + 1))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |label: &str, cells: &mut dyn Iterator<Item = &String>| {
        let _ = write!(out, "{label:<label_w$}");
        for (cell, w) in cells.zip(&col_w) {
            let _ = write!(out, "  {cell:>w$}");
        }
        out.push('\n');
    };
    line(
        header.first().map(String::as_str).unwrap_or(""),
        &mut header.iter().skip(1),
    );
    for (label, cells) in rows {
        line(label, &mut cells.iter());
    }
    out
}

/// CPU time (user + system) used so far by every thread of process `pid`, from
/// `/proc/<pid>/task/*/schedstat` (nanoseconds on CPU). `None` off Linux or when the
/// process is gone.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let ns: u64 = tasks
        .flatten()
        .filter_map(|task| schedstat_ns(&task.path().join("schedstat")))
        .sum();
    Some(Duration::from_nanos(ns))
}

/// CPU time used so far by the main thread of process `pid` (the task whose id is the
/// process's), from its `schedstat`. Envoy's main thread: its admin, xDS, stats flushes,
/// and the Wasm VM it runs per plugin, where the elected picker state owner often lives.
pub fn main_thread_cpu(pid: u32) -> Option<Duration> {
    schedstat_ns(std::path::Path::new(&format!(
        "/proc/{pid}/task/{pid}/schedstat"
    )))
    .map(Duration::from_nanos)
}

/// A task's nanoseconds on CPU: the first field of its `schedstat`.
fn schedstat_ns(path: &std::path::Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// `1234 µs` → `"1.23 ms"`.
pub fn ms(us: u32) -> String {
    format!("{:.2} ms", f64::from(us) / 1000.0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_main_thread_within_its_total() {
        let pid = std::process::id();
        let main = main_thread_cpu(pid).unwrap();
        let all = process_cpu(pid).unwrap();
        assert!(main <= all, "{main:?} > {all:?}");
        assert_eq!(main_thread_cpu(u32::MAX), None);
    }

    #[test]
    fn percentiles_and_medians() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile_us(&v, 50.0), 50);
        assert_eq!(percentile_us(&v, 99.0), 99);
        assert_eq!(percentile_us(&[], 50.0), 0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["what".into(), "a".into(), "bbbb".into()],
            &[("row".into(), vec!["1".into(), "22".into()])],
        );
        assert_eq!(t, "what  a  bbbb\nrow   1    22\n");
    }

    #[test]
    fn own_cpu_time_is_readable_and_grows() {
        // A busy single-threaded child, not this test binary: the binary's other test
        // threads exit while this test runs, and an exited thread's time leaves the sum.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 100000000 ]; do i=$((i+1)); done"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let before = process_cpu(pid).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let after = process_cpu(pid).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(after > before);
    }
}
