//! Hostile requests: the inputs a gateway meets from broken or malicious clients, written
//! byte for byte onto a fresh connection (a typed HTTP client would refuse or normalise
//! most of them: mixed-case names, bytes above 0x7F, bodies that are not JSON).
//!
//! Each kind has an answer it may get: a 4xx (the gateway or the engine refused it) or a
//! 200 (it was harmless and served). A 5xx, a cut response or a dead connection means the
//! gateway failed on it.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Value bytes 0x80–0xFF (Envoy passes them through in header values).
const HIGH_BYTES: std::ops::RangeInclusive<u8> = 0x80..=0xFF;

/// Largest response read from a hostile request; engines' answers here are small.
const MAX_RESPONSE: usize = 1 << 20;

/// The kinds of hostile request, in the order they are cycled through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostileKind {
    /// A header value holding every byte 0x80–0xFF.
    HighByteHeader,
    /// A 60 KiB header value.
    HugeHeader,
    /// 100 `x-gateway-destination-endpoint` headers in mixed case, naming an address outside
    /// the pool (a spoofed destination must never be honoured). With the request's own
    /// headers that passes Envoy's default limit of 100 headers: Envoy answers 431 itself.
    DuplicateDestination,
    /// The same with 90 copies, which stays under Envoy's header count, so the gateway
    /// must strip them.
    DuplicateDestination90,
    /// A body cut in the middle of a string.
    TruncatedJson,
    /// 200 levels of nested arrays.
    DeepNesting,
    /// 1 MiB of `1e308,` in `tools`.
    FloatTools,
    /// Bytes that are not UTF-8 inside a JSON string.
    InvalidUtf8,
    /// A `model` of 1 MiB.
    HugeModel,
}

impl HostileKind {
    /// Every kind.
    pub const ALL: [HostileKind; 9] = [
        HostileKind::HighByteHeader,
        HostileKind::HugeHeader,
        HostileKind::DuplicateDestination,
        HostileKind::DuplicateDestination90,
        HostileKind::TruncatedJson,
        HostileKind::DeepNesting,
        HostileKind::FloatTools,
        HostileKind::InvalidUtf8,
        HostileKind::HugeModel,
    ];

    /// Short label for tables.
    pub fn name(self) -> &'static str {
        match self {
            HostileKind::HighByteHeader => "header-0x80-0xff",
            HostileKind::HugeHeader => "header-60KiB",
            HostileKind::DuplicateDestination => "dup-destination-x100",
            HostileKind::DuplicateDestination90 => "dup-destination-x90",
            HostileKind::TruncatedJson => "truncated-json",
            HostileKind::DeepNesting => "nesting-200",
            HostileKind::FloatTools => "tools-1MiB-floats",
            HostileKind::InvalidUtf8 => "invalid-utf8",
            HostileKind::HugeModel => "model-1MiB",
        }
    }

    /// The request's headers (beyond the usual ones) and body.
    pub fn build(self, model: &str) -> (Vec<u8>, Vec<u8>) {
        let small = small_body(model);
        match self {
            HostileKind::HighByteHeader => {
                let mut h = b"x-note: caf".to_vec();
                h.extend(HIGH_BYTES);
                h.extend_from_slice(b"\r\n");
                (h, small)
            }
            HostileKind::HugeHeader => {
                let mut h = b"x-big: ".to_vec();
                h.resize(h.len() + 60 * 1024, b'a');
                h.extend_from_slice(b"\r\n");
                (h, small)
            }
            HostileKind::DuplicateDestination | HostileKind::DuplicateDestination90 => {
                let copies = if self == HostileKind::DuplicateDestination {
                    100
                } else {
                    90
                };
                let mut h = Vec::new();
                for i in 0..copies {
                    let name = mixed_case("x-gateway-destination-endpoint", i);
                    h.extend_from_slice(format!("{name}: 127.0.0.1:1\r\n").as_bytes());
                }
                (h, small)
            }
            HostileKind::TruncatedJson => {
                let cut = small.len() / 2;
                (Vec::new(), small.get(..cut).unwrap_or_default().to_vec())
            }
            HostileKind::DeepNesting => {
                let body = format!(
                    "{{\"model\":{},\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\
                     \"max_tokens\":4,\"metadata\":{}1{}}}",
                    json_string(model),
                    "[".repeat(200),
                    "]".repeat(200)
                );
                (Vec::new(), body.into_bytes())
            }
            HostileKind::FloatTools => (Vec::new(), float_tools_body(model, 1 << 20)),
            HostileKind::InvalidUtf8 => {
                let mut body = format!(
                    "{{\"model\":{},\"max_tokens\":4,\"messages\":[{{\"role\":\"user\",\
                     \"content\":\"bad ",
                    json_string(model)
                )
                .into_bytes();
                body.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28, 0xa0, 0xa1]);
                body.extend_from_slice(b" end\"}]}");
                (Vec::new(), body)
            }
            HostileKind::HugeModel => {
                let body = format!(
                    "{{\"model\":\"{}\",\"max_tokens\":4,\"messages\":[{{\"role\":\"user\",\
                     \"content\":\"hi\"}}]}}",
                    "m".repeat(1 << 20)
                );
                (Vec::new(), body.into_bytes())
            }
        }
    }
}

