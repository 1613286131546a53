//! One streamed chat request over plain HTTP/1.1 (hyper client with a small keep-alive
//! pool), measuring time to first content token and reading the usage chunk. A request
//! may carry extra headers and may be abandoned after a few content chunks, as a user who
//! stops a generation does ([`ChatExtras`]; the soak uses both).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpStream;

/// Header the gateway sets on requests it rejects before they reach an engine.
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";

/// A parsed base URL: requests go to `<base>/v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// As given.
    pub url: String,
    /// `host:port` to connect to and send as `Host`.
    pub authority: String,
    /// Path prefix without a trailing slash (may be empty).
    pub prefix: String,
}

impl BaseUrl {
    /// Parses `http://host:port[/prefix]`.
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        let uri: hyper::Uri = url.parse()?;
        if uri.scheme_str() != Some("http") {
            anyhow::bail!("only http:// base URLs are supported: {url}");
        }
        let Some(auth) = uri.authority() else {
            anyhow::bail!("base URL without host: {url}");
        };
        let authority = match auth.port_u16() {
            Some(_) => auth.as_str().to_string(),
            None => format!("{}:80", auth.host()),
        };
        Ok(Self {
            url: url.to_string(),
            authority,
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// Idle keep-alive connections by `host:port`, shared by the requests of a run.
#[derive(Debug, Clone, Default)]
pub struct ConnPool {
    idle: Arc<Mutex<HashMap<String, Vec<Sender>>>>,
}

impl ConnPool {
    /// An idle connection to `authority` that is still open, or a new one.
    async fn get(&self, authority: &str) -> anyhow::Result<Sender> {
        loop {
            let cached = match self.idle.lock() {
                Ok(mut idle) => idle.get_mut(authority).and_then(Vec::pop),
                Err(_) => None,
            };
            let Some(mut sender) = cached else { break };
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let stream = TcpStream::connect(authority).await?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // The connection task ends when its last sender is dropped or the peer closes.
        tokio::spawn(conn);
        Ok(sender)
    }

    /// Returns a connection whose response was read to the end.
    fn put(&self, authority: &str, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            idle.entry(authority.to_string()).or_default().push(sender);
        }
    }
}

/// What one request did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Conversation index.
    pub conversation: u32,
    /// Turn index (0-based).
    pub turn: u32,
    /// Base URL the request went to.
    pub url: String,
    /// HTTP status; 0 when the connection failed.
    pub status: u16,
    /// Seconds from send to the first chunk with non-empty content.
    pub ttft_s: Option<f64>,
    /// Seconds from send to the end of the response.
    pub e2e_s: f64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub cached_tokens: u64,
    /// `usage.completion_tokens` (the last usage seen: with continuous usage, the count up
    /// to the last chunk read).
    pub completion_tokens: u64,
    /// Whether any chunk carried a `usage` object.
    pub usage_seen: bool,
    /// Chunks with non-empty content read.
    pub content_chunks: u64,
    /// `x-llm-d-request-dropped-reason`, if present.
    pub dropped_reason: Option<String>,
    /// `x-infergate-replica` (simulator) or `x-gateway-destination-endpoint-served`, if present.
    pub served_by: Option<String>,
    /// The `model` the answer names (the served model: after a gateway's rewrite, the
    /// version that answered), from the first chunk parsed in full.
    pub model: Option<String>,
    /// Error message (transport error or the body's `error.message`).
    pub error: Option<String>,
    /// The client dropped the stream on purpose before its end ([`ChatExtras::abort_after`]).
    pub aborted: bool,
    /// The assistant text, for the next turn (not serialized).
    #[serde(skip)]
    pub content: String,
}

impl RequestRecord {
    /// A 200 with usage.
    pub fn ok(&self) -> bool {
        self.status == 200 && self.error.is_none()
    }

    /// Completion tokens the client received: the usage it saw, else one per content chunk.
    pub fn tokens_received(&self) -> u64 {
        if self.usage_seen {
            self.completion_tokens
        } else {
            self.content_chunks
        }
    }
}

/// What a request does beyond the plain workload turn.
#[derive(Debug, Clone, Default)]
pub struct ChatExtras {
    /// Headers added to the request.
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// Drop the stream (and its connection) once at least this many content chunks have
    /// arrived (all the chunks of the network read that reached it are counted), as a
    /// client that goes away mid-stream; the record says `aborted`.
    pub abort_after: Option<u32>,
}

/// Sends one chat request and reads its SSE stream to the end, reusing an idle connection
/// from `pool` when there is one.
pub async fn chat(
    pool: &ConnPool,
    base: &BaseUrl,
    body: Bytes,
    api_key: Option<&str>,
    timeout: Duration,
) -> RequestRecord {
    chat_with(pool, base, body, api_key, timeout, &ChatExtras::default()).await
}

/// [`chat`] with extra headers and an optional abort mid-stream.
pub async fn chat_with(
    pool: &ConnPool,
    base: &BaseUrl,
    body: Bytes,
    api_key: Option<&str>,
    timeout: Duration,
    extras: &ChatExtras,
) -> RequestRecord {
    let start = Instant::now();
    let mut rec = RequestRecord {
        url: base.url.clone(),
        ..RequestRecord::default()
    };
    let result = tokio::time::timeout(
        timeout,
        exchange(pool, base, body, api_key, extras, start, &mut rec),
    )
    .await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => rec.error = Some(e.to_string()),
        Err(_) => rec.error = Some(format!("timed out after {timeout:?}")),
    }
    rec.e2e_s = start.elapsed().as_secs_f64();
    rec
}

async fn exchange(
    pool: &ConnPool,
    base: &BaseUrl,
    body: Bytes,
    api_key: Option<&str>,
    extras: &ChatExtras,
    start: Instant,
    rec: &mut RequestRecord,
) -> anyhow::Result<()> {
    let mut sender = pool.get(&base.authority).await?;
    let mut req = Request::post(format!("{}/v1/chat/completions", base.prefix))
        .header("host", &base.authority)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream");
    if let Some(key) = api_key {
        req = req.header("authorization", format!("Bearer {key}"));
    }
    for (name, value) in &extras.headers {
        req = req.header(name, value);
    }
    let resp = sender.send_request(req.body(Full::new(body))?).await?;
    rec.status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    rec.dropped_reason = header(DROPPED_REASON_HEADER);
    rec.served_by = header("x-infergate-replica-addr")
        .or_else(|| header("x-gateway-destination-endpoint-served"));
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut events = SseEvents::default();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        if rec.status != 200 {
            buf.extend_from_slice(&data);
            continue;
        }
        events.push(&data);
        while let Some(payload) = events.next_data() {
            if payload == "[DONE]" {
                continue;
            }
            if let Some(text) = fast_content(&payload) {
                if !text.is_empty() && rec.ttft_s.is_none() {
                    rec.ttft_s = Some(start.elapsed().as_secs_f64());
                }
                rec.content.push_str(text);
                rec.content_chunks += u64::from(!text.is_empty());
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(&payload) else {
                rec.error = Some(format!("bad SSE payload: {payload}"));
                continue;
            };
            if rec.model.is_none() {
                rec.model = v.get("model").and_then(Value::as_str).map(str::to_owned);
            }
            let text = delta_text(&v);
            if !text.is_empty() {
                if rec.ttft_s.is_none() {
                    rec.ttft_s = Some(start.elapsed().as_secs_f64());
                }
                rec.content.push_str(text);
                rec.content_chunks += 1;
            }
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                rec.usage_seen = true;
                let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
                rec.prompt_tokens = n("/prompt_tokens");
                rec.completion_tokens = n("/completion_tokens");
                rec.cached_tokens = n("/prompt_tokens_details/cached_tokens");
            }
        }
        if extras
            .abort_after
            .is_some_and(|n| rec.content_chunks >= u64::from(n))
        {
            // Dropping the body and the sender closes the connection mid-response, which
            // is what a client that goes away does; the connection never returns to the pool.
            rec.aborted = true;
            return Ok(());
        }
    }
    pool.put(&base.authority, sender);
    if rec.status != 200 {
        let v: Option<Value> = serde_json::from_slice(&buf).ok();
        let msg = v
            .as_ref()
            .and_then(|v| v.pointer("/error/message"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&buf).chars().take(200).collect());
        rec.error = Some(msg);
    }
    Ok(())
}

