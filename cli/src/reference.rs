//! The book's command-line references, generated from the programs' clap definitions.
//!
//! [`markdown`] renders a [`clap::Command`] as one book page: the command's about, its
//! usage, its subcommands (each linked to its section), its arguments and options with
//! their help, defaults, aliases and possible values, then each subcommand in a section of
//! its own, depth first. Help text is read as the Markdown-flavoured prose it is written in
//! (code spans kept, every other Markdown character escaped; a line that starts with `- `
//! starts a list item, an indented paragraph is kept as preformatted text), and the
//! `before_help`/`after_help` texts, laid out for a terminal, as preformatted text.
//!
//! [`check_or_bless`] is the test each program's crate runs (`infergate`, `cargo xtask`,
//! `infergate-bench`): the committed page must be what the parser renders, and with
//! `INFERGATE_BLESS=1` the test rewrites the page instead.

use std::fmt::Write as _;
use std::path::Path;

use clap::Command;

/// The variable that makes [`check_or_bless`] rewrite the committed page.
pub const BLESS_ENV: &str = "INFERGATE_BLESS";

/// What a page says besides the parser's own text.
#[derive(Clone, Copy, Debug)]
pub struct Page<'a> {
    /// The page's title (Markdown).
    pub title: &'a str,
    /// Where the parser's definitions are (a path in the repository), named on the page.
    pub source: &'a str,
    /// The test that checks the page; with `INFERGATE_BLESS=1` it rewrites it.
    pub test: &'a str,
    /// Markdown added at the end of a command's section: (the command's path as its
    /// heading shows it, e.g. `cargo xtask up`, the text).
    pub notes: &'a [(&'a str, &'a str)],
}