/// A small valid non-streamed chat body.
fn small_body(model: &str) -> Vec<u8> {
    format!(
        "{{\"model\":{},\"max_tokens\":4,\"messages\":[{{\"role\":\"user\",\"content\":\
         \"hello there, a short question\"}}]}}",
        json_string(model)
    )
    .into_bytes()
}

/// A chat body whose `tools` is an array of `1e308` filling it to about `size` bytes.
pub fn float_tools_body(model: &str, size: usize) -> Vec<u8> {
    let head = format!(
        "{{\"model\":{},\"max_tokens\":1,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\
         \"tools\":[",
        json_string(model)
    );
    let mut body = head.into_bytes();
    let n = size.saturating_sub(body.len() + 8) / 6;
    for _ in 0..n {
        body.extend_from_slice(b"1e308,");
    }
    body.extend_from_slice(b"1e308]}");
    body
}

/// `name` with letters upper-cased by the bits of `variant`, so 100 variants differ.
fn mixed_case(name: &str, variant: u32) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            // Bit i mod 7 of the variant picks the case at position i: 100 variants below
            // 128 give 100 different spellings.
            if ((variant >> (i % 7)) ^ i as u32) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// What came back on a raw exchange.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawAnswer {
    /// Status code; 0 when no status line arrived.
    pub status: u16,
    /// `x-infergate-replica-addr` of the answer (the simulator replica that served it).
    pub replica: Option<String>,
    /// Why the exchange failed (no answer, a cut body, a timeout).
    pub error: Option<String>,
}

/// Sends `POST path` with `extra_headers` (raw header lines) and `body` on a new connection
/// (`connection: close`) and reads the answer to its end.
pub async fn exchange(
    addr: SocketAddr,
    path: &str,
    extra_headers: &[u8],
    body: &[u8],
    timeout: Duration,
) -> RawAnswer {
    match tokio::time::timeout(timeout, exchange_inner(addr, path, extra_headers, body)).await {
        Ok(answer) => answer,
        Err(_) => RawAnswer {
            error: Some(format!("timed out after {timeout:?}")),
            ..RawAnswer::default()
        },
    }
}

async fn exchange_inner(
    addr: SocketAddr,
    path: &str,
    extra_headers: &[u8],
    body: &[u8],
) -> RawAnswer {
    let failed = |e: String| RawAnswer {
        error: Some(e),
        ..RawAnswer::default()
    };
    let stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return failed(format!("connect: {e}")),
    };
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         connection: close\r\ncontent-length: {}\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(extra_headers);
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);
    // Written alongside the read: Envoy may answer (431, 413) and close before it has
    // taken the whole request, and the answer is what counts.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        let _ = wr.flush().await;
        wr
    });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let read_error = loop {
        match rd.read(&mut chunk).await {
            Ok(0) => break None,
            Ok(n) => {
                buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
                if buf.len() > MAX_RESPONSE {
                    break Some("answer larger than 1 MiB".to_string());
                }
            }
            Err(e) => break Some(format!("read: {e}")),
        }
    };
    writer.abort();
    let mut answer = parse_answer(&buf);
    if answer.error.is_none() {
        answer.error = read_error.filter(|_| answer.status == 0);
    }
    answer
}

