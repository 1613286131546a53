//! Typed reading of a plugin's `parameters` map, with errors that name the plugin and the
//! parameter. Unknown parameter names are refused so that a typo is not silently ignored.
//!
//! **Describe mode.** [`Params::describing`] reads no map (every parameter takes its
//! default) and records, into a [`Recorder`], the names [`Params::only`] accepts and, for
//! each getter called, the parameter's kind, default and accepted values: compiling a plugin
//! that way describes its parameters from the code that reads them
//! (`crate::scheduling::describe`). A default that is not one constant (it depends on the
//! endpoint, or on another parameter) is annotated where it is read
//! ([`Params::note_default`], [`Params::note_range`]), and a value the plugin parses itself
//! is read with [`Params::raw`], which records what it is. Outside describe mode the
//! recorder is `None` and every getter reads as before: one branch per parameter, at config
//! time only.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::Cell;
use core::fmt;
use serde_json::{Map, Value};

use super::ConfigError;

/// The default of a described parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DefaultDoc {
    /// A value, as the configuration would write it (`64`, `false`, `{"type":"sim"}`).
    Value(String),
    /// Prose, for a default that is not one constant (it depends on the endpoint or on
    /// another parameter) or that is no value at all.
    Note(String),
}

/// One parameter of a plugin, as describe mode records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamDoc {
    /// Its key in `parameters`.
    pub name: String,
    /// What it holds: `integer`, `number`, `boolean`, `quantity`, `duration`, `string`, a
    /// list or a map (with what they hold).
    pub kind: String,
    /// What it is when absent or `null`.
    pub default: DefaultDoc,
    /// The values accepted, when narrower than the kind (`1..=64`, `≥ 0`, `> 0`).
    pub range: Option<String>,
}

/// What describe mode records while a plugin compiles without parameters.
#[derive(Default)]
pub(crate) struct Recorder {
    /// The names [`Params::only`] accepts, in its order.
    known: Cell<Vec<String>>,
    /// The parameters the getters read, in reading order.
    params: Cell<Vec<ParamDoc>>,
    /// Notes about a parameter no getter had read when the note was made.
    stray_notes: Cell<Vec<String>>,
}

/// What one plugin's compilation in describe mode recorded.
pub(crate) struct Recorded {
    /// The names [`Params::only`] accepts, in its order.
    pub(crate) known: Vec<String>,
    /// The parameters the getters read, in reading order.
    pub(crate) params: Vec<ParamDoc>,
    /// Notes ([`Params::note_default`], [`Params::note_range`]) about a parameter no getter
    /// had read: a misplaced note.
    pub(crate) stray_notes: Vec<String>,
}

impl Recorder {
    /// Everything recorded so far.
    pub(crate) fn take(&self) -> Recorded {
        Recorded {
            known: self.known.take(),
            params: self.params.take(),
            stray_notes: self.stray_notes.take(),
        }
    }

    fn accept(&self, known: &[&str]) {
        let mut k = self.known.take();
        k.extend(known.iter().map(|s| s.to_string()));
        self.known.set(k);
    }

    fn param(&self, key: &str, kind: fmt::Arguments<'_>, default: DefaultDoc, range: Span) {
        let doc = ParamDoc {
            name: key.to_string(),
            kind: kind.to_string(),
            default,
            range: range.text(),
        };
        let mut params = self.params.take();
        match params.iter_mut().find(|p| p.name == key) {
            Some(p) => *p = doc,
            None => params.push(doc),
        }
        self.params.set(params);
    }

    fn note(&self, key: &str, edit: impl FnOnce(&mut ParamDoc)) {
        let mut params = self.params.take();
        match params.iter_mut().find(|p| p.name == key) {
            Some(p) => edit(p),
            None => {
                let mut stray = self.stray_notes.take();
                stray.push(key.to_string());
                self.stray_notes.set(stray);
            }
        }
        self.params.set(params);
    }
}

/// The values a getter accepts, for describe mode.
#[derive(Clone, Copy)]
enum Span {
    /// Anything of the kind.
    Any,
    /// An integer in `min..=max`.
    Int(u64, u64),
    /// A number from `min` (excluded when `open`) to `max`.
    Num { min: f64, open: bool, max: f64 },
    /// Described in words.
    Text(&'static str),
}

impl Span {
    fn text(self) -> Option<String> {
        match self {
            Span::Any => None,
            Span::Int(min, u64::MAX) => Some(format!("≥ {min}")),
            Span::Int(min, max) => Some(format!("{min}..={max}")),
            Span::Num { min, open, max } => {
                let low = if open { "> " } else { "≥ " };
                Some(match (max == f64::MAX, open) {
                    (true, _) => format!("{low}{min}"),
                    (false, false) => format!("{min}..={max}"),
                    (false, true) => format!("> {min}, ≤ {max}"),
                })
            }
            Span::Text(t) => Some(t.to_string()),
        }
    }
}

/// The parameters of one plugin instance, being read.
pub(crate) struct Params<'a> {
    plugin: &'a str,
    map: Option<&'a Map<String, Value>>,
    /// Describe mode's record (see the module doc); `None` when reading a config.
    recorder: Option<&'a Recorder>,
}

