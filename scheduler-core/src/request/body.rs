//! The top-level body visitor: one pass over the JSON object, dispatching each field the
//! gateway reads to its visitor and skipping everything else with `IgnoredAny`.

use super::canonical;
use super::content::{ContentSeed, MessagesSeed, SYSTEM};
use super::prompt::PromptSeed;
use super::scalar::{fail, wrong, KeySeed, ScalarSeed, Sink};
use super::stream::Stream;
use super::{Api, RequestError, GS, RS, US};
use alloc::string::String;
use core::fmt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Scalar fields collected from the body.
#[derive(Default)]
pub(crate) struct Fields {
    pub model: Option<String>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    /// `n` (OpenAI APIs only): completions returned per prompt.
    pub n: Option<u64>,
    /// `best_of` (OpenAI APIs only): sequences generated per prompt, the best `n` returned.
    pub best_of: Option<u64>,
    /// Prompts of a `/v1/completions` batch as counted by [`PromptSeed`]; 0 when no `prompt`
    /// was read (one prompt, as for every other API).
    pub prompts: u64,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub cache_salt: Option<String>,
}

/// Output buffers: the prompt proper, and the sections that go before it whatever their
/// position in the JSON (tools, then Anthropic `system`).
pub(crate) struct Buffers<'a> {
    pub prompt: &'a mut Stream,
    pub tools: &'a mut Stream,
    pub system: &'a mut Stream,
    pub err: &'a mut Option<RequestError>,
    pub fields: &'a mut Fields,
}

/// The body object for one API.
pub(crate) struct BodySeed<'a> {
    pub api: Api,
    pub bufs: Buffers<'a>,
}

impl<'de> DeserializeSeed<'de> for BodySeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let api = self.api;
        let b = self.bufs;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match &*key {
                "model" => {
                    let model = map.next_value_seed(ScalarSeed)?.into_str();
                    match model {
                        Ok(Some(m)) if !m.is_empty() => b.fields.model = Some(m.into_owned()),
                        Ok(Some(_)) => return Err(fail(b.err, RequestError::MissingModel)),
                        _ => return Err(wrong(b.err, "model", "string")),
                    }
                }
                "messages" if api != Api::Completions => {
                    // A repeated key replaces the earlier value, as in a JSON object.
                    b.prompt.clear();
                    map.next_value_seed(MessagesSeed {
                        sink: Sink {
                            out: b.prompt,
                            err: b.err,
                        },
                    })?;
                }
                "prompt" if api == Api::Completions => {
                    b.prompt.clear();
                    b.fields.prompts = map.next_value_seed(PromptSeed {
                        sink: Sink {
                            out: b.prompt,
                            err: b.err,
                        },
                    })?;
                }
                "tools" if api != Api::Completions => {
                    b.tools.clear();
                    map.next_value_seed(ToolsSeed {
                        out: b.tools,
                        err: b.err,
                    })?;
                }
                "system" if api == Api::AnthropicMessages => {
                    b.system.clear();
                    let present = map.next_value_seed(ContentSeed {
                        sink: Sink {
                            out: b.system,
                            err: b.err,
                        },
                        names: &SYSTEM,
                    })?;
                    if present {
                        b.system.push(US);
                        b.system.extend_from_slice(b"system");
                        b.system.push(RS);
                    }
                }
                "max_tokens" => {
                    b.fields.max_tokens = map
                        .next_value_seed(ScalarSeed)?
                        .as_count()
                        .map_err(|()| wrong(b.err, "max_tokens", "non-negative integer"))?;
                }
                "max_completion_tokens" => {
                    b.fields.max_completion_tokens =
                        map.next_value_seed(ScalarSeed)?.as_count().map_err(|()| {
                            wrong(b.err, "max_completion_tokens", "non-negative integer")
                        })?;
                }
                "n" if api != Api::AnthropicMessages => {
                    b.fields.n = map
                        .next_value_seed(ScalarSeed)?
                        .as_count()
                        .map_err(|()| wrong(b.err, "n", "non-negative integer"))?;
                }
                "best_of" if api != Api::AnthropicMessages => {
                    b.fields.best_of = map
                        .next_value_seed(ScalarSeed)?
                        .as_count()
                        .map_err(|()| wrong(b.err, "best_of", "non-negative integer"))?;
                }
                "stream" => {
                    b.fields.stream = map
                        .next_value_seed(ScalarSeed)?
                        .as_bool()
                        .map_err(|()| wrong(b.err, "stream", "boolean"))?
                        .unwrap_or(false);
                }
                "stream_options" => {
                    let options = map.next_value_seed(StreamOptionsSeed { err: b.err })?;
                    b.fields.include_usage = options.include_usage;
                    b.fields.continuous_usage = options.continuous_usage;
                }
                "cache_salt" => {
                    b.fields.cache_salt = map
                        .next_value_seed(ScalarSeed)?
                        .into_str()
                        .map_err(|()| wrong(b.err, "cache_salt", "string"))?
                        .map(|s| s.into_owned());
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(fail(self.bufs.err, RequestError::NotObject))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(fail(self.bufs.err, RequestError::NotObject))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(fail(self.bufs.err, RequestError::NotObject))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(fail(self.bufs.err, RequestError::NotObject))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(fail(self.bufs.err, RequestError::NotObject))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(fail(self.bufs.err, RequestError::NotObject))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(fail(self.bufs.err, RequestError::NotObject))
    }
}

