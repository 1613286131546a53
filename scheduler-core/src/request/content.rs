//! Visitors for chat messages and their content (OpenAI and Anthropic), writing the
//! canonical prompt bytes described in [`super`] straight into the output buffer.

use super::canonical::OptCanonSeed;
use super::part::PartSeed;
use super::scalar::{wrong, KeySeed, ScalarSeed, Sink};
use super::stream::Stream;
use super::{RS, US};
use alloc::borrow::Cow;
use core::fmt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Field paths used in errors for one kind of content (message content or `system`).
pub(crate) struct Names {
    pub content: &'static str,
    pub part: &'static str,
    pub part_type: &'static str,
    pub text: &'static str,
}

/// Names for `messages[].content`.
pub(crate) const MESSAGE_CONTENT: Names = Names {
    content: "messages[].content",
    part: "messages[].content[]",
    part_type: "messages[].content[].type",
    text: "messages[].content[].text",
};

/// Names for the Anthropic top-level `system`.
pub(crate) const SYSTEM: Names = Names {
    content: "system",
    part: "system[]",
    part_type: "system[].type",
    text: "system[].text",
};

/// The `messages` array: each element is written as one canonical message.
pub(crate) struct MessagesSeed<'a> {
    pub sink: Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for MessagesSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessagesSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of messages")
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(MessageSeed {
                sink: self.sink.reborrow(),
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(wrong(self.sink.err, "messages", "array"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages", "array"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages", "array"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages", "array"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages", "array"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages", "array"))
    }
}

/// One message object: content first, then the role trailer.
pub(crate) struct MessageSeed<'a> {
    pub sink: Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for MessageSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// Reads an optional string field or records a wrong-type error for `field`.
pub(crate) fn opt_str<'de, A: MapAccess<'de>>(
    map: &mut A,
    sink: &mut Sink<'_>,
    field: &'static str,
) -> Result<Option<Cow<'de, str>>, A::Error> {
    map.next_value_seed(ScalarSeed)?
        .into_str()
        .map_err(|()| wrong(sink.err, field, "string"))
}

impl<'de> Visitor<'de> for MessageSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a message object")
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let mut role = None;
        let mut name = None;
        let mut tool_call_id = None;
        let mut tool_calls: Option<Stream> = None;
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match &*key {
                "content" => {
                    map.next_value_seed(ContentSeed {
                        sink: self.sink.reborrow(),
                        names: &MESSAGE_CONTENT,
                    })?;
                }
                "role" => role = opt_str(&mut map, &mut self.sink, "messages[].role")?,
                "name" => name = opt_str(&mut map, &mut self.sink, "messages[].name")?,
                "tool_call_id" => {
                    tool_call_id = opt_str(&mut map, &mut self.sink, "messages[].tool_call_id")?
                }
                "tool_calls" => {
                    // The trailer lands after everything written so far, so it never needs
                    // more than the room left from here.
                    let out = &*self.sink.out;
                    let mut calls = Stream::with_limit(out.room_from(out.len()), 0);
                    let present = map.next_value_seed(OptCanonSeed { out: &mut calls })?;
                    tool_calls = present.then_some(calls);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let out = &mut *self.sink.out;
        out.push(US);
        out.extend_from_slice(role.as_deref().unwrap_or("").as_bytes());
        if let Some(name) = name {
            push_attr(out, b"name", name.as_bytes());
        }
        if let Some(id) = tool_call_id {
            push_attr(out, b"tool_call_id", id.as_bytes());
        }
        if let Some(calls) = tool_calls {
            out.push(US);
            out.extend_from_slice(b"tool_calls");
            out.push(US);
            out.append(&calls);
        }
        out.push(RS);
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(wrong(self.sink.err, "messages[]", "object"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages[]", "object"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages[]", "object"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages[]", "object"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages[]", "object"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages[]", "object"))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(wrong(self.sink.err, "messages[]", "object"))
    }
}

fn push_attr(out: &mut Stream, key: &[u8], value: &[u8]) {
    out.push(US);
    out.extend_from_slice(key);
    out.push(US);
    out.extend_from_slice(value);
}

/// Message content (or Anthropic `system`): a string, null, or an array of parts.
/// Returns whether anything other than null was present.
pub(crate) struct ContentSeed<'a> {
    pub sink: Sink<'a>,
    pub names: &'static Names,
}

impl<'de> DeserializeSeed<'de> for ContentSeed<'_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ContentSeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or an array of content parts")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        self.sink.out.extend_from_slice(v.as_bytes());
        Ok(true)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<bool, A::Error> {
        while seq
            .next_element_seed(PartSeed {
                sink: self.sink.reborrow(),
                names: self.names,
            })?
            .is_some()
        {}
        Ok(true)
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<bool, A::Error> {
        Err(self.wrong())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Err(self.wrong())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Err(self.wrong())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Err(self.wrong())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Err(self.wrong())
    }
}

impl ContentSeed<'_> {
    fn wrong<E: de::Error>(self) -> E {
        wrong(
            self.sink.err,
            self.names.content,
            "string or array of content parts",
        )
    }
}
