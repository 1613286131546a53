//! The documents hold together: every relative link in `README.md`, `ARCHITECTURE.md`,
//! `CHANGELOG.md` and the book's sources (`docs/src/**/*.md`) names a file that exists, and
//! every `#anchor` names a heading of its target (GitHub's and mdBook's slug of it). A link
//! inside the book stays inside the book, since mdBook publishes only `docs/src/`, and so
//! does any text the book includes with `{{#include …}}`. Every page of `docs/src/` is in
//! `SUMMARY.md`, but for one that another page includes. External links are not fetched,
//! and no document points at an issue or pull-request number. The README stays a front
//! door: at most 12 KiB, with the two commands `.ci/run` and a new user rely on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// The most bytes the README may hold.
const README_MAX_BYTES: u64 = 12 * 1024;

/// The two commands of the README's "Two commands" block, in order.
const TWO_COMMANDS: [&str; 2] = ["cargo xtask demo", "cargo xtask test"];

/// The repository's root (this crate lives in `harness/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("harness/ has a parent")
        .to_path_buf()
}

/// The book's sources.
fn book_src() -> PathBuf {
    root().join("docs").join("src")
}

/// Every Markdown file under `dir`, sorted.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The documents this test reads.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs: Vec<PathBuf> = ["README.md", "ARCHITECTURE.md", "CHANGELOG.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    docs.extend(markdown_under(&book_src()));
    docs
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `path` relative to the repository's root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `path` with `.` and `..` resolved lexically (the file need not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The opening fence of a fenced code block (its character and length), if `line` is one.
fn fence(line: &str) -> Option<(char, usize)> {
    let t = line.trim_start();
    if line.len() - t.len() > 3 {
        return None;
    }
    let c = t.chars().next()?;
    if c != '`' && c != '~' {
        return None;
    }
    let n = t.chars().take_while(|&x| x == c).count();
    (n >= 3).then_some((c, n))
}

/// The text with every fenced code block's lines blanked (line numbers are kept).
fn without_fenced_code(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize)> = None;
    for line in text.lines() {
        match (open, fence(line)) {
            (None, Some(f)) => {
                open = Some(f);
                out.push(String::new());
            }
            (Some((c, n)), Some((c2, n2)))
                if c == c2 && n2 >= n && {
                    let t = line.trim();
                    t.chars().all(|x| x == c)
                } =>
            {
                open = None;
                out.push(String::new());
            }
            (Some(_), _) => out.push(String::new()),
            (None, None) => out.push(line.to_owned()),
        }
    }
    out
}

/// `text` with every inline code span replaced by spaces of the same length. Spans may run
/// across lines of one paragraph, never across a blank line.
fn blank_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run: exactly `run` backticks, before any blank line.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '\n' {
                let next_line = chars[j + 1..].iter().take_while(|&&c| c != '\n');
                if next_line.clone().all(|c| c.is_whitespace()) {
                    break;
                }
            }
            if chars[j] == '`' {
                let n = chars[j..].iter().take_while(|&&c| c == '`').count();
                if n == run {
                    close = Some(j);
                    break;
                }
                j += n;
                continue;
            }
            j += 1;
        }
        match close {
            Some(j) => {
                for c in out.iter_mut().take(j + run).skip(i) {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + run;
            }
            None => i += run,
        }
    }
    out.into_iter().collect()
}

/// One link found in a document.
#[derive(Debug)]
struct Link {
    line: usize,
    target: String,
}

/// The target of an inline link starting just after `](` at `chars[start]`: up to the
/// matching `)`, without a title, without `<…>`.
fn inline_target(chars: &[char], start: usize) -> Option<(String, usize)> {
    let mut depth = 0usize;
    let mut j = start;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 1,
            '(' => depth += 1,
            ')' if depth == 0 => {
                let raw: String = chars[start..j].iter().collect();
                let raw = raw.trim();
                let target = if let Some(rest) = raw.strip_prefix('<') {
                    rest.split('>').next().unwrap_or_default().to_owned()
                } else {
                    raw.split_whitespace().next().unwrap_or_default().to_owned()
                };
                return Some((target, j));
            }
            ')' => depth -= 1,
            '\n' if chars.get(j + 1) == Some(&'\n') => return None,
            _ => {}
        }
        j += 1;
    }
    None
}

