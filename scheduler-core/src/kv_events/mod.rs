//! Decoding of the KV cache events an inference engine publishes (vLLM's `KVEventBatch`).
//!
//! # What vLLM sends (checked against its `vllm/distributed/kv_events.py`)
//!
//! A ZMQ PUB message of three frames: the topic (`kv@<pod>@<model>` by convention, see
//! [`parse_topic`]), an 8-byte big-endian sequence number, and a MessagePack payload that
//! msgspec encodes from these structs:
//!
//! - the batch: `ts` (float seconds), `events` (a list), `data_parallel_rank` (int, absent
//!   or nil in older releases);
//! - `BlockStored`: `block_hashes` (list), `parent_block_hash` (or nil), `token_ids` (the
//!   tokens of all the stored blocks, in order), `block_size`, `lora_id` (deprecated, or
//!   nil), `medium` (`"GPU"`, a host tier such as `"CPU"`, or nil), `lora_name` (or nil),
//!   then in newer releases `extra_keys`, `group_idx`, `kv_cache_spec_kind`, ...;
//! - `BlockRemoved`: `block_hashes`, `medium`, then in newer releases `group_idx`;
//! - `AllBlocksCleared`: no fields.
//!
//! The encoding changed over releases, so every shape below is accepted:
//!
//! - Older releases declare the structs `array_like`: the batch is `[ts, events, dp_rank]`
//!   and each event a tagged array `["BlockStored", hashes, parent, tokens, size, ...]`,
//!   fields by position. Releases differ in how many trailing fields they send (the first
//!   had five after the tag, then `medium`, then `lora_name`, ...): missing trailing fields
//!   read as nil, extra ones are skipped.
//! - Newer releases dropped `array_like`: each event is a map with the tag under `"type"`
//!   and fields by name (any order; unknown names skipped), and the batch itself may be a
//!   map (`ts`, `events`, `data_parallel_rank`) too.
//! - A block hash is an integer (older releases: a signed or unsigned 64-bit value) or a
//!   byte string (newer releases: a digest). An integer is kept as its 64 bits; bytes are
//!   reduced with XXH3-64 ([`EngineBlockHash`]). Only equality of engine hashes is used.
//!
//! # What the decoder keeps
//!
//! [`KvEvent`] keeps what the precise prefix index needs. Events are dropped (not errors)
//! when the index must not apply them: a `medium` other than `"GPU"` (a lower tier: the
//! blocks are not in the engine's GPU cache), a `group_idx` other than 0 (the other KV cache
//! groups of a hybrid model, whose removals say nothing about the full-attention prefix),
//! and an unknown event tag (a newer release's event kind). `lora_id` and `extra_keys` are
//! read and ignored.
//!
//! # Bounds
//!
//! [`decode_batch`] never panics and answers [`KvDecodeError`] for anything it cannot read.
//! Counts are checked against the bytes left before anything is allocated; a batch holds at
//! most [`MAX_EVENTS`] events, an event at most [`MAX_HASHES`] hashes and [`MAX_TOKENS`]
//! tokens, a string or hash at most [`MAX_STRING`] bytes; unknown values are skipped to a
//! bounded depth. Output memory is linear in the payload (at most about 8 bytes per input
//! byte for hashes and tokens, plus one event struct per at least 14 input bytes).

mod msgpack;
#[cfg(test)]
mod tests;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use msgpack::{Head, Reader};
use xxhash_rust::xxh3::xxh3_64;

/// Most events in one batch.
pub const MAX_EVENTS: usize = 1 << 16;
/// Most block hashes in one event.
pub const MAX_HASHES: usize = 1 << 16;
/// Most token ids in one event.
pub const MAX_TOKENS: usize = 1 << 22;
/// Longest string (tag, medium, LoRA name, field name) or byte-string hash.
pub const MAX_STRING: usize = 1024;

/// An engine's identifier of one KV block, reduced to 64 bits: an integer hash as its 64
/// bits (a negative one as two's complement), a byte-string hash as XXH3-64 of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EngineBlockHash(pub u64);

