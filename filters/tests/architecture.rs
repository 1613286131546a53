//! The architecture invariants a test can check, read from the sources themselves (see
//! ARCHITECTURE.md, "Invariants"):
//!
//! - the adapters (`envoy/src`, `wasm/src`) never name a stage type: the filters crate's
//!   builder assembles every pipeline, so a new stage is a file in `filters/src/stages/` and
//!   a line in the builder, never an edit across the adapters;
//! - the native adapter's modules import each other without a cycle.
//!
//! Both read Rust sources as text, comments left out (a doc comment may mention a stage or a
//! module without depending on it). Standard library only.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The workspace root (this crate is one of its members).
fn workspace() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// A file's lines with comments removed: everything from `//` on, and `/* ... */` blocks.
/// Good enough for this crate's sources, whose strings hold no `//` before code that matters.
fn code_lines(path: &Path) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut in_block = false;
    text.lines()
        .map(|line| {
            let mut out = String::new();
            let mut rest = line;
            loop {
                if in_block {
                    match rest.find("*/") {
                        Some(end) => {
                            rest = &rest[end + 2..];
                            in_block = false;
                        }
                        None => break,
                    }
                } else {
                    let line_comment = rest.find("//");
                    let block = rest.find("/*");
                    match (line_comment, block) {
                        (Some(l), Some(b)) if b < l => {
                            out.push_str(&rest[..b]);
                            rest = &rest[b + 2..];
                            in_block = true;
                        }
                        (None, Some(b)) => {
                            out.push_str(&rest[..b]);
                            rest = &rest[b + 2..];
                            in_block = true;
                        }
                        (Some(l), _) => {
                            out.push_str(&rest[..l]);
                            break;
                        }
                        (None, None) => {
                            out.push_str(rest);
                            break;
                        }
                    }
                }
            }
            out
        })
        .collect()
}

/// The identifiers of a line of code.
fn identifiers(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
}

