//! Placeholder substitution on a parsed YAML tree: how the bootstrap templates in
//! `envoy/config/` become the file Envoy loads.
//!
//! Substitution works on the parsed tree, never on text, so values need no YAML escaping
//! (a plugin configuration is JSON text full of quotes) and indentation cannot break:
//!
//! - a string scalar that is exactly `{{name}}` is replaced by the value (any type);
//! - a sequence item that is exactly `{{...name}}` is replaced by the items of a list value
//!   (zero or more: this is how per-pool routes and clusters are spliced in);
//! - `{{name}}` inside a longer string is replaced by the value's text (strings and numbers);
//! - the top-level key `x-infergate` holds prototypes (for instance `pool_route`), which
//!   [`Template::prototype`] renders with per-item values; it is removed from the output.
//!
//! Every placeholder must have a value: a name left unresolved is an error, so a template
//! and the code that fills it cannot drift apart silently.

use anyhow::{anyhow, bail, Context, Result};
use serde_yaml_ng::{Mapping, Value};
use std::collections::BTreeMap;

/// Top-level key of the prototypes section; Envoy never sees it.
const PROTOTYPES_KEY: &str = "x-infergate";

/// Values for the placeholders of one rendering.
pub type Vars = BTreeMap<String, Value>;

/// A parsed bootstrap template.
#[derive(Clone, Debug)]
pub struct Template {
    body: Value,
    prototypes: Mapping,
}

impl Template {
    /// Parses template text (YAML).
    pub fn parse(text: &str) -> Result<Self> {
        let mut body: Value =
            serde_yaml_ng::from_str(text).context("template is not valid YAML")?;
        let map = body
            .as_mapping_mut()
            .ok_or_else(|| anyhow!("template top level is not a mapping"))?;
        let prototypes = match map.remove(PROTOTYPES_KEY) {
            Some(Value::Mapping(m)) => m,
            Some(_) => bail!("`{PROTOTYPES_KEY}` must be a mapping of prototypes"),
            None => Mapping::new(),
        };
        Ok(Template { body, prototypes })
    }

    /// Whether the template declares the prototype `name`.
    pub fn has_prototype(&self, name: &str) -> bool {
        self.prototypes.contains_key(name)
    }

    /// Renders the prototype `name` with `vars`.
    pub fn prototype(&self, name: &str, vars: &Vars) -> Result<Value> {
        let proto = self
            .prototypes
            .get(name)
            .ok_or_else(|| anyhow!("template has no prototype `{name}`"))?;
        substitute(proto, vars).with_context(|| format!("rendering prototype `{name}`"))
    }

    /// Renders the template body with `vars`.
    pub fn render(&self, vars: &Vars) -> Result<Value> {
        substitute(&self.body, vars)
    }
}

/// Returns `value` with every placeholder replaced.
pub fn substitute(value: &Value, vars: &Vars) -> Result<Value> {
    Ok(match value {
        Value::String(s) => substitute_str(s, vars)?,
        Value::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                if let Some(name) = item.as_str().and_then(splice_name) {
                    match lookup(vars, name)? {
                        Value::Sequence(spliced) => out.extend(spliced.iter().cloned()),
                        _ => bail!("`{{{{...{name}}}}}` needs a list value"),
                    }
                } else {
                    out.push(substitute(item, vars)?);
                }
            }
            Value::Sequence(out)
        }
        Value::Mapping(map) => {
            let mut out = Mapping::with_capacity(map.len());
            for (k, v) in map {
                out.insert(substitute(k, vars)?, substitute(v, vars)?);
            }
            Value::Mapping(out)
        }
        Value::Tagged(t) => {
            let mut t = (**t).clone();
            t.value = substitute(&t.value, vars)?;
            Value::Tagged(Box::new(t))
        }
        other => other.clone(),
    })
}

/// `{{...name}}` → `name`.
fn splice_name(s: &str) -> Option<&str> {
    s.strip_prefix("{{...")?.strip_suffix("}}")
}