/// Every link of `text` (Markdown inline links and images, reference definitions,
/// autolinks, HTML `href`/`src`), outside code.
fn links(text: &str) -> Vec<Link> {
    let prose = blank_code_spans(&without_fenced_code(text).join("\n"));
    let chars: Vec<char> = prose.chars().collect();
    let line_of = |i: usize| chars[..i].iter().filter(|&&c| c == '\n').count() + 1;
    let mut out = Vec::new();
    let mut i = 0;
    while i + 1 < chars.len() {
        if chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] == ']' && chars[i + 1] == '(' {
            if let Some((target, end)) = inline_target(&chars, i + 2) {
                out.push(Link {
                    line: line_of(i),
                    target,
                });
                i = end;
            }
        } else if chars[i] == '<' {
            let rest: String = chars[i + 1..]
                .iter()
                .take_while(|&&c| c != '>' && c != '\n')
                .collect();
            if rest.starts_with("http://") || rest.starts_with("https://") {
                out.push(Link {
                    line: line_of(i),
                    target: rest,
                });
            }
        }
        i += 1;
    }
    for (n, line) in prose.lines().enumerate() {
        // Reference definitions: `[label]: target` at the start of a line.
        let t = line.trim_start();
        if line.len() - t.len() <= 3 && t.starts_with('[') && !t.starts_with("[]") {
            if let Some(close) = t.find("]:") {
                if !t[1..close].contains(']') {
                    if let Some(target) = t[close + 2..].split_whitespace().next() {
                        out.push(Link {
                            line: n + 1,
                            target: target.trim_matches(['<', '>']).to_owned(),
                        });
                    }
                }
            }
        }
        for attr in ["href=\"", "src=\""] {
            let mut rest = line;
            while let Some(at) = rest.find(attr) {
                rest = &rest[at + attr.len()..];
                if let Some(end) = rest.find('"') {
                    out.push(Link {
                        line: n + 1,
                        target: rest[..end].to_owned(),
                    });
                }
            }
        }
    }
    out
}

/// A heading's text as rendered: links reduced to their text, code and emphasis marks gone,
/// HTML tags dropped.
fn rendered_heading(raw: &str) -> String {
    let mut s = String::new();
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 < chars.len() => {
                s.push(chars[i + 1]);
                i += 2;
                continue;
            }
            '`' | '*' | '[' => {}
            ']' if chars.get(i + 1) == Some(&'(') => {
                let (_, end) = inline_target(&chars, i + 2).unwrap_or((String::new(), i + 1));
                i = end + 1;
                continue;
            }
            ']' => {}
            '<' => {
                let close = chars[i..].iter().position(|&c| c == '>');
                if let Some(close) = close {
                    i += close + 1;
                    continue;
                }
                s.push('<');
            }
            c => s.push(c),
        }
        i += 1;
    }
    s
}

/// The anchor GitHub and mdBook give a heading: lower case; letters, digits, `-` and `_`
/// kept; each space a `-`; anything else dropped.
fn slug(heading: &str) -> String {
    rendered_heading(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of `text`: each ATX heading's slug (repeats get `-1`, `-2`, …, as GitHub and
/// mdBook number them), an explicit `{#id}`, and HTML `id`/`name` attributes.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in without_fenced_code(text) {
        let t = line.trim_start();
        if line.len() - t.len() <= 3 && t.starts_with('#') {
            let level = t.chars().take_while(|&c| c == '#').count();
            let rest = &t[level..];
            if level <= 6 && (rest.is_empty() || rest.starts_with(' ')) {
                let mut heading = rest.trim().trim_end_matches('#').trim().to_owned();
                if let (Some(open), true) = (heading.rfind("{#"), heading.ends_with('}')) {
                    out.insert(heading[open + 2..heading.len() - 1].to_owned());
                    heading.truncate(open);
                    continue;
                }
                let base = slug(&heading);
                let n = seen.entry(base.clone()).or_insert(0);
                let id = if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                };
                *n += 1;
                out.insert(id);
            }
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line.as_str();
            while let Some(at) = rest.find(attr) {
                rest = &rest[at + attr.len()..];
                if let Some(end) = rest.find('"') {
                    out.insert(rest[..end].to_owned());
                }
            }
        }
    }
    out
}