impl<'a> Params<'a> {
    /// Wraps `parameters` of plugin `plugin`; absent or `null` means "all defaults".
    pub(crate) fn new(plugin: &'a str, value: Option<&'a Value>) -> Result<Self, ConfigError> {
        let map = match value {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => return Err(bad(plugin, "parameters", "must be a map")),
        };
        Ok(Params {
            plugin,
            map,
            recorder: None,
        })
    }

    /// No parameters (every default), in describe mode: `recorder` records what is read.
    pub(crate) fn describing(plugin: &'a str, recorder: &'a Recorder) -> Self {
        Params {
            plugin,
            map: None,
            recorder: Some(recorder),
        }
    }

    /// Describe mode: records `key` (see the module doc).
    fn record(&self, key: &str, kind: fmt::Arguments<'_>, default: fmt::Arguments<'_>, span: Span) {
        if let Some(r) = self.recorder {
            r.param(key, kind, DefaultDoc::Value(default.to_string()), span);
        }
    }

    /// Describe mode: the default of `key`, read by a getter before, is `text` (prose: it is
    /// not one constant, or no value). Nothing otherwise.
    pub(crate) fn note_default(&self, key: &str, text: fmt::Arguments<'_>) {
        if let Some(r) = self.recorder {
            r.note(key, |p| p.default = DefaultDoc::Note(text.to_string()));
        }
    }

    /// Describe mode: the values `key`, read by a getter before, accepts are `text` (they
    /// depend on another parameter). Nothing otherwise.
    pub(crate) fn note_range(&self, key: &str, text: fmt::Arguments<'_>) {
        if let Some(r) = self.recorder {
            r.note(key, |p| p.range = Some(text.to_string()));
        }
    }

