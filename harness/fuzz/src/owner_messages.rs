//! The `owner_messages` target: the codec of the messages between the Wasm workers and the
//! owner of the picker state (`infergate_filters::picker::remote::{ToOwner, ToWorker}`), on
//! any bytes.
//!
//! Both decoders see every input. Whatever decodes re-encodes to exactly the input (the
//! decoders accept nothing but what the encoders write), and the other way round, messages
//! built from the input's bytes (a decoded pick with other releases, a served-endpoint
//! report, every answer kind with a fallback list) decode to themselves.

use infergate_filters::flow::DropReason;
use infergate_filters::picker::remote::{Released, StateKey, ToOwner, ToWorker};
use infergate_filters::picker::timing::ResponseTiming;
use infergate_filters::picker::Rejection;

use crate::meter::peak_during;
use crate::targets::assert_memory;

/// Any bytes: never panics; each decoder stays within the memory bound and answers only
/// for its encoder's exact output; built messages round-trip.
pub fn owner_messages(data: &[u8]) {
    let (to_owner, peak) = peak_during(|| ToOwner::decode(data));
    assert_memory("owner_messages", data.len(), peak);
    if let Some(message) = &to_owner {
        assert_eq!(
            message.encode().as_deref(),
            Some(data),
            "a decoded {message:?} re-encodes to other bytes"
        );
    }
    let (to_worker, peak) = peak_during(|| ToWorker::decode(data));
    assert_memory("owner_messages", data.len(), peak);
    if let Some(message) = &to_worker {
        assert_eq!(
            message.encode(),
            data,
            "a decoded {message:?} re-encodes to other bytes"
        );
        assert_eq!(data.get(1..9).map(word), Some(message.ticket()));
    }
    for message in owner_messages_from(data, to_owner) {
        let bytes = message.encode();
        assert!(bytes.is_some(), "{message:?} does not encode");
        let back = bytes.as_deref().and_then(ToOwner::decode);
        assert_eq!(back.as_ref(), Some(&message), "does not decode to itself");
    }
    for message in worker_messages_from(data) {
        let back = ToWorker::decode(&message.encode());
        assert_eq!(back.as_ref(), Some(&message), "does not decode to itself");
    }
}

/// Up to 8 little-endian bytes as a `u64` (missing bytes are 0).
fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    for (to, from) in w.iter_mut().zip(bytes) {
        *to = *from;
    }
    u64::from_le_bytes(w)
}

/// The `i`-th word of `data` (0 past its end).
fn word_at(data: &[u8], i: usize) -> u64 {
    data.get(8 * i..).map_or(0, word)
}

/// Leases, services and timings from the input's words.
fn releases(data: &[u8]) -> Vec<Released> {
    data.chunks(32)
        .map(|c| Released {
            lease: word(c),
            service: c.get(8..).map_or(0, word),
            timing: ResponseTiming::decode([
                c.get(16..).map_or(0, word),
                c.get(24..).map_or(0, word),
            ]),
        })
        .collect()
}

/// A worker's messages carrying the input: as a hello's configuration, as leases, and a
/// decoded pick again with the input's leases instead of its own.
fn owner_messages_from(data: &[u8], decoded: Option<ToOwner>) -> Vec<ToOwner> {
    let state = StateKey(word_at(data, 0));
    let mut out = vec![
        ToOwner::Hello {
            state: StateKey::of_config(data),
            config: data.to_vec(),
        },
        ToOwner::Release {
            state,
            reply_queue: word_at(data, 1) as u32,
            leases: releases(data),
            started: data.chunks(8).map(word).collect(),
        },
        ToOwner::Cancel {
            state,
            reply_queue: word_at(data, 1) as u32,
            ticket: word_at(data, 2),
        },
        ToOwner::Served {
            state,
            lease: word_at(data, 1),
            endpoint: text_of(data, 40),
            block_hashes: data.chunks(8).map(word).collect(),
            session: (word_at(data, 3) & 1 == 1).then(|| text_of(data, 64)),
        },
    ];
    if let Some(ToOwner::Pick {
        state,
        reply_queue,
        ticket,
        pool,
        prepared,
        releases: own,
        started,
    }) = decoded
    {
        let mut others = releases(data);
        others.extend(own.iter().rev());
        out.push(ToOwner::Pick {
            state,
            reply_queue: reply_queue.rotate_left(7),
            ticket: !ticket,
            pool,
            prepared,
            releases: others,
            started: started.into_iter().rev().collect(),
        });
    }
    out
}

/// The input as text, cut to at most `max` bytes (on a character boundary).
fn text_of(data: &[u8], max: usize) -> String {
    let mut text = String::from_utf8_lossy(data).into_owned();
    let mut cut = text.len().min(max);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    text
}

/// Every answer kind, with fields from the input (the endpoint: the input as text, cut to
/// what its `u16` length can say; the fallbacks: the input's text cut into pieces).
fn worker_messages_from(data: &[u8]) -> Vec<ToWorker> {
    let ticket = word_at(data, 0);
    let endpoint = text_of(data, usize::from(u16::MAX));
    let fallbacks: Vec<String> = data.chunks(24).take(8).map(|c| text_of(c, 24)).collect();
    let pick = data.first().copied().unwrap_or(0);
    let queued_ms = (pick & 1 == 1).then(|| word_at(data, 1));
    let reason = [
        DropReason::Saturated,
        DropReason::TtlExpired,
        DropReason::ContextCancelled,
        DropReason::Evicted,
    ][usize::from(pick) % 4];
    let rejection = [
        Rejection::NoEndpoints,
        Rejection::StaleMetrics,
        Rejection::Unscraped,
    ][usize::from(pick >> 2) % 3];
    vec![
        ToWorker::Picked {
            ticket,
            lease: word_at(data, 2),
            endpoint,
            fallbacks,
            prefiller: (pick & 4 != 0).then(|| text_of(data, 21)),
            queued_ms,
            release_at_once: pick & 2 != 0,
            evictable: pick & 8 != 0,
            peer: pick & 16 != 0,
        },
        ToWorker::Queued { ticket },
        ToWorker::Evict { lease: ticket },
        ToWorker::Dropped {
            ticket,
            reason,
            queued_ms: word_at(data, 3),
        },
        ToWorker::Rejected { ticket, rejection },
        ToWorker::UnknownState { ticket },
    ]
}
