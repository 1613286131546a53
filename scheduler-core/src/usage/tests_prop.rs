//! Property tests of usage tracking: chunk boundaries never matter, and a rewritten stream
//! is exactly the stream the engine would have sent without the forced usage.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use super::tests::run;
use super::*;
use alloc::string::{String, ToString};
use alloc::vec;
use proptest::prelude::*;
use std::format;

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

const WANTS: [ClientWants; 4] = [
    ClientWants {
        include_usage: false,
        continuous_usage: false,
        null_when_absent: false,
    },
    ClientWants {
        include_usage: true,
        continuous_usage: false,
        null_when_absent: false,
    },
    ClientWants {
        include_usage: false,
        continuous_usage: true,
        null_when_absent: false,
    },
    ClientWants {
        include_usage: true,
        continuous_usage: true,
        null_when_absent: false,
    },
];

/// [`WANTS`] for an engine that leaves the member out and for one that writes
/// `"usage":null` (the flag, as [`ClientWants::null_when_absent`] says).
fn all_wants() -> impl Iterator<Item = (ClientWants, bool)> {
    [false, true].into_iter().flat_map(|nulls| {
        WANTS.into_iter().map(move |w| {
            (
                ClientWants {
                    null_when_absent: nulls,
                    ..w
                },
                nulls,
            )
        })
    })
}

/// One usage object's values.
#[derive(Clone, Debug)]
struct Counters {
    prompt: u64,
    completion: u64,
    /// `None`: no details; `Some(None)`: `"prompt_tokens_details":null`.
    cached: Option<Option<u64>>,
}

impl Counters {
    fn json(&self) -> String {
        let details = match self.cached {
            None => String::new(),
            Some(None) => r#","prompt_tokens_details":null"#.into(),
            Some(Some(c)) => format!(r#","prompt_tokens_details":{{"cached_tokens":{c}}}"#),
        };
        format!(
            r#"{{"prompt_tokens":{},"total_tokens":{},"completion_tokens":{}{details}}}"#,
            self.prompt,
            self.prompt.saturating_add(self.completion),
            self.completion
        )
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt,
            completion_tokens: self.completion,
            cached_tokens: self.cached.flatten().unwrap_or(0),
        }
    }
}

/// Where a content chunk's usage member goes among its members.
#[derive(Clone, Copy, Debug)]
enum Place {
    First,
    AfterModel,
    Last,
}

/// One SSE event of a generated stream.
#[derive(Clone, Debug)]
enum Ev {
    /// A content chunk; `usage`: the forced per-chunk usage (`None`: `"usage":null`).
    Content {
        text: String,
        usage: Option<Counters>,
        place: Place,
    },
    /// The usage-only chunk.
    Final(Counters),
    /// A comment line on its own (`: ...`).
    Comment(String),
    Done,
}

/// How the engine writes its lines.
#[derive(Clone, Copy, Debug)]
struct Style {
    crlf: bool,
    space_after_data: bool,
}

impl Style {
    fn line(&self, text: &str) -> String {
        let end = if self.crlf { "\r\n" } else { "\n" };
        format!("{text}{end}")
    }

    fn data(&self, json: &str) -> String {
        let sp = if self.space_after_data { " " } else { "" };
        self.line(&format!("data:{sp}{json}")) + &self.line("")
    }
}