    /// Refuses any parameter not in `known`.
    pub(crate) fn only(&self, known: &[&str]) -> Result<(), ConfigError> {
        if let Some(r) = self.recorder {
            r.accept(known);
        }
        if let Some(map) = self.map {
            if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
                let expected = if known.is_empty() {
                    "this plugin takes no parameters".to_string()
                } else {
                    format!("unknown parameter (known: {})", known.join(", "))
                };
                return Err(bad(self.plugin, k, &expected));
            }
        }
        Ok(())
    }

    /// The raw value of `key` (`null` counts as absent).
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.and_then(|m| m.get(key)).filter(|v| !v.is_null())
    }

    /// A finite number in `[min, max]`.
    pub(crate) fn f64_in(
        &self,
        key: &str,
        default: f64,
        min: f64,
        max: f64,
    ) -> Result<f64, ConfigError> {
        let span = Span::Num {
            min,
            open: false,
            max,
        };
        self.record(key, format_args!("number"), format_args!("{default}"), span);
        match self.get(key) {
            None => Ok(default),
            Some(v) => number_in(self.plugin, key, v, min, max),
        }
    }

    /// A finite number in `(0, max]`: the errors of [`Params::f64_in`] over `[0, max]`,
    /// then "must be greater than 0" (the default too is checked).
    pub(crate) fn f64_positive(
        &self,
        key: &str,
        default: f64,
        max: f64,
    ) -> Result<f64, ConfigError> {
        let x = self.f64_in(key, default, 0.0, max)?;
        self.note_span(
            key,
            Span::Num {
                min: 0.0,
                open: true,
                max,
            },
        );
        if x <= 0.0 {
            return Err(bad(self.plugin, key, "must be greater than 0"));
        }
        Ok(x)
    }

    /// An integer in `[min, max]`.
    pub(crate) fn u64_in(
        &self,
        key: &str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, ConfigError> {
        self.record(
            key,
            format_args!("integer"),
            format_args!("{default}"),
            Span::Int(min, max),
        );
        Ok(self.u64_read(key, min, max)?.unwrap_or(default))
    }

    /// An integer in `[min, max]`, `None` when absent: what that means (the default, in
    /// words) is `default`, for describe mode.
    pub(crate) fn u64_opt_in(
        &self,
        key: &str,
        min: u64,
        max: u64,
        default: fmt::Arguments<'_>,
    ) -> Result<Option<u64>, ConfigError> {
        if let Some(r) = self.recorder {
            let doc = DefaultDoc::Note(default.to_string());
            r.param(key, format_args!("integer"), doc, Span::Int(min, max));
        }
        self.u64_read(key, min, max)
    }

    fn u64_read(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(bad(
                    self.plugin,
                    key,
                    &format!("must be an integer in {min}..={max}, got {v}"),
                )),
            },
        }
    }

    /// The raw value of `key` (`null` counts as absent), for a value the caller parses
    /// itself; describe mode records `kind`, `default` (a value, as the configuration would
    /// write it) and `range` (the values accepted, in words).
    pub(crate) fn raw(
        &self,
        key: &str,
        kind: &'static str,
        default: fmt::Arguments<'_>,
        range: Option<&'static str>,
    ) -> Option<&'a Value> {
        let span = range.map_or(Span::Any, Span::Text);
        self.record(key, format_args!("{kind}"), default, span);
        self.get(key)
    }

    /// Describe mode: `key`'s range is `span`.
    fn note_span(&self, key: &str, span: Span) {
        if let Some(r) = self.recorder {
            r.note(key, |p| p.range = span.text());
        }
    }

    /// Whether `key` is present (and not null).
    pub(crate) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// A boolean.
    pub(crate) fn bool(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        self.record(
            key,
            format_args!("boolean"),
            format_args!("{default}"),
            Span::Any,
        );
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(bad(
                self.plugin,
                key,
                &format!("must be true or false, got {v}"),
            )),
        }
    }

    /// An array (absent → empty) of `items` (what describe mode records of them).
    pub(crate) fn array(&self, key: &str, items: &'static str) -> Result<&'a [Value], ConfigError> {
        self.record(
            key,
            format_args!("list of {items}"),
            format_args!("[]"),
            Span::Any,
        );
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(a)) => Ok(a.as_slice()),
            Some(v) => Err(bad(self.plugin, key, &format!("must be a list, got {v}"))),
        }
    }

    /// A map of strings under `key` whose keys are all in `known` (absent → empty), read
    /// as `(key, value)` pairs; errors name the nested key (`profiles.decode`).
    pub(crate) fn string_map(
        &self,
        key: &str,
        known: &[&str],
    ) -> Result<alloc::vec::Vec<(&'a str, &'a str)>, ConfigError> {
        if let Some(r) = self.recorder {
            let keys: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            let kind = format_args!("map (keys {}) of names", keys.join(", "));
            r.param(key, kind, DefaultDoc::Value("{}".to_string()), Span::Any);
        }
        let Some(v) = self.get(key) else {
            return Ok(alloc::vec::Vec::new());
        };
        let Value::Object(m) = v else {
            return Err(bad(self.plugin, key, &format!("must be a map, got {v}")));
        };
        let mut out = alloc::vec::Vec::with_capacity(m.len());
        for (k, v) in m {
            let path = format!("{key}.{k}");
            if !known.contains(&k.as_str()) {
                return Err(bad(
                    self.plugin,
                    &path,
                    &format!("unknown key (known: {})", known.join(", ")),
                ));
            }
            match v {
                Value::Null => {}
                Value::String(s) if !s.is_empty() => out.push((k.as_str(), s.as_str())),
                _ => {
                    return Err(bad(
                        self.plugin,
                        &path,
                        &format!("must be a non-empty name, got {v}"),
                    ))
                }
            }
        }
        Ok(out)
    }

    /// The plugin instance name (for nested errors).
    pub(crate) fn plugin(&self) -> &'a str {
        self.plugin
    }
}

/// A finite number in `[min, max]` read from `v`, or an error naming `plugin` and `key`.
pub(crate) fn number_in(
    plugin: &str,
    key: &str,
    v: &Value,
    min: f64,
    max: f64,
) -> Result<f64, ConfigError> {
    match v.as_f64() {
        Some(x) if x.is_finite() && x >= min && x <= max => Ok(x),
        _ => Err(bad(
            plugin,
            key,
            &format!("must be a number in {min}..={max}, got {v}"),
        )),
    }
}

/// A [`ConfigError::BadParameter`].
pub(crate) fn bad(plugin: &str, parameter: &str, reason: &str) -> ConfigError {
    ConfigError::BadParameter {
        plugin: plugin.to_string(),
        parameter: parameter.to_string(),
        reason: reason.to_string(),
    }
}
