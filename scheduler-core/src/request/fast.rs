//! The fast path of [`super::parse_with_limit`]: one hand-written pass over the bytes for
//! the shape nearly every request has (an object whose messages are `{"role": "...",
//! "content": "..."}`), decoding each content string straight into the prompt stream with
//! runs of plain bytes copied whole, and checking UTF-8 only inside strings (outside them
//! only ASCII is accepted).
//!
//! Whatever else a body holds is handed to the `serde_json` visitors of the other modules:
//! a field such as `tools` or `stream_options`, or a message in any other form, is first
//! checked and delimited by [`scan::skip_value`], then parsed alone from its own bytes.
//! Anything unusual or wrong (a repeated key, an escaped key, an exponent, a `\u`
//! surrogate, deep nesting, any error) makes [`parse`] answer `None`, and the caller parses
//! the whole body again with `serde_json`, which also produces every error. So a `Some` here
//! is always what that path gives (property-tested in `tests_fast.rs`).

use super::body::{Fields, StreamOptionsSeed, ToolsSeed};
use super::content::{ContentSeed, MessageSeed, SYSTEM};
use super::prompt::PromptSeed;
use super::scalar::Sink;
use super::scan::{self, ws};
use super::stream::Stream;
use super::{Api, RequestError, RS, US};
use alloc::string::String;
use serde::de::DeserializeSeed;

/// The three streams and the scalar fields the fast path fills.
pub(crate) struct Parts {
    pub prompt: Stream,
    pub tools: Stream,
    pub system: Stream,
    pub fields: Fields,
}

/// Parses `body` with `serde_json` through `seed`, all of it; `None` on any error.
fn sub<'de, S: DeserializeSeed<'de>>(body: &'de [u8], seed: S) -> Option<S::Value> {
    let text = core::str::from_utf8(body).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let value = seed.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// The raw bytes of the string at `i` (its `"`), if it has no escapes; and the index after it.
fn plain_str(b: &[u8], i: usize) -> Option<(&[u8], usize)> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let (end, escaped) = scan::skip_string(b, i + 1)?;
    if escaped {
        return None;
    }
    Some((b.get(i + 1..end - 1)?, end))
}

/// A string without escapes (`Some(Some)`), or null (`Some(None)`), as an owned `String`.
fn opt_string(b: &[u8], i: usize) -> Option<(Option<String>, usize)> {
    if let Some(end) = scan::literal(b, i, b"null") {
        return Some((None, end));
    }
    let (s, end) = plain_str(b, i)?;
    Some((Some(String::from(core::str::from_utf8(s).ok()?)), end))
}