/// The event as the engine writes it; `with_usage`: the gateway's forcing was on for the
/// per-chunk usage, `with_final`: for the usage-only chunk; `nulls`: the engine writes
/// `"usage":null` on a content chunk without usage (else it leaves the member out).
fn render(ev: &Ev, style: Style, with_usage: bool, with_final: bool, nulls: bool) -> String {
    let head = [
        r#""id":"chatcmpl-5d2f""#.to_string(),
        r#""object":"chat.completion.chunk""#.into(),
        r#""created":1764590000"#.into(),
        r#""model":"m""#.into(),
    ];
    match ev {
        Ev::Content { text, usage, place } => {
            let content = serde_json::to_string(text).unwrap();
            let choices = format!(
                r#""choices":[{{"index":0,"delta":{{"content":{content}}},"logprobs":null,"finish_reason":null}}]"#
            );
            let mut members: Vec<String> = head.to_vec();
            members.push(choices);
            if with_usage || nulls {
                let u = match usage {
                    Some(c) if with_usage => format!(r#""usage":{}"#, c.json()),
                    _ => r#""usage":null"#.into(),
                };
                let at = match place {
                    Place::First => 0,
                    Place::AfterModel => 4,
                    Place::Last => members.len(),
                };
                members.insert(at, u);
            }
            style.data(&format!("{{{}}}", members.join(",")))
        }
        Ev::Final(c) if with_final => style.data(&format!(
            r#"{{{},"choices":[],"usage":{}}}"#,
            head.join(","),
            c.json()
        )),
        Ev::Final(_) => String::new(),
        Ev::Comment(t) => style.line(&format!(":{t}")) + &style.line(""),
        Ev::Done => style.data("[DONE]"),
    }
}

/// The report the tracker should give for these events.
fn expected_report(events: &[Ev]) -> UsageReport {
    let mut final_usage = None;
    let mut chunk_usage = None;
    let mut content = 0;
    let mut done = false;
    for ev in events {
        match ev {
            Ev::Content { usage, .. } => {
                content += 1;
                if let Some(c) = usage {
                    chunk_usage = Some(c.usage());
                }
            }
            Ev::Final(c) => final_usage = Some(c.usage()),
            Ev::Comment(_) => {}
            Ev::Done => done = true,
        }
    }
    let (usage, source) = match (final_usage, chunk_usage) {
        (Some(u), _) => (u, UsageSource::Usage),
        (None, Some(u)) => (u, UsageSource::ContinuousUsage),
        (None, None) if content > 0 => (
            Usage {
                prompt_tokens: 0,
                completion_tokens: content,
                cached_tokens: 0,
            },
            UsageSource::ChunkCount,
        ),
        (None, None) => (Usage::default(), UsageSource::None),
    };
    UsageReport {
        usage,
        source,
        content_chunks: content,
        done,
    }
}

fn counters() -> impl Strategy<Value = Counters> {
    (
        0..=MAX_COUNT,
        0u64..100_000,
        prop_oneof![
            Just(None),
            Just(Some(None)),
            (0u64..5000).prop_map(|c| Some(Some(c)))
        ],
    )
        .prop_map(|(prompt, completion, cached)| Counters {
            prompt,
            completion,
            cached,
        })
}

/// Generated text, with what is hard for a scanner: quotes, backslashes, braces, look-alike
/// usage members, multi-byte characters, control characters (escaped by the JSON writer).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[a-z \"\\\\{}\\[\\]:,é—データ😀\n\t]{0,24}",
        Just(r#""usage":{"prompt_tokens":5,"completion_tokens":9}"#.to_string()),
        Just(r#"\"usage\":{}}"#.to_string()),
        Just("data: [DONE]\n\n".to_string()),
    ]
}

fn event() -> impl Strategy<Value = Ev> {
    prop_oneof![
        6 => (
            text(),
            prop::option::weighted(0.8, counters()),
            prop_oneof![Just(Place::First), Just(Place::AfterModel), Just(Place::Last)]
        )
            .prop_map(|(text, usage, place)| Ev::Content { text, usage, place }),
        1 => counters().prop_map(Ev::Final),
        1 => "[ -~]{0,12}".prop_map(Ev::Comment),
        1 => Just(Ev::Done),
    ]
}

fn style() -> impl Strategy<Value = Style> {
    (any::<bool>(), any::<bool>()).prop_map(|(crlf, space_after_data)| Style {
        crlf,
        space_after_data,
    })
}

/// Cuts `bytes` at `cuts` (indices into it, any order, repeats allowed: empty chunks).
fn chunked(bytes: &[u8], cuts: &[prop::sample::Index]) -> Vec<Vec<u8>> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in at {
        out.push(bytes[prev..c].to_vec());
        prev = c;
    }
    out.push(bytes[prev..].to_vec());
    out
}

