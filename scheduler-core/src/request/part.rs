//! One content part (OpenAI) or content block (Anthropic): text is written as it is
//! parsed; media and other parts become the markers described in [`super`].

use super::canonical::{self, CanonSeed, Members};
use super::content::{opt_str, Names};
use super::scalar::{wrong, KeySeed, Sink};
use super::stream::Stream;
use super::{SUB, US};
use alloc::borrow::Cow;
use alloc::string::String;
use core::fmt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

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
        // The text, kept aside only when the output could not store all of it and the part
        // may turn out not to be text (its text then goes into the marker).
        let mut spilled: Option<String> = None;
        let mut others = Members::default();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let known_text = part_type
                .as_deref()
                .is_some_and(|t| TEXT_TYPES.contains(&t));
            match &*key {
                "type" => part_type = opt_str(&mut map, &mut self.sink, self.names.part_type)?,
                "text" => {
                    // A repeated `text` replaces the earlier one, as in a JSON object.
                    self.sink.out.truncate(start);
                    spilled = None;
                    has_text = map.next_value_seed(TextSeed {
                        sink: self.sink.reborrow(),
                        field: self.names.text,
                        spill: (!known_text).then_some(&mut spilled),
                    })?;
                }
                // Anthropic caching hints move between turns; they are not content. The
                // other fields of a text part are not content either.
                "cache_control" => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ if known_text => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    // Kept whole: a media marker digests its fields whole, and a later
                    // `type` may still make this part one.
                    others.push_with(&key, usize::MAX, |value| {
                        map.next_value_seed(CanonSeed { out: value })
                    })?;
                }
            }
        }
        let part_type = match part_type {
            Some(t) if !TEXT_TYPES.contains(&&*t) => t,
            _ => return Ok(()),
        };
        // Not a text part: its text (rare) joins the other fields in the marker.
        let out = &mut *self.sink.out;
        if has_text {
            let text = spilled
                .unwrap_or_else(|| String::from_utf8_lossy(out.stored_from(start)).into_owned());
            others.push_with::<A::Error>("text", usize::MAX, |value| {
                canonical::write_string(text.as_bytes(), value);
                Ok(())
            })?;
        }
        out.truncate(start);
        out.push(SUB);
        out.extend_from_slice(part_type.as_bytes());
        out.push(US);
        if MEDIA_TYPES.contains(&&*part_type) {
            let mut json = Stream::unbounded();
            others.write_sorted(&mut json);
            push_hex64(out, xxhash_rust::xxh3::xxh3_64(json.bytes()));
        } else {
            others.write_sorted(out);
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
fn push_hex64(out: &mut Stream, v: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(HEX[((v >> (shift * 4)) & 0xf) as usize]);
    }
}

/// A part's `text`: a string appended to the output, or null.
struct TextSeed<'a, 's> {
    sink: Sink<'a>,
    field: &'static str,
    /// Where to keep a copy of the text if the output cannot store all of it.
    spill: Option<&'s mut Option<String>>,
}

impl<'de> DeserializeSeed<'de> for TextSeed<'_, '_> {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextSeed<'_, '_> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
        self.sink.out.extend_from_slice(v.as_bytes());
        if let Some(spill) = self.spill {
            if !self.sink.out.is_complete() {
                *spill = Some(String::from(v));
            }
        }
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
