//! The scheduling plugins' reference, generated from the code: `infergate plugins` prints it,
//! and the book includes it (`docs/src/generated/plugins.md`, in the configuration chapter).
//!
//! [`markdown`] renders [`scheduler_core::scheduling::describe_plugins`]: one table of every
//! plugin type (its kind and what it does), then one of every parameter (its kind, default
//! and accepted values), both in the catalogue's order. What each parameter means stays in
//! the chapter's prose. `cli/tests/plugins_reference.rs` holds the committed page equal to
//! this rendering; with `INFERGATE_BLESS=1` it rewrites the page.

use std::fmt::Write as _;

use scheduler_core::scheduling::{describe_plugins, DefaultDoc, PluginDoc};

/// The page's path in the repository.
pub const PAGE: &str = "docs/src/generated/plugins.md";

/// The test that checks [`PAGE`].
pub const TEST: &str = "cargo test -p infergate-cli --test plugins_reference";

/// The command that rewrites [`PAGE`].
pub const BLESS: &str = "INFERGATE_BLESS=1 cargo test -p infergate-cli --test plugins_reference";

/// The plugin reference as Markdown (ends with one newline).
pub fn markdown() -> anyhow::Result<String> {
    let docs = describe_plugins()
        .map_err(|e| anyhow::anyhow!("describing the plugin catalogue: {e:?}"))?;
    Ok(render(&docs))
}

/// `docs` as the page.
fn render(docs: &[PluginDoc]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<!-- Generated from scheduler-core's plugin catalogue by `infergate plugins`: do not \
         edit. `{BLESS}` rewrites this file. -->\n"
    );
    out.push_str("| type | kind | what it does |\n|---|---|---|\n");
    for d in docs {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} |",
            d.plugin_type,
            cell(d.kind),
            cell(d.summary)
        );
    }
    out.push_str(
        "\nTheir parameters (absent or `null`: the default). A type not listed here takes \
         none: any parameter given to it is a config error, as is an unknown one.\n\n",
    );
    out.push_str("| plugin | parameter | kind | default | accepted |\n|---|---|---|---|---|\n");
    for d in docs {
        for (i, p) in d.parameters.iter().enumerate() {
            let plugin = if i == 0 {
                format!("`{}`", d.plugin_type)
            } else {
                String::new()
            };
            let default = match &p.default {
                DefaultDoc::Value(v) => format!("`{v}`"),
                DefaultDoc::Note(n) => n.clone(),
            };
            let _ = writeln!(
                out,
                "| {plugin} | `{}` | {} | {} | {} |",
                p.name,
                cell(&p.kind),
                cell(&default),
                cell(p.range.as_deref().unwrap_or("")),
            );
        }
    }
    out
}

/// `text` fit for a table cell: a `|` escaped, line breaks as spaces.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_a_row_and_parameters_theirs() {
        let md = markdown().unwrap();
        for ty in scheduler_core::scheduling::PLUGIN_TYPES {
            assert!(md.contains(&format!("| `{ty}` |")), "{ty} missing:\n{md}");
        }
        assert!(md.contains("| `approx-prefix-cache-producer` | `blockSizeTokens` | integer | `64` | 1..=1048576 |"), "{md}");
        assert!(md.ends_with("|\n") && !md.ends_with("\n\n"), "{md}");
    }

    #[test]
    fn cells_escape_pipes() {
        assert_eq!(cell("a | b\nc"), "a \\| b c");
    }
}