/// One KV cache event, as far as the precise prefix index needs it.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// Blocks newly cached on the engine's GPU, in prefix order.
    BlockStored {
        /// The engine's hash of each stored block.
        block_hashes: Vec<EngineBlockHash>,
        /// The block before the first one (none: the first block of a prompt).
        parent: Option<EngineBlockHash>,
        /// The tokens of all the stored blocks, `block_size` per block.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// The LoRA adapter the blocks were computed with (none: the base model).
        lora_name: Option<String>,
    },
    /// Blocks evicted from the engine's GPU cache.
    BlockRemoved {
        /// The engine's hash of each removed block.
        block_hashes: Vec<EngineBlockHash>,
    },
    /// The engine dropped its whole cache (a reset or a restart).
    AllBlocksCleared,
}

/// One decoded payload.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventBatch {
    /// The publisher's timestamp, seconds (0 when absent).
    pub ts: f64,
    /// The events to apply, in order (dropped events left out: module doc).
    pub events: Vec<KvEvent>,
    /// The engine's data-parallel rank, when sent.
    pub dp_rank: Option<u32>,
}

/// Why a payload could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDecodeError {
    /// The payload ends inside a value.
    Truncated,
    /// Bytes that are not MessagePack (the reserved marker 0xc1).
    Malformed,
    /// Bytes left over after the batch.
    TrailingBytes,
    /// A value of the wrong kind where a field was expected.
    WrongType(&'static str),
    /// A required field is missing.
    MissingField(&'static str),
    /// A count or size over its bound (module doc).
    TooLarge,
    /// Unknown values nested deeper than the reader's bound.
    TooDeep,
}

impl fmt::Display for KvDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvDecodeError::Truncated => f.write_str("KV event payload is truncated"),
            KvDecodeError::Malformed => f.write_str("KV event payload is not MessagePack"),
            KvDecodeError::TrailingBytes => f.write_str("bytes after the KV event batch"),
            KvDecodeError::WrongType(field) => {
                write!(f, "KV event field {field} has the wrong type")
            }
            KvDecodeError::MissingField(field) => write!(f, "KV event field {field} is missing"),
            KvDecodeError::TooLarge => f.write_str("KV event payload exceeds a size bound"),
            KvDecodeError::TooDeep => f.write_str("KV event payload nests too deep"),
        }
    }
}

/// The parts of a `kv@<pod>@<model>` topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topic<'a> {
    /// The publishing pod (or engine) name.
    pub pod: &'a str,
    /// The served model name.
    pub model: &'a str,
}

/// Splits a topic frame `kv@<pod>@<model>` (UTF-8; pod and model non-empty; the model is
/// everything after the second `@`, so it may hold `@` itself). `None` for anything else.
pub fn parse_topic(frame: &[u8]) -> Option<Topic<'_>> {
    let s = core::str::from_utf8(frame).ok()?;
    let rest = s.strip_prefix("kv@")?;
    let (pod, model) = rest.split_once('@')?;
    (!pod.is_empty() && !model.is_empty()).then_some(Topic { pod, model })
}

/// Decodes one payload frame (module doc for the accepted shapes and bounds).
pub fn decode_batch(payload: &[u8]) -> Result<KvEventBatch, KvDecodeError> {
    let mut r = Reader::new(payload);
    let mut batch = KvEventBatch {
        ts: 0.0,
        events: Vec::new(),
        dp_rank: None,
    };
    match r.head()? {
        Head::Array(n) => {
            if n < 2 {
                return Err(KvDecodeError::MissingField("events"));
            }
            batch.ts = read_ts(&mut r)?;
            read_events(&mut r, &mut batch.events)?;
            if n >= 3 {
                batch.dp_rank = read_dp_rank(&mut r)?;
            }
            for _ in 3..n {
                r.skip(1)?;
            }
        }
        Head::Map(n) => {
            let mut seen_events = false;
            for _ in 0..n {
                match read_key(&mut r)? {
                    b"ts" => batch.ts = read_ts(&mut r)?,
                    b"events" => {
                        batch.events.clear();
                        read_events(&mut r, &mut batch.events)?;
                        seen_events = true;
                    }
                    b"data_parallel_rank" => batch.dp_rank = read_dp_rank(&mut r)?,
                    _ => r.skip(1)?,
                }
            }
            if !seen_events {
                return Err(KvDecodeError::MissingField("events"));
            }
        }
        _ => return Err(KvDecodeError::WrongType("batch")),
    }
    if r.remaining() != 0 {
        return Err(KvDecodeError::TrailingBytes);
    }
    Ok(batch)
}