/// A non-negative integer in plain digits that fits `u64`, or null.
fn opt_count(b: &[u8], i: usize) -> Option<(Option<u64>, usize)> {
    if let Some(end) = scan::literal(b, i, b"null") {
        return Some((None, end));
    }
    let n = b
        .get(i..)?
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let digits = b.get(i..i + n)?;
    if n == 0 || (n > 1 && digits.first() == Some(&b'0')) {
        return None;
    }
    // A fraction or an exponent: left to serde_json.
    if let Some(b'.' | b'e' | b'E') = b.get(i + n) {
        return None;
    }
    let v = digits.iter().try_fold(0u64, |v, &d| {
        v.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    Some((Some(v), i + n))
}

/// `true`, `false` or null (false).
fn opt_bool(b: &[u8], i: usize) -> Option<(bool, usize)> {
    if let Some(end) = scan::literal(b, i, b"true") {
        return Some((true, end));
    }
    let end = scan::literal(b, i, b"false").or_else(|| scan::literal(b, i, b"null"))?;
    Some((false, end))
}

/// The fields of the top-level object the fast path reads, each at most once.
#[derive(Clone, Copy)]
enum Key {
    Model,
    Messages,
    Prompt,
    Tools,
    System,
    MaxTokens,
    MaxCompletionTokens,
    N,
    BestOf,
    Stream,
    StreamOptions,
    CacheSalt,
}

impl Key {
    /// The field `name` means for `api`, as the `serde_json` path reads it (`None`: skipped).
    fn of(api: Api, name: &[u8]) -> Option<Key> {
        Some(match name {
            b"model" => Key::Model,
            b"messages" if api != Api::Completions => Key::Messages,
            b"prompt" if api == Api::Completions => Key::Prompt,
            b"tools" if api != Api::Completions => Key::Tools,
            b"system" if api == Api::AnthropicMessages => Key::System,
            b"max_tokens" => Key::MaxTokens,
            b"max_completion_tokens" => Key::MaxCompletionTokens,
            b"n" if api != Api::AnthropicMessages => Key::N,
            b"best_of" if api != Api::AnthropicMessages => Key::BestOf,
            b"stream" => Key::Stream,
            b"stream_options" => Key::StreamOptions,
            b"cache_salt" => Key::CacheSalt,
            _ => return None,
        })
    }
}

/// The fast parse of `body`, or `None` to leave it to the `serde_json` path.
pub(crate) fn parse(api: Api, b: &[u8], max_prompt_bytes: usize) -> Option<Parts> {
    let mut p = Parts {
        prompt: Stream::with_limit(max_prompt_bytes, b.len()),
        tools: Stream::with_limit(max_prompt_bytes, 0),
        system: Stream::with_limit(max_prompt_bytes, 0),
        fields: Fields::default(),
    };
    let mut seen = 0u16;
    let mut i = ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = ws(b, i + 1);
    if b.get(i) != Some(&b'}') {
        loop {
            let (name, after) = plain_str(b, i)?;
            i = ws(b, after);
            if b.get(i) != Some(&b':') {
                return None;
            }
            i = ws(b, i + 1);
            i = match Key::of(api, name) {
                None => scan::skip_value(b, i, 1)?,
                Some(key) => {
                    let bit = 1 << key as u16;
                    if seen & bit != 0 {
                        return None; // a repeated key: rare, left to serde_json
                    }
                    seen |= bit;
                    field(b, i, key, &mut p)?
                }
            };
            i = ws(b, i);
            match b.get(i)? {
                b',' => i = ws(b, i + 1),
                b'}' => break,
                _ => return None,
            }
        }
    }
    if ws(b, i + 1) != b.len() {
        return None;
    }
    Some(p)
}

/// Reads the value of `key` at `i` into `p`; returns the index after it.
fn field(b: &[u8], i: usize, key: Key, p: &mut Parts) -> Option<usize> {
    let f = &mut p.fields;
    let end = match key {
        Key::Model => {
            let (model, end) = opt_string(b, i)?;
            f.model = Some(model.filter(|m| !m.is_empty())?);
            end
        }
        Key::CacheSalt => {
            let (salt, end) = opt_string(b, i)?;
            f.cache_salt = salt;
            end
        }
        Key::MaxTokens => {
            let (n, end) = opt_count(b, i)?;
            f.max_tokens = n;
            end
        }
        Key::MaxCompletionTokens => {
            let (n, end) = opt_count(b, i)?;
            f.max_completion_tokens = n;
            end
        }
        Key::N => {
            let (n, end) = opt_count(b, i)?;
            f.n = n;
            end
        }
        Key::BestOf => {
            let (n, end) = opt_count(b, i)?;
            f.best_of = n;
            end
        }
        Key::Stream => {
            let (v, end) = opt_bool(b, i)?;
            f.stream = v;
            end
        }
        Key::Messages => messages(b, i, &mut p.prompt)?,
        Key::Prompt if b.get(i) == Some(&b'"') => {
            f.prompts = 1;
            scan::decode(b, i + 1, &mut p.prompt)?
        }
        Key::Prompt | Key::Tools | Key::System | Key::StreamOptions => {
            let end = scan::skip_value(b, i, 1)?;
            let value = b.get(i..end)?;
            let mut err: Option<RequestError> = None;
            match key {
                Key::Prompt => {
                    let sink = Sink {
                        out: &mut p.prompt,
                        err: &mut err,
                    };
                    f.prompts = sub(value, PromptSeed { sink })?;
                }
                Key::Tools => {
                    let (out, err) = (&mut p.tools, &mut err);
                    sub(value, ToolsSeed { out, err })?;
                }
                Key::System => {
                    let sink = Sink {
                        out: &mut p.system,
                        err: &mut err,
                    };
                    if sub(
                        value,
                        ContentSeed {
                            sink,
                            names: &SYSTEM,
                        },
                    )? {
                        p.system.push(US);
                        p.system.extend_from_slice(b"system");
                        p.system.push(RS);
                    }
                }
                _ => {
                    let options = sub(value, StreamOptionsSeed { err: &mut err })?;
                    f.include_usage = options.include_usage;
                    f.continuous_usage = options.continuous_usage;
                }
            }
            end
        }
    };
    Some(end)
}

/// The `messages` value at `i` (an array or null) into `out`; returns the index after it.
fn messages(b: &[u8], i: usize, out: &mut Stream) -> Option<usize> {
    if let Some(end) = scan::literal(b, i, b"null") {
        return Some(end);
    }
    if b.get(i) != Some(&b'[') {
        return None;
    }
    let mut i = ws(b, i + 1);
    if b.get(i) == Some(&b']') {
        return Some(i + 1);
    }
    loop {
        let mark = out.len();
        i = match message(b, i, out) {
            Some(end) => end,
            None => {
                // Any other form of message: parsed alone by the serde_json visitor.
                out.truncate(mark);
                let end = scan::skip_value(b, i, 3)?;
                let mut err = None;
                let sink = Sink { out, err: &mut err };
                sub(b.get(i..end)?, MessageSeed { sink })?;
                end
            }
        };
        i = ws(b, i);
        match b.get(i)? {
            b',' => i = ws(b, i + 1),
            b']' => return Some(i + 1),
            _ => return None,
        }
    }
}

/// A message object at `i` whose content is a string or null and whose role is a string
/// without escapes, with no field the canonical stream takes other than those two (and
/// none repeated), into `out`; `None` for any other message.
fn message(b: &[u8], i: usize, out: &mut Stream) -> Option<usize> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let mut role: Option<&[u8]> = None;
    let mut content = false;
    let mut i = ws(b, i + 1);
    if b.get(i) != Some(&b'}') {
        loop {
            let (name, after) = plain_str(b, i)?;
            i = ws(b, after);
            if b.get(i) != Some(&b':') {
                return None;
            }
            i = ws(b, i + 1);
            i = match name {
                b"content" if !content => {
                    content = true;
                    match b.get(i)? {
                        b'"' => scan::decode(b, i + 1, out)?,
                        _ => scan::literal(b, i, b"null")?,
                    }
                }
                b"role" if role.is_none() => {
                    let (r, end) = plain_str(b, i)?;
                    role = Some(r);
                    end
                }
                b"content" | b"role" | b"name" | b"tool_call_id" | b"tool_calls" => return None,
                _ => scan::skip_value(b, i, 3)?,
            };
            i = ws(b, i);
            match b.get(i)? {
                b',' => i = ws(b, i + 1),
                b'}' => break,
                _ => return None,
            }
        }
    }
    out.push(US);
    out.extend_from_slice(role.unwrap_or_default());
    out.push(RS);
    Some(i + 1)
}