/// `tools`: null, or an array written as `GS "tools" US <canonical JSON> RS` unless empty.
pub(crate) struct ToolsSeed<'a> {
    pub out: &'a mut Stream,
    pub err: &'a mut Option<RequestError>,
}

impl<'de> DeserializeSeed<'de> for ToolsSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ToolsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of tools")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        self.out.push(GS);
        self.out.extend_from_slice(b"tools");
        self.out.push(US);
        if canonical::write_array(seq, self.out)? == 0 {
            // An empty list is no tools.
            self.out.clear();
        } else {
            self.out.push(RS);
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(wrong(self.err, "tools", "array"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(wrong(self.err, "tools", "array"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(wrong(self.err, "tools", "array"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(wrong(self.err, "tools", "array"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(wrong(self.err, "tools", "array"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(wrong(self.err, "tools", "array"))
    }
}

/// The two flags of `stream_options` the gateway reads.
#[derive(Clone, Copy, Default)]
pub(crate) struct StreamOptions {
    pub include_usage: bool,
    pub continuous_usage: bool,
}

/// `stream_options`: an object (or null) whose `include_usage` and
/// `continuous_usage_stats` are read.
pub(crate) struct StreamOptionsSeed<'a> {
    pub err: &'a mut Option<RequestError>,
}

impl<'de> DeserializeSeed<'de> for StreamOptionsSeed<'_> {
    type Value = StreamOptions;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<StreamOptions, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StreamOptionsSeed<'_> {
    type Value = StreamOptions;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StreamOptions, A::Error> {
        let mut options = StreamOptions::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            if key == "include_usage" {
                options.include_usage = map
                    .next_value_seed(ScalarSeed)?
                    .as_bool()
                    .map_err(|()| wrong(self.err, "stream_options.include_usage", "boolean"))?
                    .unwrap_or(false);
            } else if key == "continuous_usage_stats" {
                options.continuous_usage = map
                    .next_value_seed(ScalarSeed)?
                    .as_bool()
                    .map_err(|()| {
                        wrong(self.err, "stream_options.continuous_usage_stats", "boolean")
                    })?
                    .unwrap_or(false);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(options)
    }
    fn visit_unit<E: de::Error>(self) -> Result<StreamOptions, E> {
        Ok(StreamOptions::default())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<StreamOptions, A::Error> {
        Err(wrong(self.err, "stream_options", "object"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<StreamOptions, E> {
        Err(wrong(self.err, "stream_options", "object"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<StreamOptions, E> {
        Err(wrong(self.err, "stream_options", "object"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<StreamOptions, E> {
        Err(wrong(self.err, "stream_options", "object"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<StreamOptions, E> {
        Err(wrong(self.err, "stream_options", "object"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<StreamOptions, E> {
        Err(wrong(self.err, "stream_options", "object"))
    }
}