fn read_ts(r: &mut Reader<'_>) -> Result<f64, KvDecodeError> {
    match r.head()? {
        Head::Float(x) => Ok(x),
        Head::Uint(u) => Ok(u as f64),
        Head::Int(i) => Ok(i as f64),
        Head::Nil => Ok(0.0),
        _ => Err(KvDecodeError::WrongType("ts")),
    }
}

fn read_dp_rank(r: &mut Reader<'_>) -> Result<Option<u32>, KvDecodeError> {
    match r.head()? {
        Head::Nil => Ok(None),
        Head::Uint(u) => u32::try_from(u)
            .map(Some)
            .map_err(|_| KvDecodeError::WrongType("data_parallel_rank")),
        _ => Err(KvDecodeError::WrongType("data_parallel_rank")),
    }
}

/// A string of at most [`MAX_STRING`] bytes (map keys, tags, names), as bytes.
fn read_str<'a>(r: &mut Reader<'a>, field: &'static str) -> Result<&'a [u8], KvDecodeError> {
    match r.head()? {
        Head::Str(n) if n <= MAX_STRING => r.bytes(n),
        Head::Str(_) => Err(KvDecodeError::TooLarge),
        _ => Err(KvDecodeError::WrongType(field)),
    }
}

fn read_key<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], KvDecodeError> {
    read_str(r, "map key")
}

fn read_opt_str<'a>(
    r: &mut Reader<'a>,
    field: &'static str,
) -> Result<Option<&'a [u8]>, KvDecodeError> {
    match r.head()? {
        Head::Nil => Ok(None),
        Head::Str(n) if n <= MAX_STRING => r.bytes(n).map(Some),
        Head::Str(_) => Err(KvDecodeError::TooLarge),
        _ => Err(KvDecodeError::WrongType(field)),
    }
}

fn read_events(r: &mut Reader<'_>, out: &mut Vec<KvEvent>) -> Result<(), KvDecodeError> {
    let n = match r.head()? {
        Head::Array(n) if n <= MAX_EVENTS => n,
        Head::Array(_) => return Err(KvDecodeError::TooLarge),
        _ => return Err(KvDecodeError::WrongType("events")),
    };
    // The smallest event (`{"type":"BlockRemoved"...}` or a tagged array) takes 14 bytes.
    out.reserve(n.min(r.remaining() / 14));
    for _ in 0..n {
        if let Some(ev) = read_event(r)? {
            out.push(ev);
        }
    }
    Ok(())
}

/// Which event a tag names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Stored,
    Removed,
    Cleared,
    Unknown,
}

fn kind_of(tag: &[u8]) -> Kind {
    match tag {
        b"BlockStored" => Kind::Stored,
        b"BlockRemoved" => Kind::Removed,
        b"AllBlocksCleared" => Kind::Cleared,
        _ => Kind::Unknown,
    }
}

/// Field names by position in the array encoding, after the tag.
const STORED_FIELDS: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
];
const REMOVED_FIELDS: &[&str] = &["block_hashes", "medium", "group_idx"];

/// The fields of one event, as read so far.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<EngineBlockHash>>,
    parent: Option<EngineBlockHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_name: Option<String>,
    /// A tier other than the GPU (the event is dropped).
    other_medium: bool,
    /// A KV cache group other than 0 (the event is dropped).
    other_group: bool,
}

