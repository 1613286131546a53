//! One content part (OpenAI) or content block (Anthropic): text is written as it is
//! parsed; media and other parts become the markers described in [`super`].

use super::canonical;
use super::content::{opt_str, Names};
use super::scalar::{wrong, KeySeed, Sink};
use super::{SUB, US};
use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// Part types whose `text` is the content.
const TEXT_TYPES: &[&str] = &["text", "input_text", "output_text"];
/// Part types that carry media: they contribute a marker with a digest, not their data.
const MEDIA_TYPES: &[&str] = &[
    "image_url",
    "image",
    "input_image",
    "input_audio",
    "audio",
    "file",
    "input_file",
    "document",
    "video",
    "video_url",
];

/// One content part (OpenAI) or content block (Anthropic).
pub(crate) struct PartSeed<'a> {
    pub sink: Sink<'a>,
    pub names: &'static Names,
}

impl<'de> DeserializeSeed<'de> for PartSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PartSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a content part object")
    }
    /// A bare string inside a content array is taken as a text part.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.sink.out.extend_from_slice(v.as_bytes());
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let start = self.sink.out.len();
        let mut part_type: Option<Cow<'de, str>> = None;
        let mut has_text = false;
        let mut others: Vec<(Cow<'de, str>, Value)> = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match &*key {
                "type" => part_type = opt_str(&mut map, &mut self.sink, self.names.part_type)?,
                "text" => {
                    // A repeated `text` replaces the earlier one, as in a JSON object.
                    self.sink.out.truncate(start);
                    has_text = map.next_value_seed(TextSeed {
                        sink: self.sink.reborrow(),
                        field: self.names.text,
                    })?;
                }
                // Anthropic caching hints move between turns; they are not content.
                "cache_control" => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => others.push((key, map.next_value::<Value>()?)),
            }
        }
        let part_type = match part_type {
            Some(t) if !TEXT_TYPES.contains(&&*t) => t,
            _ => return Ok(()),
        };
        // Not a text part: its text (rare) joins the other fields in the marker.
        let out = &mut *self.sink.out;
        if has_text {
            let text = String::from_utf8_lossy(out.get(start..).unwrap_or_default()).into_owned();
            others.push((Cow::Borrowed("text"), Value::String(text)));
        }
        out.truncate(start);
        let mut entries: Vec<(&str, &Value)> = others.iter().map(|(k, v)| (&**k, v)).collect();
        entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        out.push(SUB);
        out.extend_from_slice(part_type.as_bytes());
        out.push(US);
        if MEDIA_TYPES.contains(&&*part_type) {
            let mut json = Vec::new();
            canonical::write_object(&entries, &mut json);
            push_hex64(out, xxhash_rust::xxh3::xxh3_64(&json));
        } else {
            canonical::write_object(&entries, out);
        }
        out.push(SUB);
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(wrong(self.sink.err, self.names.part, "object"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(wrong(self.sink.err, self.names.part, "object"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(wrong(self.sink.err, self.names.part, "object"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(wrong(self.sink.err, self.names.part, "object"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(wrong(self.sink.err, self.names.part, "object"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(wrong(self.sink.err, self.names.part, "object"))
    }
}

/// 16 lowercase hex digits, most significant first.
fn push_hex64(out: &mut Vec<u8>, v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((v >> (shift * 4)) & 0xf) as usize]);
    }
}

/// A part's `text`: a string appended to the output, or null.
struct TextSeed<'a> {
    sink: Sink<'a>,
    field: &'static str,
}

impl<'de> DeserializeSeed<'de> for TextSeed<'_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextSeed<'_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        self.sink.out.extend_from_slice(v.as_bytes());
        Ok(true)
    }
    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<bool, A::Error> {
        Err(wrong(self.sink.err, self.field, "string"))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<bool, A::Error> {
        Err(wrong(self.sink.err, self.field, "string"))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<bool, E> {
        Err(wrong(self.sink.err, self.field, "string"))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<bool, E> {
        Err(wrong(self.sink.err, self.field, "string"))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<bool, E> {
        Err(wrong(self.sink.err, self.field, "string"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<bool, E> {
        Err(wrong(self.sink.err, self.field, "string"))
    }
}