fn run_chunks(kind: BodyKind, wants: ClientWants, chunks: &[Vec<u8>]) -> (Vec<u8>, UsageReport) {
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    run(kind, wants, &refs)
}

/// SSE-ish garbage: the tokens a scanner keys on, in any order, with stray bytes.
fn garbage() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b"[".to_vec()),
        Just(b"]".to_vec()),
        Just(b"\"usage\"".to_vec()),
        Just(b"\"choices\"".to_vec()),
        Just(b"\"prompt_tokens\"".to_vec()),
        Just(b"\"completion_tokens\"".to_vec()),
        Just(b":".to_vec()),
        Just(b",".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"\\".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"[DONE]".to_vec()),
        Just(b"12".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"null".to_vec()),
        Just(" é😀".as_bytes().to_vec()),
        any::<u8>().prop_map(|b| vec![b]),
    ];
    prop::collection::vec(token, 0..80).prop_map(|t| t.concat())
}

/// Feeds `chunks` to a tracker that rewrites with no edits enabled.
fn run_no_edits(chunks: &[Vec<u8>]) -> Vec<u8> {
    let mut t = UsageTracker::with_edits(false, false);
    let mut sent = Vec::new();
    let mut out = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        match t.feed(c, i + 1 == chunks.len(), &mut out) {
            Forward::Unchanged => sent.extend_from_slice(c),
            Forward::Replaced => sent.extend_from_slice(&out),
        }
    }
    sent
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The rewriting machinery itself (lines held back across chunks, output rebuilt)
    /// changes nothing: with no edit enabled, what the client receives is the engine's
    /// stream byte for byte, however it is chunked, real stream or garbage.
    #[test]
    fn rewriting_with_nothing_to_remove_is_the_identity(
        events in prop::collection::vec(event(), 0..10),
        style in style(),
        junk in garbage(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let forced: String = events.iter().map(|e| render(e, style, true, true, false)).collect();
        for bytes in [forced.as_bytes(), &junk] {
            let chunks = chunked(bytes, &cuts);
            prop_assert_eq!(run_no_edits(&chunks), bytes);
        }
    }

    /// The forced stream, rewritten for each client, is the stream the engine would have
    /// sent that client; the report is the same whatever the client asked.
    #[test]
    fn rewritten_stream_is_the_unforced_stream(
        events in prop::collection::vec(event(), 0..12),
        style in style(),
    ) {
        let forced: String = events.iter().map(|e| render(e, style, true, true, false)).collect();
        let want_report = expected_report(&events);
        // The forced stream is the same whichever way the engine writes a chunk without
        // usage: forcing gives every content chunk a usage member.
        for (wants, nulls) in all_wants() {
            let continuous = wants.include_usage && wants.continuous_usage;
            let client: String = events
                .iter()
                .map(|e| render(e, style, continuous, wants.include_usage, nulls))
                .collect();
            let (out, report) = run(BodyKind::EventStream, wants, &[forced.as_bytes()]);
            prop_assert_eq!(String::from_utf8(out).unwrap(), client, "{:?}", wants);
            prop_assert_eq!(report, want_report, "{:?}", wants);
        }
    }

    /// Chunk boundaries anywhere (inside lines, UTF-8 sequences, numbers; empty chunks) give
    /// the same bytes and the same report as the whole stream at once.
    #[test]
    fn chunking_never_matters_for_streams(
        events in prop::collection::vec(event(), 0..10),
        style in style(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let forced: String = events.iter().map(|e| render(e, style, true, true, false)).collect();
        let chunks = chunked(forced.as_bytes(), &cuts);
        for (wants, _) in all_wants() {
            let whole = run(BodyKind::EventStream, wants, &[forced.as_bytes()]);
            prop_assert_eq!(run_chunks(BodyKind::EventStream, wants, &chunks), whole);
        }
    }

    /// The same for garbage: never a panic, and chunking changes nothing; observe-only
    /// forwards every chunk as it came.
    #[test]
    fn chunking_never_matters_for_garbage(
        bytes in garbage(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..16),
    ) {
        let chunks = chunked(&bytes, &cuts);
        for (wants, _) in all_wants() {
            let whole = run(BodyKind::EventStream, wants, &[&bytes]);
            prop_assert_eq!(&run_chunks(BodyKind::EventStream, wants, &chunks), &whole);
            if !UsageTracker::new(BodyKind::EventStream, wants).rewrites() {
                prop_assert_eq!(&whole.0, &bytes);
            }
            let r = whole.1;
            prop_assert!(r.usage.prompt_tokens <= MAX_COUNT && r.usage.completion_tokens <= MAX_COUNT.max(r.content_chunks));
            prop_assert!(r.content_chunks <= bytes.len() as u64);
        }
        let whole = run(BodyKind::Json, WANTS[0], &[&bytes]);
        prop_assert_eq!(run_chunks(BodyKind::Json, WANTS[0], &chunks), whole);
    }

    /// A non-streamed body split anywhere reads the same usage as whole.
    #[test]
    fn chunking_never_matters_for_json_bodies(
        text in text(),
        usage in prop::option::of(counters()),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..24),
    ) {
        let content = serde_json::to_string(&text).unwrap();
        let u = usage.as_ref().map_or(String::new(), |c| format!(r#","usage":{}"#, c.json()));
        let body = format!(
            r#"{{"id":"chatcmpl-1","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":{content}}},"finish_reason":"stop"}}]{u}}}"#
        );
        let want = UsageReport {
            usage: usage.as_ref().map_or(Usage::default(), Counters::usage),
            source: if usage.is_some() { UsageSource::Usage } else { UsageSource::None },
            content_chunks: 0,
            done: true,
        };
        let chunks = chunked(body.as_bytes(), &cuts);
        let (out, report) = run_chunks(BodyKind::Json, WANTS[0], &chunks);
        prop_assert_eq!(out, body.as_bytes());
        prop_assert_eq!(report, want);
    }
}

/// A realistic stream split once at every byte position, and fed one byte at a time.
#[test]
fn every_split_point_and_single_bytes() {
    let events = vec![
        Ev::Comment(" ping".into()),
        Ev::Content {
            text: String::new(),
            usage: Some(Counters {
                prompt: 17,
                completion: 0,
                cached: Some(Some(16)),
            }),
            place: Place::Last,
        },
        Ev::Content {
            text: "café — データ 😀 \"q\" \\".into(),
            usage: Some(Counters {
                prompt: 17,
                completion: 1,
                cached: Some(Some(16)),
            }),
            place: Place::Last,
        },
        Ev::Content {
            text: r#""usage":{"prompt_tokens":1}"#.into(),
            usage: None,
            place: Place::First,
        },
        Ev::Final(Counters {
            prompt: 17,
            completion: 2,
            cached: Some(Some(16)),
        }),
        Ev::Done,
    ];
    for crlf in [false, true] {
        let style = Style {
            crlf,
            space_after_data: true,
        };
        let forced: String = events
            .iter()
            .map(|e| render(e, style, true, true, false))
            .collect();
        let bytes = forced.as_bytes();
        for (wants, _) in all_wants() {
            let whole = run(BodyKind::EventStream, wants, &[bytes]);
            assert_eq!(whole.1, expected_report(&events));
            for at in 0..=bytes.len() {
                let (a, b) = bytes.split_at(at);
                assert_eq!(
                    run(BodyKind::EventStream, wants, &[a, b]),
                    whole,
                    "split at {at}"
                );
            }
            let singles: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(run(BodyKind::EventStream, wants, &singles), whole);
        }
    }
}