/// `cmd`'s reference as a Markdown page.
pub fn markdown(mut cmd: Command, page: &Page<'_>) -> String {
    cmd.build();
    let root = cmd
        .get_bin_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_owned();
    let mut out = String::new();
    let _ = writeln!(out, "# {}\n", page.title);
    let _ = writeln!(
        out,
        "*Generated from the command-line parser (`{}`); `INFERGATE_BLESS=1 {}` rewrites \
         this page. Every command also prints its help with `--help`.*\n",
        page.source, page.test
    );
    section(&mut out, &cmd, &root, 1, page);
    // One trailing newline.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// Compares the committed page at `path` with `rendered`, or, when `INFERGATE_BLESS=1`,
/// writes `rendered` there. The error says what differs and how to regenerate the page.
pub fn check_or_bless(path: &Path, rendered: &str, test: &str) -> Result<(), String> {
    if std::env::var(BLESS_ENV).is_ok_and(|v| v == "1") {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        return std::fs::write(path, rendered).map_err(|e| format!("{}: {e}", path.display()));
    }
    match std::fs::read_to_string(path) {
        Ok(committed) => compare(path, &committed, rendered, test),
        Err(e) => Err(format!(
            "{}: {e}; generate it with `{BLESS_ENV}=1 {test}` and commit it",
            path.display()
        )),
    }
}

/// `Ok` when `committed` is `rendered`; else what differs first, and the command that
/// regenerates the page.
fn compare(path: &Path, committed: &str, rendered: &str, test: &str) -> Result<(), String> {
    if committed == rendered {
        return Ok(());
    }
    let line = committed
        .lines()
        .zip(rendered.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| committed.lines().count().min(rendered.lines().count()));
    let shown = |text: &str| text.lines().nth(line).unwrap_or("(end of file)").to_owned();
    Err(format!(
        "{} is not what the code generates (line {}: committed `{}`, generated `{}`); \
         regenerate it with `{BLESS_ENV}=1 {test}` and commit it",
        path.display(),
        line + 1,
        shown(committed),
        shown(rendered)
    ))
}

/// The anchor the book gives a heading `` `path` `` (lower case, spaces as `-`).
fn anchor(path: &str) -> String {
    path.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Whether `cmd` gets a section of its own: not hidden, and not clap's `help` command
/// (whose text is the other sections).
fn documented(cmd: &Command) -> bool {
    !cmd.is_hide_set() && cmd.get_name() != "help"
}

/// `cmd`'s section (its heading at `depth`, except for the page's root), then each
/// subcommand's.
fn section(out: &mut String, cmd: &Command, path: &str, depth: usize, page: &Page<'_>) {
    if depth > 1 {
        let _ = writeln!(out, "{} `{path}`\n", "#".repeat(depth.min(6)));
    }
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        out.push_str(&prose(&about.to_string(), ""));
        out.push('\n');
    }
    if let Some(before) = cmd.get_before_long_help().or(cmd.get_before_help()) {
        preformatted(out, &before.to_string());
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage: Vec<&str> = usage
        .lines()
        .map(|l| l.trim())
        .map(|l| l.strip_prefix("Usage:").unwrap_or(l).trim())
        .filter(|l| !l.is_empty())
        .collect();
    out.push_str("Usage:\n\n```text\n");
    for line in usage {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str("```\n\n");

    let subs: Vec<&Command> = cmd.get_subcommands().filter(|c| !c.is_hide_set()).collect();
    if !subs.is_empty() {
        out.push_str("Commands:\n\n");
        for sub in subs {
            let name = sub.get_name();
            let shown = if documented(sub) {
                format!("[`{name}`](#{})", anchor(&format!("{path} {name}")))
            } else {
                format!("`{name}`")
            };
            let about = sub
                .get_about()
                .map(|a| prose(&sentence(&a.to_string()), "  "))
                .unwrap_or_default();
            let _ = write!(out, "- {shown}");
            let aliases: Vec<&str> = sub.get_visible_aliases().collect();
            if !aliases.is_empty() {
                let _ = write!(out, " (alias {})", code_list(&aliases));
            }
            if about.is_empty() {
                out.push('\n');
            } else {
                let _ = write!(out, ": {}", about.trim_start());
            }
        }
        out.push('\n');
    }

    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_id() != "help")
        .collect();
    let positionals: Vec<&clap::Arg> = args.iter().copied().filter(|a| a.is_positional()).collect();
    let options: Vec<&clap::Arg> = args
        .iter()
        .copied()
        .filter(|a| !a.is_positional())
        .collect();
    for (title, list) in [("Arguments", positionals), ("Options", options)] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{title}:\n");
        for arg in list {
            argument(out, arg);
        }
        out.push('\n');
    }

    if let Some(after) = cmd.get_after_long_help().or(cmd.get_after_help()) {
        preformatted(out, &after.to_string());
    }
    for (at, note) in page.notes {
        if *at == path {
            out.push_str(note.trim_end());
            out.push_str("\n\n");
        }
    }
    for sub in cmd.get_subcommands().filter(|c| documented(c)) {
        let sub_path = format!("{path} {}", sub.get_name());
        section(out, sub, &sub_path, depth + 1, page);
    }
}

/// One argument as a list item: its spelling as `--help` shows it, whether it is required,
/// its help, then its default, aliases and possible values.
fn argument(out: &mut String, arg: &clap::Arg) {
    let mut spelling = String::new();
    if let (Some(short), Some(_)) = (arg.get_short(), arg.get_long()) {
        let _ = write!(spelling, "-{short}, ");
    }
    let _ = write!(spelling, "{arg}");
    let _ = write!(out, "- `{spelling}`");
    if arg.is_required_set() {
        out.push_str(" (required)");
    }
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| prose(&sentence(&h.to_string()), "  "))
        .unwrap_or_default();
    let help = help.trim();
    if !help.is_empty() {
        let _ = write!(out, ": {help}");
    }

    let mut facts = Vec::new();
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if !defaults.is_empty() && arg.get_action().takes_values() {
        let defaults: Vec<&str> = defaults.iter().map(String::as_str).collect();
        facts.push(format!("Default: {}.", code_list(&defaults)));
    }
    let prefix = if arg.get_long().is_some() { "--" } else { "-" };
    let aliases: Vec<String> = arg
        .get_visible_aliases()
        .unwrap_or_default()
        .into_iter()
        .map(|a| format!("{prefix}{a}"))
        .collect();
    if !aliases.is_empty() {
        let aliases: Vec<&str> = aliases.iter().map(String::as_str).collect();
        facts.push(format!("Alias: {}.", code_list(&aliases)));
    }
    let values: Vec<clap::builder::PossibleValue> = if arg.get_action().takes_values() {
        arg.get_possible_values()
            .into_iter()
            .filter(|v| !v.is_hide_set())
            .collect()
    } else {
        Vec::new()
    };
    let explained = values.iter().any(|v| v.get_help().is_some());
    if !values.is_empty() && !explained {
        let names: Vec<&str> = values.iter().map(|v| v.get_name()).collect();
        facts.push(format!("Values: {}.", code_list(&names)));
    }
    if !facts.is_empty() {
        if help.ends_with("```") {
            // After preformatted text: a paragraph of their own.
            out.push_str("\n\n ");
        }
        let _ = write!(out, " {}", facts.join(" "));
    }
    out.push('\n');
    if explained {
        out.push_str("\n  Values:\n\n");
        for v in &values {
            let _ = write!(out, "  - `{}`", v.get_name());
            match v.get_help() {
                Some(h) => {
                    let help = prose(&sentence(&h.to_string()), "    ");
                    let _ = write!(out, ": {}", help.trim_start());
                }
                None => out.push('\n'),
            }
        }
    }
}

/// `text` ending as a sentence: clap drops the final period of a one-paragraph doc comment,
/// which a line of its own in a terminal does without but a list item in a page does not.
fn sentence(text: &str) -> String {
    let text = text.trim_end();
    match text.chars().last() {
        Some(c) if c.is_alphanumeric() || matches!(c, '`' | ')' | ']' | '\'' | '"') => {
            format!("{text}.")
        }
        _ => text.to_owned(),
    }
}