/// One `{{#include path[:anchor]}}` of a book page.
#[derive(Debug)]
struct Include {
    line: usize,
    path: String,
    anchor: Option<String>,
}

fn includes(text: &str) -> Vec<Include> {
    let mut out = Vec::new();
    for (n, line) in without_fenced_code(text).iter().enumerate() {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("{{#") {
            rest = &rest[at + 3..];
            let Some(end) = rest.find("}}") else { break };
            let directive = rest[..end].trim();
            let (kind, arg) = directive.split_once(' ').unwrap_or((directive, ""));
            assert_eq!(
                kind,
                "include",
                "line {}: only {{{{#include}}}} is checked here, not {{{{#{kind}}}}}",
                n + 1
            );
            let arg = arg.trim();
            let (path, anchor) = match arg.split_once(':') {
                Some((p, a)) => (p.to_owned(), Some(a.to_owned())),
                None => (arg.to_owned(), None),
            };
            out.push(Include {
                line: n + 1,
                path,
                anchor,
            });
            rest = &rest[end + 2..];
        }
    }
    out
}

/// The part of `text` between `ANCHOR: name` and `ANCHOR_END: name`, without the markers,
/// as mdBook includes it; `None` when the markers are missing.
fn anchored(text: &str, name: &str) -> Option<String> {
    let start = format!("ANCHOR: {name}");
    let end = format!("ANCHOR_END: {name}");
    let mut lines = text.lines();
    lines.by_ref().find(|l| l.contains(&start))?;
    let mut out = Vec::new();
    for line in lines {
        if line.contains(&end) {
            return Some(out.join("\n"));
        }
        if !line.contains("ANCHOR: ") && !line.contains("ANCHOR_END: ") {
            out.push(line);
        }
    }
    None
}

/// A document as the reader sees it: its own text, each include replaced by what it
/// includes. Problems with the includes go to `problems`.
fn expanded(path: &Path, problems: &mut Vec<String>) -> String {
    let text = read(path);
    if !path.starts_with(book_src()) {
        return text;
    }
    let mut out = text.clone();
    for inc in includes(&text) {
        let target = normalize(&path.parent().unwrap().join(&inc.path));
        let at = format!("{}:{}", shown(path), inc.line);
        if !target.is_file() {
            problems.push(format!("{at}: includes {}, which does not exist", inc.path));
            continue;
        }
        let body = read(&target);
        let part = match &inc.anchor {
            None => body,
            Some(a) => match anchored(&body, a) {
                Some(part) => part,
                None => {
                    problems.push(format!("{at}: {} has no ANCHOR `{a}`", inc.path));
                    continue;
                }
            },
        };
        let directive = match &inc.anchor {
            None => format!("{{{{#include {}}}}}", inc.path),
            Some(a) => format!("{{{{#include {}:{a}}}}}", inc.path),
        };
        out = out.replace(&directive, &part);
    }
    out
}

/// The issue or pull-request number a URL or a piece of prose points at, if any.
fn issue_reference(text: &str) -> Option<String> {
    for marker in ["/issues/", "/pull/", "/pulls/", "/merge_requests/"] {
        if let Some(at) = text.find(marker) {
            let rest = &text[at + marker.len()..];
            if rest.starts_with(|c: char| c.is_ascii_digit()) {
                return Some(text.to_owned());
            }
        }
    }
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let before = if i == 0 { ' ' } else { chars[i - 1] };
        if c == '#'
            && (before.is_whitespace() || before == '(')
            && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit())
        {
            let number: String = chars[i..]
                .iter()
                .take_while(|&&d| d == '#' || d.is_ascii_digit())
                .collect();
            let after = chars.get(i + number.chars().count());
            if after.is_none_or(|a| !a.is_alphanumeric() && *a != '-') {
                return Some(number);
            }
        }
    }
    None
}

