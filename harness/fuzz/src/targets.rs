//! The five target bodies and the bounds they assert.
//!
//! Every target takes any bytes. A panic (from the code under test, or from an assertion
//! here) is the finding.

use infergate_filters::handoff::Handoff;
use scheduler_core::metrics::{exposition, extract, MetricNames, MAX_ADAPTERS};
use scheduler_core::request::{self, Api, ParsedRequest, DEFAULT_MAX_PROMPT_BYTES};
use scheduler_core::snapshot::aggregate::parse_members;
use scheduler_core::snapshot::{self, Snapshot, HEADER_LEN};

use crate::meter::peak_during;

/// The most bytes the whole canonical prompt may take per body byte (the request module's
/// bound: the worst case is an integral float such as `1e15,`, 5 bytes written as 17).
pub const EXPANSION: usize = 4;

const APIS: [Api; 3] = [
    Api::ChatCompletions,
    Api::Completions,
    Api::AnthropicMessages,
];

/// The most memory any target may hold at once for an input of `len` bytes: a fixed
/// factor of the input plus a constant for fixed-size buffers. A structure that costs tens
/// of bytes per input byte (a `serde_json::Value` of `[0,0,…]`, a `String` per adapter of
/// `a,a,…`) exceeds it on inputs of a few kilobytes.
pub fn memory_bound(len: usize) -> usize {
    12 * len + 16 * 1024
}

pub(crate) fn assert_memory(target: &str, len: usize, peak: usize) {
    assert!(
        peak <= memory_bound(len),
        "{target}: {peak} bytes allocated at once for {len} input bytes (bound {})",
        memory_bound(len)
    );
}

/// The invariants of a successful parse that stored at most `limit` prompt bytes.
fn check_parsed(p: &ParsedRequest, body_len: usize, limit: usize) {
    assert!(!p.model.is_empty(), "accepted an empty model");
    assert_eq!(
        p.prompt.len(),
        p.prompt_len.min(limit),
        "stored prompt is not min(whole, limit)"
    );
    assert!(
        p.prompt_len <= EXPANSION * body_len,
        "canonical prompt of {} bytes from a body of {body_len}",
        p.prompt_len
    );
    assert_eq!(p.prompt_tokens, request::estimate_tokens(p.prompt_len));
    assert!(p.prompts >= 1, "no prompt counted");
    assert!(
        p.prompts <= body_len.max(1) as u64,
        "{} prompts in a body of {body_len} bytes",
        p.prompts
    );
    assert_eq!(
        p.output_sequences,
        request::output_sequences(p.n, p.best_of, p.prompts),
        "output sequences are not max(n, best_of, 1) × prompts"
    );
    assert!(p.output_sequences >= 1);
}

/// The parser's answer (its fast path first) is the `serde_json` path's, to the byte and to
/// the error.
fn check_against_reference(
    api: Api,
    body: &[u8],
    limit: usize,
    parsed: &Result<ParsedRequest, request::RequestError>,
) {
    let reference = request::parse_reference(api, body, limit);
    assert_eq!(
        parsed, &reference,
        "the fast path and the serde_json path disagree ({api:?}, limit {limit})"
    );
}

/// The request parser on the raw bytes, as each API: never panics, answers what the
/// `serde_json` path answers, stores at most the default limit, counts a whole prompt
/// within [`EXPANSION`] × the body, counts at least one prompt and output sequence (the
/// sequences max(n, best_of, 1) × prompts, saturated), and stays within [`memory_bound`].
pub fn request_parser(data: &[u8]) {
    for api in APIS {
        let (parsed, peak) = peak_during(|| request::parse(api, data));
        if let Ok(p) = &parsed {
            check_parsed(p, data.len(), DEFAULT_MAX_PROMPT_BYTES);
        }
        assert_memory("request_parser", data.len(), peak);
        check_against_reference(api, data, DEFAULT_MAX_PROMPT_BYTES, &parsed);
    }
}

