//! Typed reading of a plugin's `parameters` map, with errors that name the plugin and the
//! parameter. Unknown parameter names are refused so that a typo is not silently ignored.

use alloc::format;
use alloc::string::{String, ToString};
use serde_json::{Map, Value};

use super::ConfigError;

/// The parameters of one plugin instance, being read.
pub(crate) struct Params<'a> {
    plugin: &'a str,
    map: Option<&'a Map<String, Value>>,
}

impl<'a> Params<'a> {
    /// Wraps `parameters` of plugin `plugin`; absent or `null` means "all defaults".
    pub(crate) fn new(plugin: &'a str, value: Option<&'a Value>) -> Result<Self, ConfigError> {
        let map = match value {
            None | Some(Value::Null) => None,
            Some(Value::Object(m)) => Some(m),
            Some(_) => return Err(bad(plugin, "parameters", "must be a map")),
        };
        Ok(Params { plugin, map })
    }

    /// Refuses any parameter not in `known`.
    pub(crate) fn only(&self, known: &[&str]) -> Result<(), ConfigError> {
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
        match self.get(key) {
            None => Ok(default),
            Some(v) => number_in(self.plugin, key, v, min, max),
        }
    }

    /// An integer in `[min, max]`.
    pub(crate) fn u64_in(
        &self,
        key: &str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, ConfigError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(n),
                _ => Err(bad(
                    self.plugin,
                    key,
                    &format!("must be an integer in {min}..={max}, got {v}"),
                )),
            },
        }
    }

    /// Whether `key` is present (and not null).
    pub(crate) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// A boolean.
    pub(crate) fn bool(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
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

    /// An array (absent → empty).
    pub(crate) fn array(&self, key: &str) -> Result<&'a [Value], ConfigError> {
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