/// The trait and the type of an `impl Trait<..> for Type` line (`impl<..>` generics
/// skipped), by their last path segment.
fn trait_impl(line: &str) -> Option<(&str, &str)> {
    let mut rest = line.trim_start().strip_prefix("impl")?;
    if rest.starts_with('<') {
        let mut depth = 0usize;
        let mut end = None;
        for (at, c) in rest.char_indices() {
            match c {
                '<' => depth += 1,
                '>' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = Some(at);
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &rest[end? + 1..];
    } else if !rest.starts_with(char::is_whitespace) {
        return None;
    }
    let (trait_path, type_path) = rest.split_once(" for ")?;
    let trait_path = trait_path.trim();
    let trait_path = trait_path.split('<').next()?;
    let trait_name = trait_path.rsplit("::").next()?.trim();
    let type_name = identifiers(type_path).next()?;
    Some((trait_name, type_name))
}

/// The types that implement the pipeline's stage trait in `filters/src/stages/`: every
/// `impl ... Stage<H> for Type` there.
fn stage_types() -> BTreeSet<String> {
    let mut types = BTreeSet::new();
    for path in rust_files(&workspace().join("filters/src/stages")) {
        for line in code_lines(&path) {
            if let Some(("Stage", name)) = trait_impl(&line) {
                types.insert(name.to_owned());
            }
        }
    }
    types
}

#[test]
fn adapters_never_name_a_stage_type() {
    let stages = stage_types();
    // The stages this test guards must be found, or it would pass on nothing.
    for known in [
        "AuthStage",
        "RouteStage",
        "QuotaStage",
        "UsageStage",
        "PickStage",
    ] {
        assert!(
            stages.contains(known),
            "no `impl Stage<H> for {known}` found in filters/src/stages: {stages:?}"
        );
    }
    let mut named = Vec::new();
    for adapter in ["envoy/src", "wasm/src"] {
        for path in rust_files(&workspace().join(adapter)) {
            for (number, line) in code_lines(&path).iter().enumerate() {
                for word in identifiers(line) {
                    if stages.contains(word) {
                        let file = path.strip_prefix(workspace()).unwrap_or(&path);
                        named.push(format!("{}:{}: {word}", file.display(), number + 1));
                    }
                }
            }
        }
    }
    assert!(
        named.is_empty(),
        "an adapter names a stage type; assemble pipelines in filters' builder instead:\n{}",
        named.join("\n")
    );
}

/// The top-level module of `crate_src` that `path` belongs to (`abi` for `abi/mod.rs` and
/// `abi/callbacks.rs`, `host` for `host.rs`); `None` for the crate root.
fn top_module(crate_src: &Path, path: &Path) -> Option<String> {
    let relative = path.strip_prefix(crate_src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_owned())
}

/// The module path of a file, from the crate root (`["hooks", "http"]` for
/// `hooks/http.rs`, `["abi"]` for `abi/mod.rs`).
fn module_path(crate_src: &Path, path: &Path) -> Vec<String> {
    let Ok(relative) = path.strip_prefix(crate_src) else {
        return Vec::new();
    };
    let mut parts: Vec<String> = relative
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .map(|s| s.strip_suffix(".rs").unwrap_or(s).to_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|p| p == "mod" || p == "lib" || p == "main")
    {
        parts.pop();
    }
    parts
}

/// Which top-level modules each top-level module of the crate at `crate_src` uses: every
/// `crate::<module>` path in its code, and every `super::` path that climbs to the crate
/// root (an indented `super::` is taken to sit in an inline module, as rustfmt lays them
/// out, one level deeper than its file).
fn module_graph(crate_src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(crate_src);
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|p| top_module(crate_src, p))
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &files {
        let Some(from) = top_module(crate_src, path) else {
            continue;
        };
        let file_path = module_path(crate_src, path);
        let uses = graph.entry(from.clone()).or_default();
        for line in code_lines(path) {
            let mut rest = line.as_str();
            while let Some(at) = rest.find("crate::") {
                let before = rest[..at].chars().next_back();
                let after = &rest[at + "crate::".len()..];
                if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
                    if let Some(name) = identifiers(after).next() {
                        if modules.contains(name) {
                            uses.insert(name.to_owned());
                        }
                    }
                }
                rest = after;
            }
            let indented = line.starts_with(char::is_whitespace);
            let mut rest = line.as_str();
            while let Some(at) = rest.find("super::") {
                let before = rest[..at].chars().next_back();
                let mut after = &rest[at..];
                rest = &rest[at + "super::".len()..];
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let mut depth = file_path.len() + usize::from(indented);
                while let Some(tail) = after.strip_prefix("super::") {
                    depth = depth.saturating_sub(1);
                    after = tail;
                }
                if depth == 0 {
                    if let Some(name) = identifiers(after).next() {
                        if modules.contains(name) {
                            uses.insert(name.to_owned());
                        }
                    }
                }
            }
        }
        uses.remove(&from);
    }
    graph
}

/// A cycle of `graph`, as the list of modules along it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack[start..].to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        let mut stack = Vec::new();
        if let Some(cycle) = visit(node, graph, &mut marks, &mut stack) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_cycle_check_sees_a_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let edge = |graph: &mut BTreeMap<String, BTreeSet<String>>, a: &str, b: &str| {
        graph.entry(a.to_owned()).or_default().insert(b.to_owned());
    };
    edge(&mut graph, "filter", "router");
    edge(&mut graph, "router", "pipeline");
    assert_eq!(find_cycle(&graph), None);
    edge(&mut graph, "pipeline", "filter");
    assert_eq!(
        find_cycle(&graph),
        Some(vec![
            "filter".to_owned(),
            "router".to_owned(),
            "pipeline".to_owned(),
            "filter".to_owned()
        ])
    );
}

#[test]
fn the_native_adapter_modules_import_no_cycle() {
    let src = workspace().join("envoy/src");
    let graph = module_graph(&src);
    // The graph must be read, or the test would pass on nothing.
    assert!(
        graph.get("hooks").is_some_and(|uses| uses.contains("abi")),
        "the module graph of envoy/src was not read: {graph:?}"
    );
    let cycle = find_cycle(&graph);
    let mut edges = String::new();
    for (module, uses) in &graph {
        edges.push_str(&format!("\n  {module} -> {uses:?}"));
    }
    assert!(
        cycle.is_none(),
        "envoy/src modules import each other in a cycle: {}\nthe graph:{edges}",
        cycle.unwrap_or_default().join(" -> ")
    );
}