/// `` `a`, `b` ``.
fn code_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("`{i}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Terminal text as a fenced block.
fn preformatted(out: &mut String, text: &str) {
    let text = text.trim_matches('\n');
    if text.trim().is_empty() {
        return;
    }
    out.push_str("```text\n");
    for line in text.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("```\n\n");
}

/// Help text as Markdown, every line after the first indented by `indent`: paragraphs
/// (blank-line separated) with their lines joined, `- ` lines as list items (an item's
/// indented lines continue it), a paragraph of indented lines as preformatted text.
/// Ends with a newline.
fn prose(text: &str, indent: &str) -> String {
    let mut blocks: Vec<String> = Vec::new();
    for para in text.split("\n\n") {
        let lines: Vec<&str> = para.lines().filter(|l| !l.trim().is_empty()).collect();
        let Some(first) = lines.first() else { continue };
        let is_list = first.trim_start().starts_with("- ");
        let indented = lines
            .iter()
            .any(|l| l.starts_with("  ") || l.starts_with('\t'));
        if indented && !is_list {
            let mut block = String::from("```text\n");
            for line in &lines {
                block.push_str(line.trim_end());
                block.push('\n');
            }
            block.push_str("```");
            blocks.push(block);
            continue;
        }
        let mut block = String::new();
        for line in &lines {
            let t = line.trim();
            if let Some(item) = t.strip_prefix("- ").filter(|_| !line.starts_with(' ')) {
                if !block.is_empty() {
                    block.push('\n');
                }
                block.push_str("- ");
                block.push_str(&escape(item));
            } else {
                if !block.is_empty() {
                    block.push(' ');
                }
                block.push_str(&escape(t));
            }
        }
        blocks.push(block);
    }
    let mut out = String::new();
    for (i, block) in blocks.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        for (j, line) in block.lines().enumerate() {
            if i > 0 || j > 0 {
                out.push_str(indent);
            }
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `text` with every Markdown character outside its code spans escaped, so that help
/// written for a terminal reads the same in the book.
fn escape(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        out.push_str(&escape_plain(&rest[..open]));
        let after = &rest[open + 1..];
        match after.find('`') {
            Some(close) => {
                out.push('`');
                out.push_str(&after[..close]);
                out.push('`');
                rest = &after[close + 1..];
            }
            None => {
                out.push_str("\\`");
                rest = after;
            }
        }
    }
    out.push_str(&escape_plain(rest));
    out
}

fn escape_plain(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if matches!(
            c,
            '\\' | '*' | '_' | '[' | ']' | '<' | '>' | '#' | '|' | '~' | '&' | '{' | '}'
        ) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn sample() -> Command {
        Command::new("tool").about("A tool").subcommand(
            Command::new("run")
                .about("Runs it")
                .long_about("Runs it.\n\nEvery *.yaml in <DIR>, `a_b`;\n- one\n- two")
                .arg(
                    Arg::new("mode")
                        .long("mode")
                        .help("The mode")
                        .value_parser(["fast", "slow"])
                        .default_value("fast"),
                )
                .arg(Arg::new("quick").long("quick").action(ArgAction::SetTrue))
                .arg(Arg::new("target").required(true))
                .after_long_help("Table:\n  a  one\n  b  two"),
        )
    }

    #[test]
    fn a_page_has_every_command_its_usage_options_and_help() {
        let page = Page {
            title: "`tool`",
            source: "src/main.rs",
            test: "cargo test",
            notes: &[("tool run", "A note.")],
        };
        let md = markdown(sample(), &page);
        for want in [
            "# `tool`\n",
            "A tool\n",
            "- [`run`](#tool-run): Runs it.\n",
            "- `help`: Print this message",
            "## `tool run`\n",
            "Runs it.\n\nEvery \\*.yaml in \\<DIR\\>, `a_b`;\n- one\n- two\n",
            "tool run [OPTIONS] <target>\n",
            "- `--mode <mode>`: The mode. Default: `fast`. Values: `fast`, `slow`.\n",
            "- `--quick`\n",
            "- `<target>` (required)\n",
            "```text\nTable:\n  a  one\n  b  two\n```\n",
            "A note.\n",
        ] {
            assert!(md.contains(want), "{want:?} missing:\n{md}");
        }
        assert!(!md.contains("## `tool help`"), "{md}");
        assert!(md.ends_with("```\n\nA note.\n"), "{md}");
    }

    #[test]
    fn the_check_says_how_to_regenerate() {
        let path = Path::new("docs/page.md");
        assert!(compare(path, "a\nb\n", "a\nb\n", "cargo test -p x").is_ok());
        let err = compare(path, "a\nb\n", "a\nc\n", "cargo test -p x").unwrap_err();
        assert!(
            err.contains("line 2: committed `b`, generated `c`"),
            "{err}"
        );
        assert!(err.contains("INFERGATE_BLESS=1 cargo test -p x"), "{err}");
        let err = compare(path, "", "a\n", "cargo test -p x").unwrap_err();
        assert!(err.contains("line 1: committed `(end of file)`"), "{err}");
    }
}