/// Where [`canonical_prompt`] puts the fuzzer's bytes: the whole body, or inside a body at
/// a place written as canonical JSON, so the fuzzer spends its time there.
fn embed(mode: u8, rest: &[u8]) -> Vec<u8> {
    let (head, tail): (&[u8], &[u8]) = match mode % 4 {
        0 => (b"", b""),
        1 => (br#"{"model":"m","tools":["#, b"]}"),
        2 => (
            br#"{"model":"m","messages":[{"role":"user","content":["#,
            b"]}]}",
        ),
        _ => (
            br#"{"model":"m","messages":[{"role":"assistant","tool_calls":"#,
            b"}]}",
        ),
    };
    [head, rest, tail].concat()
}

/// The canonical prompt cut at an arbitrary limit: the first byte picks where the rest goes
/// ([`embed`]) and the API, the next two the limit. Asserts that the cut prompt is exactly
/// the leading bytes of the whole one (so every block hash it covers is unchanged), that
/// both count the same length and agree on errors, that the cut one is the `serde_json`
/// path's, and the bounds of [`request_parser`].
pub fn canonical_prompt(data: &[u8]) {
    let [mode, lo, hi, rest @ ..] = data else {
        return;
    };
    let limit = usize::from(u16::from_le_bytes([*lo, *hi]));
    let body = embed(*mode, rest);
    let api = match (mode >> 2) % 3 {
        0 => Api::ChatCompletions,
        1 => Api::AnthropicMessages,
        _ => Api::Completions,
    };
    let whole = request::parse_with_limit(api, &body, usize::MAX);
    let (cut, peak) = peak_during(|| request::parse_with_limit(api, &body, limit));
    assert_eq!(
        whole.is_ok(),
        cut.is_ok(),
        "limits disagree on acceptance: whole {whole:?}, cut {cut:?}"
    );
    match (&whole, &cut) {
        (Ok(w), Ok(c)) => {
            check_parsed(w, body.len(), usize::MAX);
            check_parsed(c, body.len(), limit);
            assert_eq!(c.prompt_len, w.prompt_len);
            assert_eq!(
                c.prompt.as_slice(),
                w.prompt.get(..c.prompt.len()).unwrap_or_default(),
                "the cut prompt is not a prefix of the whole one"
            );
            assert_eq!(
                (&c.model, c.max_output_tokens, c.stream, &c.cache_salt),
                (&w.model, w.max_output_tokens, w.stream, &w.cache_salt)
            );
            assert_eq!(
                (c.n, c.best_of, c.prompts, c.output_sequences),
                (w.n, w.best_of, w.prompts, w.output_sequences),
                "the limit changed the output multiplicity"
            );
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        _ => {}
    }
    assert_memory("canonical_prompt", body.len(), peak);
    check_against_reference(api, &body, limit, &cut);
}

/// The Prometheus text parser and extractor with the default names: never panics, every
/// field within its range, adapter lists cut at [`MAX_ADAPTERS`], CRLF line ends read as
/// LF, and [`memory_bound`]. The export page's member listing reader on the same bytes:
/// only `ip:port`s, each once, within its bound.
pub fn prometheus_parser(data: &[u8]) {
    let names = MetricNames::default();
    let (m, peak) = peak_during(|| extract(data, &names));
    assert_memory("prometheus_parser", data.len(), peak);
    if let Some(kv) = m.kv_cache_usage {
        assert!((0.0..=1.0).contains(&kv), "kv usage {kv}");
    }
    if let Some(c) = m.cache {
        assert!(c.block_size > 0 && c.num_blocks > 0, "{c:?}");
    }
    if let Some(l) = &m.lora {
        assert!(l.running.len() <= MAX_ADAPTERS && l.waiting.len() <= MAX_ADAPTERS);
        assert!(l.running.iter().chain(&l.waiting).all(|a| !a.is_empty()));
    }
    // Every line through the generic line parser too (the extractor skips most of them).
    let _ = exposition::lines(data).count();
    // The member listing of an export page: `ip:port`s, each once, within the bound.
    let (members, peak) = peak_during(|| parse_members(data, 64));
    assert_memory("prometheus_parser (members)", data.len(), peak);
    if let Ok(members) = members {
        assert!(members.len() <= 64);
        let mut seen = std::collections::HashSet::new();
        for m in &members {
            assert!(m.parse::<std::net::SocketAddr>().is_ok(), "member `{m}`");
            assert!(seen.insert(m), "member `{m}` listed twice");
        }
    }
    if !data.contains(&b'\r') {
        let mut crlf = Vec::with_capacity(2 * data.len());
        for &b in data {
            if b == b'\n' {
                crlf.push(b'\r');
            }
            crlf.push(b);
        }
        assert_eq!(extract(&crlf, &names), m, "CRLF page reads differently");
    }
}

/// The snapshot decoder on the raw bytes, and again with the header's hash made to match
/// so the structural checks are reached: never panics, decodes within [`memory_bound`],
/// and whatever decodes re-encodes to the same body bytes.
pub fn snapshot_codec(data: &[u8]) {
    let _ = snapshot::decode(data);
    let mut sealed = data.to_vec();
    snapshot::reseal(&mut sealed);
    let (decoded, peak) = peak_during(|| snapshot::decode(&sealed));
    assert_memory("snapshot_codec", data.len(), peak);
    let Ok(s) = decoded else {
        return;
    };
    let again = snapshot::encode(&s);
    assert_eq!(
        again.get(HEADER_LEN..),
        sealed.get(HEADER_LEN..),
        "a decoded snapshot re-encodes to other bytes"
    );
    // Decoding into a spare that held something else gives the same result.
    let mut spare = Snapshot::default();
    let _ = snapshot::decode_into(&again, &mut spare);
    let mut other = s.clone();
    other.endpoints.reverse();
    let mut reused = other;
    assert!(snapshot::decode_into(&sealed, &mut reused).is_ok());
    assert_eq!(snapshot::encode(&reused), again);
}

/// The router → picker handoff decoder on the raw bytes: never panics, holds no more hashes
/// than the bytes can carry, and whatever decodes encodes and decodes to itself. The bytes
/// are also parsed as a chat body, and its handoff must round-trip.
pub fn handoff_codec(data: &[u8]) {
    let (decoded, peak) = peak_during(|| Handoff::decode(data));
    assert_memory("handoff_codec", data.len(), peak);
    if let Some(h) = decoded {
        assert!(h.block_hashes.len() * 8 <= data.len());
        let bytes = h.encode();
        assert!(bytes.is_some(), "a decoded handoff does not encode");
        let back = bytes.as_deref().and_then(Handoff::decode);
        assert_eq!(back.as_ref(), Some(&h));
    }
    if let Ok(p) = request::parse(Api::ChatCompletions, data) {
        let h = Handoff::from_parsed(&p, "base", 16);
        if let Some(bytes) = h.encode() {
            assert_eq!(Handoff::decode(&bytes), Some(h));
        }
    }
}
