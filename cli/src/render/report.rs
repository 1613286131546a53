//! What the renderer did with every field of every object: used (and how), or not
//! supported (and why). `infergate render` prints the unsupported ones and writes the whole
//! table into the output directory (`fields.md`), so nothing an operator wrote is dropped
//! without a word.

use std::fmt::Write as _;

/// What became of one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// The field is in the rendered configuration; the text says where or how.
    Used(String),
    /// The field is not honoured; the text says why (and what happens instead).
    NotSupported(String),
}

/// One field of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `InferencePool serving/llama-70b-bf16`.
    pub object: String,
    /// `spec.selector`.
    pub path: String,
    /// Used or not.
    pub status: Status,
}

/// Every field's fate, in the order the objects were read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    entries: Vec<Entry>,
}

impl Report {
    /// Records that `path` of `object` is used, `how`.
    pub fn used(&mut self, object: &str, path: &str, how: impl Into<String>) {
        self.push(object, path, Status::Used(how.into()));
    }

    /// Records that `path` of `object` is not supported, `why`.
    pub fn not_supported(&mut self, object: &str, path: &str, why: impl Into<String>) {
        self.push(object, path, Status::NotSupported(why.into()));
    }

    fn push(&mut self, object: &str, path: &str, status: Status) {
        self.entries.push(Entry {
            object: object.to_owned(),
            path: path.to_owned(),
            status,
        });
    }

    /// How many entries there are (a mark for [`Report::forget`]).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Drops the entries of `object` recorded before the mark `before` (an object replaced
    /// by a later one of the same name: its fields are no longer in the configuration).
    pub fn forget(&mut self, object: &str, before: usize) {
        let mut i = 0;
        self.entries.retain(|e| {
            let keep = i >= before || e.object != object;
            i += 1;
            keep
        });
    }

    /// Every entry.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The not-supported entries, one line each: `<object> <path>: <why>`.
    pub fn not_supported_lines(&self) -> Vec<String> {
        self.entries
            .iter()
            .filter_map(|e| match &e.status {
                Status::NotSupported(why) => Some(line(&e.object, &e.path, why)),
                Status::Used(_) => None,
            })
            .collect()
    }

    /// The whole table as Markdown: the unsupported fields first, then the used ones.
    pub fn to_markdown(&self) -> String {
        let mut out = String::from("# What the renderer did with each field\n\n");
        let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        for (title, want_used) in [("Not supported", false), ("Used", true)] {
            let _ = writeln!(out, "## {title}\n\n| object | field | |\n|---|---|---|");
            for e in &self.entries {
                let (used, text) = match &e.status {
                    Status::Used(t) => (true, t),
                    Status::NotSupported(t) => (false, t),
                };
                if used == want_used {
                    let _ = writeln!(
                        out,
                        "| {} | `{}` | {} |",
                        cell(&e.object),
                        cell(&e.path),
                        cell(text)
                    );
                }
            }
            out.push('\n');
        }
        out
    }
}

fn line(object: &str, path: &str, text: &str) -> String {
    if path.is_empty() {
        format!("{object}: {text}")
    } else {
        format!("{object} {path}: {text}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_lines_name_object_and_path_and_the_table_has_both() {
        let mut r = Report::default();
        r.used("InferencePool a/b", "spec.targetPorts", "ports");
        r.not_supported("InferencePool a/b", "spec.selector", "not watched");
        assert_eq!(
            r.not_supported_lines(),
            ["InferencePool a/b spec.selector: not watched"]
        );
        let md = r.to_markdown();
        let unsupported = md.find("## Not supported").unwrap();
        let used = md.find("## Used").unwrap();
        let selector = md.find("`spec.selector`").unwrap();
        let ports = md.find("`spec.targetPorts`").unwrap();
        assert!(
            unsupported < selector && selector < used && used < ports,
            "{md}"
        );
    }
}
