//! The `/v1/completions` `prompt`: a string, an array of strings, an array of token ids or an
//! array of token-id arrays, written into the canonical byte stream described in [`super`].
//!
//! The value also says how many prompts it holds, since the engine answers each prompt of a
//! batch: an array of strings or of token-id arrays is that many prompts; a string or a flat
//! array of token ids is one; null and an empty array count 0 (the caller reads 0 as one).

use super::scalar::{wrong, Sink};
use super::RS;
use core::fmt;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

const FIELD: &str = "prompt";
const EXPECTED: &str = "string, array of strings, array of token ids or array of token-id arrays";
const ID_FIELD: &str = "prompt[]";
const ID_EXPECTED: &str = "token id (integer 0..=4294967295)";
/// Separates the token-id arrays of a batch prompt: one pseudo-token, so 4-byte alignment holds.
const ARRAY_SEPARATOR: [u8; 4] = [0xff; 4];

/// What the elements of a prompt array are; mixing kinds is a type error.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Strings,
    Ids,
    IdArrays,
}

/// The whole `prompt` value; its value is the number of prompts it holds (module doc).
pub(crate) struct PromptSeed<'a> {
    pub sink: Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for PromptSeed<'_> {
    type Value = u64;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PromptSeed<'_> {
    type Value = u64;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        self.sink.out.extend_from_slice(v.as_bytes());
        Ok(1)
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        Ok(0)
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<u64, A::Error> {
        let mut kind = None;
        let mut elements = 0u64;
        while seq
            .next_element_seed(ElementSeed {
                sink: self.sink.reborrow(),
                kind: &mut kind,
            })?
            .is_some()
        {
            elements = elements.saturating_add(1);
        }
        // A flat array of token ids is one prompt; an array of strings or of id arrays, a
        // batch of one prompt per element.
        Ok(if kind == Some(Kind::Ids) { 1 } else { elements })
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<u64, A::Error> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<u64, E> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<u64, E> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<u64, E> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<u64, E> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
}

/// One element of a prompt array.
struct ElementSeed<'a, 'k> {
    sink: Sink<'a>,
    kind: &'k mut Option<Kind>,
}

impl ElementSeed<'_, '_> {
    /// Checks the element kind against the first element's; returns whether this is not the first.
    fn admit<E: de::Error>(&mut self, kind: Kind) -> Result<bool, E> {
        match *self.kind {
            None => {
                *self.kind = Some(kind);
                Ok(false)
            }
            Some(k) if k == kind => Ok(true),
            Some(_) => Err(wrong(self.sink.err, FIELD, EXPECTED)),
        }
    }
}

impl<'de> DeserializeSeed<'de> for ElementSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElementSeed<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }
    fn visit_str<E: de::Error>(mut self, v: &str) -> Result<(), E> {
        if self.admit(Kind::Strings)? {
            self.sink.out.push(RS);
        }
        self.sink.out.extend_from_slice(v.as_bytes());
        Ok(())
    }
    fn visit_u64<E: de::Error>(mut self, v: u64) -> Result<(), E> {
        self.admit(Kind::Ids)?;
        push_id(self.sink, v)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(wrong(self.sink.err, ID_FIELD, ID_EXPECTED))
    }
    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        if self.admit(Kind::IdArrays)? {
            self.sink.out.extend_from_slice(&ARRAY_SEPARATOR);
        }
        while seq
            .next_element_seed(IdSeed {
                sink: self.sink.reborrow(),
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(wrong(self.sink.err, FIELD, EXPECTED))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(wrong(self.sink.err, ID_FIELD, ID_EXPECTED))
    }
}

fn push_id<E: de::Error>(sink: Sink<'_>, v: u64) -> Result<(), E> {
    match u32::try_from(v) {
        Ok(id) => {
            sink.out.extend_from_slice(&id.to_le_bytes());
            Ok(())
        }
        Err(_) => Err(wrong(sink.err, ID_FIELD, ID_EXPECTED)),
    }
}

/// One token id inside a token-id array.
struct IdSeed<'a> {
    sink: Sink<'a>,
}

impl<'de> DeserializeSeed<'de> for IdSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for IdSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ID_EXPECTED)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        push_id(self.sink, v)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(wrong(self.sink.err, "prompt[][]", ID_EXPECTED))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(wrong(self.sink.err, "prompt[][]", ID_EXPECTED))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(wrong(self.sink.err, "prompt[][]", ID_EXPECTED))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(wrong(self.sink.err, "prompt[][]", ID_EXPECTED))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(wrong(self.sink.err, "prompt[][]", ID_EXPECTED))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(wrong(self.sink.err, "prompt[][]", ID_EXPECTED))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(wrong(self.sink.err, "prompt[][]", ID_EXPECTED))
    }
}