fn read_event(r: &mut Reader<'_>) -> Result<Option<KvEvent>, KvDecodeError> {
    let mut f = Fields::default();
    let kind = match r.head()? {
        Head::Array(n) => {
            if n == 0 {
                return Err(KvDecodeError::MissingField("type"));
            }
            let kind = kind_of(read_str(r, "type")?);
            let names = match kind {
                Kind::Stored => STORED_FIELDS,
                Kind::Removed => REMOVED_FIELDS,
                _ => &[],
            };
            for i in 1..n {
                match names.get(i - 1) {
                    Some(name) => read_field(r, name, &mut f)?,
                    None => r.skip(1)?,
                }
            }
            kind
        }
        Head::Map(n) => {
            let mut kind = None;
            for _ in 0..n {
                let key = read_key(r)?;
                if key == b"type" {
                    kind = Some(kind_of(read_str(r, "type")?));
                } else {
                    // Field names are plain ASCII; anything else is an unknown field.
                    match core::str::from_utf8(key) {
                        Ok(name) => read_field(r, name, &mut f)?,
                        Err(_) => r.skip(1)?,
                    }
                }
            }
            kind.ok_or(KvDecodeError::MissingField("type"))?
        }
        _ => return Err(KvDecodeError::WrongType("event")),
    };
    if f.other_medium || f.other_group {
        return Ok(None);
    }
    Ok(match kind {
        Kind::Stored => Some(KvEvent::BlockStored {
            block_hashes: f
                .block_hashes
                .ok_or(KvDecodeError::MissingField("block_hashes"))?,
            parent: f.parent,
            token_ids: f
                .token_ids
                .ok_or(KvDecodeError::MissingField("token_ids"))?,
            block_size: f
                .block_size
                .ok_or(KvDecodeError::MissingField("block_size"))?,
            lora_name: f.lora_name,
        }),
        Kind::Removed => Some(KvEvent::BlockRemoved {
            block_hashes: f
                .block_hashes
                .ok_or(KvDecodeError::MissingField("block_hashes"))?,
        }),
        Kind::Cleared => Some(KvEvent::AllBlocksCleared),
        Kind::Unknown => None,
    })
}

/// Reads the value of field `name` into `f` (unknown names: skipped).
fn read_field(r: &mut Reader<'_>, name: &str, f: &mut Fields) -> Result<(), KvDecodeError> {
    match name {
        "block_hashes" => f.block_hashes = Some(read_hashes(r)?),
        "parent_block_hash" => f.parent = read_hash(r, true)?,
        "token_ids" => f.token_ids = Some(read_tokens(r)?),
        "block_size" => match r.head()? {
            Head::Uint(u) => {
                f.block_size =
                    Some(u32::try_from(u).map_err(|_| KvDecodeError::WrongType("block_size"))?)
            }
            _ => return Err(KvDecodeError::WrongType("block_size")),
        },
        "medium" => {
            if let Some(m) = read_opt_str(r, "medium")? {
                f.other_medium = !m.eq_ignore_ascii_case(b"gpu");
            }
        }
        "lora_name" => {
            f.lora_name = match read_opt_str(r, "lora_name")? {
                None => None,
                Some(b) => Some(
                    core::str::from_utf8(b)
                        .map_err(|_| KvDecodeError::WrongType("lora_name"))?
                        .into(),
                ),
            }
        }
        "group_idx" => match r.head()? {
            Head::Nil => {}
            Head::Uint(g) => f.other_group = g != 0,
            _ => return Err(KvDecodeError::WrongType("group_idx")),
        },
        _ => r.skip(1)?,
    }
    Ok(())
}

/// One hash: an integer or a byte string; nil only where `nullable`.
fn read_hash(r: &mut Reader<'_>, nullable: bool) -> Result<Option<EngineBlockHash>, KvDecodeError> {
    match r.head()? {
        Head::Uint(u) => Ok(Some(EngineBlockHash(u))),
        Head::Int(i) => Ok(Some(EngineBlockHash(i as u64))),
        Head::Bin(n) | Head::Str(n) if n <= MAX_STRING => {
            Ok(Some(EngineBlockHash(xxh3_64(r.bytes(n)?))))
        }
        Head::Bin(_) | Head::Str(_) => Err(KvDecodeError::TooLarge),
        Head::Nil if nullable => Ok(None),
        _ => Err(KvDecodeError::WrongType("block hash")),
    }
}

fn read_hashes(r: &mut Reader<'_>) -> Result<Vec<EngineBlockHash>, KvDecodeError> {
    let n = match r.head()? {
        Head::Array(n) if n <= MAX_HASHES => n,
        Head::Array(_) => return Err(KvDecodeError::TooLarge),
        _ => return Err(KvDecodeError::WrongType("block_hashes")),
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if let Some(h) = read_hash(r, false)? {
            out.push(h);
        }
    }
    Ok(out)
}

fn read_tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, KvDecodeError> {
    let n = match r.head()? {
        Head::Array(n) if n <= MAX_TOKENS => n,
        Head::Array(_) => return Err(KvDecodeError::TooLarge),
        _ => return Err(KvDecodeError::WrongType("token_ids")),
    };
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        match r.u32_value()? {
            Some(t) => out.push(t),
            None => return Err(KvDecodeError::WrongType("token_ids")),
        }
    }
    Ok(out)
}