/// Parses a whole HTTP/1.1 answer read to EOF: status, the replica header, and whether the
/// body is complete (its `content-length`, or chunked coding's last chunk).
pub fn parse_answer(raw: &[u8]) -> RawAnswer {
    let mut answer = RawAnswer::default();
    let Some(head_end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        answer.error = Some(if raw.is_empty() {
            "connection closed with no answer".to_string()
        } else {
            "answer cut inside its headers".to_string()
        });
        return answer;
    };
    let head = String::from_utf8_lossy(raw.get(..head_end).unwrap_or_default());
    let body = raw.get(head_end + 4..).unwrap_or_default();
    let mut lines = head.split("\r\n");
    answer.status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = value.parse::<usize>().ok(),
            "transfer-encoding" => chunked = value.eq_ignore_ascii_case("chunked"),
            "x-infergate-replica-addr" => answer.replica = Some(value.to_string()),
            _ => {}
        }
    }
    let complete = if chunked {
        body.ends_with(b"0\r\n\r\n")
    } else {
        length.is_none_or(|n| body.len() >= n)
    };
    if answer.status == 0 {
        answer.error = Some("no status line".to_string());
    } else if !complete {
        answer.error = Some("answer body cut".to_string());
    }
    answer
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_builds_what_it_names() {
        let model = "sim-model";
        for kind in HostileKind::ALL {
            let (headers, body) = kind.build(model);
            let json = serde_json::from_slice::<serde_json::Value>(&body);
            match kind {
                HostileKind::HighByteHeader => {
                    assert!((0x80..=0xffu8).all(|b| headers.contains(&b)));
                    assert!(json.is_ok());
                }
                HostileKind::HugeHeader => assert!(headers.len() > 60 * 1024),
                HostileKind::DuplicateDestination | HostileKind::DuplicateDestination90 => {
                    let copies = if kind == HostileKind::DuplicateDestination {
                        100
                    } else {
                        90
                    };
                    let text = String::from_utf8(headers).unwrap();
                    let names: std::collections::HashSet<&str> = text
                        .lines()
                        .filter_map(|l| l.split_once(':').map(|(n, _)| n))
                        .collect();
                    assert_eq!(text.lines().count(), copies);
                    assert_eq!(names.len(), copies, "mixed-case spellings");
                    assert!(names
                        .iter()
                        .all(|n| n.eq_ignore_ascii_case("x-gateway-destination-endpoint")));
                }
                HostileKind::TruncatedJson | HostileKind::InvalidUtf8 => assert!(json.is_err()),
                HostileKind::DeepNesting => {
                    assert!(body.windows(200).any(|w| w.iter().all(|&b| b == b'[')))
                }
                HostileKind::FloatTools => {
                    assert!(json.is_ok());
                    assert!(body.len() > 1 << 19 && body.len() <= 1 << 20);
                }
                HostileKind::HugeModel => assert!(body.len() > 1 << 20),
            }
        }
        assert!(float_tools_body(model, 4 << 20).len() <= 4 << 20);
    }

    #[test]
    fn answers_parse_and_cut_bodies_are_errors() {
        let ok = parse_answer(
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-infergate-replica-addr: 1.2.3.4:5\r\n\r\nok",
        );
        assert_eq!(ok.status, 200);
        assert_eq!(ok.replica.as_deref(), Some("1.2.3.4:5"));
        assert!(ok.error.is_none());
        let cut = parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nok");
        assert_eq!(cut.error.as_deref(), Some("answer body cut"));
        let chunked = parse_answer(
            b"HTTP/1.1 400 Bad\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
        );
        assert_eq!((chunked.status, chunked.error), (400, None));
        let chunk_cut =
            parse_answer(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab");
        assert!(chunk_cut.error.is_some());
        assert_eq!(parse_answer(b"").status, 0);
        assert!(parse_answer(b"HTTP/1.1 200").error.is_some());
    }
}