fn lookup<'a>(vars: &'a Vars, name: &str) -> Result<&'a Value> {
    vars.get(name)
        .ok_or_else(|| anyhow!("placeholder `{name}` has no value"))
}

fn substitute_str(s: &str, vars: &Vars) -> Result<Value> {
    if let Some(name) = s.strip_prefix("{{").and_then(|r| r.strip_suffix("}}")) {
        if !name.contains("{{") && !name.contains("}}") {
            if name.starts_with("...") {
                bail!("`{s}` may only stand as a list item");
            }
            return Ok(lookup(vars, name)?.clone());
        }
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("{{") {
        let (before, after) = rest.split_at(start);
        out.push_str(before);
        let end = after
            .find("}}")
            .ok_or_else(|| anyhow!("unterminated placeholder in `{s}`"))?;
        let name = after.get(2..end).unwrap_or_default();
        match lookup(vars, name)? {
            Value::String(v) => out.push_str(v),
            Value::Number(n) => out.push_str(&n.to_string()),
            _ => bail!("`{{{{{name}}}}}` inside text needs a string or number value"),
        }
        rest = after.get(end + 2..).unwrap_or_default();
    }
    out.push_str(rest);
    Ok(Value::String(out))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, Value)]) -> Vars {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn whole_scalar_takes_the_value_type() {
        let t = Template::parse("port: \"{{p}}\"\n").unwrap();
        let out = t.render(&vars(&[("p", Value::from(8080u16))])).unwrap();
        assert_eq!(out["port"], Value::from(8080u16));
    }

    #[test]
    fn splice_inserts_every_item_and_none_for_empty() {
        let t = Template::parse("l: [a, \"{{...xs}}\", z]\n").unwrap();
        let xs = Value::Sequence(vec![Value::from("b"), Value::from("c")]);
        let out = t.render(&vars(&[("xs", xs)])).unwrap();
        assert_eq!(
            serde_yaml_ng::to_string(&out["l"]).unwrap(),
            "- a\n- b\n- c\n- z\n"
        );
        let out = t.render(&vars(&[("xs", Value::Sequence(vec![]))])).unwrap();
        assert_eq!(out["l"].as_sequence().unwrap().len(), 2);
    }

    #[test]
    fn text_with_quotes_survives_and_inline_placeholders_join() {
        let json = r#"{"role":"picker","a":'x'}"#;
        let t = Template::parse("v: \"{{c}}\"\nn: \"pool:{{m}}/{{k}}\"\n").unwrap();
        let out = t
            .render(&vars(&[
                ("c", Value::from(json)),
                ("m", Value::from("llama/3")),
                ("k", Value::from(7)),
            ]))
            .unwrap();
        let text = serde_yaml_ng::to_string(&out).unwrap();
        let back: Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back["v"].as_str(), Some(json));
        assert_eq!(back["n"].as_str(), Some("pool:llama/3/7"));
    }

    #[test]
    fn missing_value_and_misplaced_splice_are_errors() {
        let t = Template::parse("a: \"{{nope}}\"\n").unwrap();
        assert!(t.render(&Vars::new()).is_err());
        let t = Template::parse("a: \"{{...xs}}\"\n").unwrap();
        assert!(t.render(&vars(&[("xs", Value::Sequence(vec![]))])).is_err());
        let t = Template::parse("a: \"x{{y\"\n").unwrap();
        assert!(t.render(&vars(&[("y", Value::from(1))])).is_err());
    }

    #[test]
    fn prototypes_are_removed_from_the_body_and_render_alone() {
        let t = Template::parse("x-infergate:\n  r: {name: \"{{m}}\"}\nkeep: 1\n").unwrap();
        let body = t.render(&Vars::new()).unwrap();
        assert!(body.get("x-infergate").is_none());
        let r = t.prototype("r", &vars(&[("m", Value::from("a"))])).unwrap();
        assert_eq!(r["name"].as_str(), Some("a"));
        assert!(t.prototype("missing", &Vars::new()).is_err());
    }
}