/// The content of a compact content chunk found without parsing the JSON (the hot path:
/// one call per token). `None` when the chunk may carry more (usage) or has escapes.
fn fast_content(payload: &str) -> Option<&str> {
    if payload.contains("\"usage\"") || !payload.starts_with('{') {
        return None;
    }
    let start = ["\"content\":\"", "\"text\":\""]
        .iter()
        .find_map(|k| payload.find(k).map(|p| p + k.len()))?;
    let rest = payload.get(start..)?;
    let text = rest.get(..rest.find('"')?)?;
    if text.contains('\\') {
        return None;
    }
    Some(text)
}

/// The content of a chat delta or a completion choice (empty when none).
fn delta_text(v: &Value) -> &str {
    let Some(choice) = v.pointer("/choices/0") else {
        return "";
    };
    choice
        .pointer("/delta/content")
        .or_else(|| choice.get("text"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Incremental SSE splitter: yields the `data:` payload of each complete event.
#[derive(Debug, Default)]
pub struct SseEvents {
    buf: Vec<u8>,
}

impl SseEvents {
    /// Appends received bytes.
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete event's data (multi-line data joined by `\n`), if any.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            let end = find_event_end(&self.buf)?;
            let event: Vec<u8> = self.buf.drain(..end.0 + end.1).take(end.0).collect();
            let text = String::from_utf8_lossy(&event);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if !data.is_empty() {
                return Some(data.join("\n"));
            }
        }
    }
}

/// Position and length of the first blank-line separator.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| (p, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn sse_split_across_pushes() {
        let mut s = SseEvents::default();
        s.push(b"data: {\"a\":1}\n\nda");
        assert_eq!(s.next_data().as_deref(), Some("{\"a\":1}"));
        assert_eq!(s.next_data(), None);
        s.push(b"ta: [DONE]\r\n\r\n: comment\n\n");
        assert_eq!(s.next_data().as_deref(), Some("[DONE]"));
        assert_eq!(s.next_data(), None);
    }

    #[test]
    fn fast_path_agrees_with_json() {
        for p in [
            r#"{"id":"a","choices":[{"index":0,"delta":{"content":"abc "},"finish_reason":null}]}"#,
            r#"{"id":"a","choices":[{"index":0,"text":"x y","finish_reason":null}]}"#,
            r#"{"id":"a","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        ] {
            let v: Value = serde_json::from_str(p).unwrap();
            assert_eq!(fast_content(p), Some(delta_text(&v)));
        }
        assert_eq!(
            fast_content(r#"{"choices":[{"delta":{"content":"a\"b"}}]}"#),
            None
        );
        assert_eq!(
            fast_content(r#"{"choices":[],"usage":{"prompt_tokens":1}}"#),
            None
        );
    }

    #[test]
    fn base_url_keeps_prefix() {
        let b = BaseUrl::parse("http://127.0.0.1:8080/rr/").unwrap();
        assert_eq!(b.authority, "127.0.0.1:8080");
        assert_eq!(b.prefix, "/rr");
        assert!(BaseUrl::parse("https://x:1").is_err());
        assert_eq!(BaseUrl::parse("http://h").unwrap().authority, "h:80");
    }
}