/// Checks one link of `doc` (read as a page in `base_dir`, where its relative links
/// resolve). `in_book`: the page is published by mdBook, so its links must stay in
/// `docs/src/`.
fn check_link(
    doc: &Path,
    base_dir: &Path,
    in_book: bool,
    link: &Link,
    anchors_of: &mut dyn FnMut(&Path) -> BTreeSet<String>,
    problems: &mut Vec<String>,
) {
    let at = format!("{}:{}", shown(doc), link.line);
    let target = link.target.as_str();
    if target.is_empty() {
        problems.push(format!("{at}: an empty link"));
        return;
    }
    if target.starts_with("http://") || target.starts_with("https://") {
        if let Some(issue) = issue_reference(target) {
            problems.push(format!("{at}: points at an issue or pull request: {issue}"));
        }
        return;
    }
    if target.starts_with("mailto:") {
        return;
    }
    if target.contains("://") || target.starts_with('/') {
        problems.push(format!("{at}: `{target}` is neither relative nor http(s)"));
        return;
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let resolved = if file.is_empty() {
        doc.to_path_buf()
    } else {
        normalize(&base_dir.join(file))
    };
    if !resolved.starts_with(root()) {
        problems.push(format!("{at}: `{target}` leaves the repository"));
        return;
    }
    if in_book && !file.is_empty() && !resolved.starts_with(book_src()) {
        problems.push(format!(
            "{at}: `{target}` leaves docs/src/, which is all mdBook publishes"
        ));
        return;
    }
    if !resolved.exists() {
        problems.push(format!(
            "{at}: `{target}`: {} does not exist",
            shown(&resolved)
        ));
        return;
    }
    let Some(anchor) = anchor else { return };
    if resolved.extension().is_some_and(|x| x == "md") {
        if !anchors_of(&resolved).contains(anchor) {
            problems.push(format!(
                "{at}: `{target}`: {} has no heading with the anchor `#{anchor}`",
                shown(&resolved)
            ));
        }
    } else if !(anchor.starts_with('L')
        && anchor[1..]
            .chars()
            .all(|c| c.is_ascii_digit() || c == '-' || c == 'L'))
    {
        problems.push(format!(
            "{at}: `{target}`: an anchor into a file that is not Markdown"
        ));
    }
}

#[test]
fn slugs_are_githubs_and_mdbooks() {
    assert_eq!(slug("Two commands"), "two-commands");
    assert_eq!(
        slug("A full replica: `cargo xtask demo --scenario hotspot`"),
        "a-full-replica-cargo-xtask-demo---scenario-hotspot"
    );
    assert_eq!(
        slug("Tenants, quotas and billing: `TenantQuota` (mini-platform.local/v1alpha1)"),
        "tenants-quotas-and-billing-tenantquota-mini-platformlocalv1alpha1"
    );
    assert_eq!(slug("The request's path"), "the-requests-path");
    assert_eq!(slug("A 10% FP8 canary"), "a-10-fp8-canary");
    assert_eq!(slug("[Linked](x.md) *heading*"), "linked-heading");
    let a = anchors("# A\n\n```\n# not a heading\n```\n\n## A\n\n### B {#custom}\n");
    assert_eq!(
        a.into_iter().collect::<Vec<_>>(),
        ["a", "a-1", "custom"].map(String::from)
    );
}

#[test]
fn links_are_found_outside_code_only() {
    let text = "See [the\nbook](docs/src/a.md#x) and `[not](a link)`.\n\n```\n[no](pe)\n```\n\
                [ref]: other.md\n![img](p.svg \"title\") <https://example.org/a>\n";
    let found: Vec<(usize, String)> = links(text)
        .into_iter()
        .map(|l| (l.line, l.target))
        .collect();
    assert_eq!(
        found,
        [
            (2, "docs/src/a.md#x"),
            (8, "p.svg"),
            (8, "https://example.org/a"),
            (7, "other.md"),
        ]
        .map(|(n, t)| (n, t.to_owned()))
    );
    assert!(issue_reference("https://github.com/o/r/issues/12").is_some());
    assert!(issue_reference("fixed in #42.").is_some());
    assert!(issue_reference("see [log](changelog.md#2026-12-01)").is_none());
    assert!(issue_reference("https://github.com/o/r/blob/main/README.md").is_none());
}

#[test]
fn every_link_and_anchor_resolves() {
    let docs = documents();
    assert!(docs.len() > 3, "no book chapters under docs/src/");
    let mut problems = Vec::new();
    let mut cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut include_problems = Vec::new();
    let mut anchors_of = |path: &Path| -> BTreeSet<String> {
        cache
            .entry(path.to_path_buf())
            .or_insert_with(|| anchors(&expanded(path, &mut include_problems)))
            .clone()
    };
    for doc in &docs {
        let text = read(doc);
        let in_book = doc.starts_with(book_src());
        let dir = doc.parent().unwrap();
        for link in links(&text) {
            check_link(doc, dir, in_book, &link, &mut anchors_of, &mut problems);
        }
        // What the book includes is read on the including page: its links resolve there.
        if in_book {
            for inc in includes(&text) {
                let target = normalize(&dir.join(&inc.path));
                if !target.is_file() {
                    continue;
                }
                let body = read(&target);
                let part = match &inc.anchor {
                    None => Some(body),
                    Some(a) => anchored(&body, a),
                };
                for link in links(&part.unwrap_or_default()) {
                    let link = Link {
                        line: inc.line,
                        target: link.target,
                    };
                    check_link(doc, dir, true, &link, &mut anchors_of, &mut problems);
                }
            }
        }
        // Prose that names an issue or pull request by number.
        let prose = blank_code_spans(&without_fenced_code(&text).join("\n"));
        for (n, line) in prose.lines().enumerate() {
            let mut line = line.to_owned();
            for link in links(&line) {
                line = line.replace(&format!("]({})", link.target), "]()");
            }
            if let Some(issue) = issue_reference(&line) {
                problems.push(format!(
                    "{}:{}: points at an issue or pull request: {issue}",
                    shown(doc),
                    n + 1
                ));
            }
        }
    }
    for doc in &docs {
        expanded(doc, &mut problems);
    }
    problems.extend(include_problems);
    problems.sort();
    problems.dedup();
    assert!(
        problems.is_empty(),
        "{} broken link(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_chapter_is_in_the_summary() {
    let src = book_src();
    let summary = read(&src.join("SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|l| normalize(&src.join(l.target.split('#').next().unwrap())))
        .collect();
    // A page the book includes into another (`{{#include generated/plugins.md}}`) is part of
    // that chapter, not a chapter of its own.
    let included: BTreeSet<PathBuf> = markdown_under(&src)
        .iter()
        .flat_map(|page| {
            let dir = page.parent().unwrap().to_path_buf();
            includes(&read(page))
                .into_iter()
                .map(move |inc| normalize(&dir.join(inc.path)))
        })
        .collect();
    let missing: Vec<String> = markdown_under(&src)
        .into_iter()
        .filter(|p| !p.ends_with("SUMMARY.md") && !listed.contains(p) && !included.contains(p))
        .map(|p| shown(&p))
        .collect();
    assert!(
        missing.is_empty(),
        "chapters missing from SUMMARY.md: {missing:?}"
    );
}

#[test]
fn readme_is_a_short_front_door_with_the_two_commands() {
    let readme = root().join("README.md");
    let size = std::fs::metadata(&readme).unwrap().len();
    assert!(
        size <= README_MAX_BYTES,
        "README.md is {size} bytes, over {README_MAX_BYTES}: move the detail into docs/"
    );
    let text = read(&readme);
    let lines: Vec<&str> = text.lines().collect();
    let heading = lines
        .iter()
        .position(|l| l.trim() == "## Two commands")
        .expect("README.md has a `## Two commands` section");
    let open = heading
        + lines[heading..]
            .iter()
            .position(|l| l.trim_start().starts_with("```"))
            .expect("the section holds a code block");
    let close = open
        + 1
        + lines[open + 1..]
            .iter()
            .position(|l| l.trim_start().starts_with("```"))
            .expect("the code block ends");
    let commands: Vec<&str> = lines[open + 1..close]
        .iter()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(commands, TWO_COMMANDS, "the README's two commands");
    // CI runs the README's test command as it is written there.
    let ci = read(&root().join(".ci").join("run"));
    assert!(
        ci.lines().any(|l| l.trim() == TWO_COMMANDS[1]),
        ".ci/run no longer runs `{}`",
        TWO_COMMANDS[1]
    );
}
