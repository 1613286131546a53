//! Small serde building blocks for the one-pass parser: a typed-error side channel and a
//! "whatever scalar is here" visitor.
//!
//! serde's own type errors are strings; to answer 400 with the field name, visitors
//! record a [`RequestError`] in a [`Sink`] before aborting, and `parse` prefers it over the
//! generic "not JSON" answer.

use super::stream::Stream;
use super::RequestError;
use alloc::borrow::Cow;
use alloc::string::String;
use core::fmt;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Where visitors write prompt bytes and record the first typed error.
pub(crate) struct Sink<'a> {
    /// The byte stream being built.
    pub out: &'a mut Stream,
    /// The first typed error seen, if any.
    pub err: &'a mut Option<RequestError>,
}

impl Sink<'_> {
    /// A shorter-lived copy of this sink, for a nested visitor.
    pub fn reborrow(&mut self) -> Sink<'_> {
        Sink {
            out: self.out,
            err: self.err,
        }
    }
}

/// Records `e` (first one wins) and returns a serde error that aborts parsing.
pub(crate) fn fail<E: de::Error>(err: &mut Option<RequestError>, e: RequestError) -> E {
    if err.is_none() {
        *err = Some(e);
    }
    E::custom("typed request error")
}

/// Shorthand for a wrong-type error on `field`.
pub(crate) fn wrong<E: de::Error>(
    err: &mut Option<RequestError>,
    field: &'static str,
    expected: &'static str,
) -> E {
    fail(err, RequestError::WrongType { field, expected })
}

/// Any JSON value, reduced to what the scalar fields need; arrays and objects are skipped.
#[derive(Debug)]
pub(crate) enum Scalar<'de> {
    Null,
    Bool(bool),
    U64(u64),
    Negative,
    F64(f64),
    Str(Cow<'de, str>),
    Compound,
}

impl<'de> Scalar<'de> {
    /// A non-negative integer (integral floats accepted), `Ok(None)` for null, `Err(())` otherwise.
    pub fn as_count(&self) -> Result<Option<u64>, ()> {
        match *self {
            Scalar::Null => Ok(None),
            Scalar::U64(n) => Ok(Some(n)),
            Scalar::F64(f) if (0.0..1.8e19).contains(&f) && (f as u64) as f64 == f => {
                Ok(Some(f as u64))
            }
            _ => Err(()),
        }
    }

    /// A boolean, `Ok(None)` for null.
    pub fn as_bool(&self) -> Result<Option<bool>, ()> {
        match *self {
            Scalar::Null => Ok(None),
            Scalar::Bool(b) => Ok(Some(b)),
            _ => Err(()),
        }
    }

    /// A string, `Ok(None)` for null.
    pub fn into_str(self) -> Result<Option<Cow<'de, str>>, ()> {
        match self {
            Scalar::Null => Ok(None),
            Scalar::Str(s) => Ok(Some(s)),
            _ => Err(()),
        }
    }
}

/// Deserializes any value into a [`Scalar`].
pub(crate) struct ScalarSeed;

impl<'de> DeserializeSeed<'de> for ScalarSeed {
    type Value = Scalar<'de>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Scalar::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Scalar::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(v).map_or(Scalar::Negative, Scalar::U64))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Scalar::F64(v))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(String::from(v))))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Scalar::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Compound)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Compound)
    }
}

/// Deserializes an object key as a borrowed-or-owned string without allocating when the
/// key has no escapes.
pub(crate) struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(String::from(v)))
    }
}
