//! The streamed windows of `bench overhead`: a closed loop like
//! [`crate::bench::closed_loop::ClosedLoop`] whose requests are answered with a paced SSE
//! stream ([`super::backend`]), timing for each request its response headers, its first
//! chunk (from sending the request to the first body bytes) and its end.
//!
//! Every stream is checked as it is read: all its content chunks (`chunks`) and
//! `[DONE]`, and no usage at all, since the client never asks for it (a tenancy arm's
//! gateway forces usage on upstream and must cut it out again). A stream that fails the
//! check counts as an error. Responses carrying OpenAI's `x-ratelimit-limit-requests` (the
//! quota stage's header on admitted responses) are counted, so a tenancy arm shows that
//! its requests went through the quota stage.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::bench::closed_loop::RequestTemplate;

/// The header the quota stage sets on every admitted response.
const QUOTA_HEADER: &str = "x-ratelimit-limit-requests";

/// A closed loop of streamed requests against one address.
#[derive(Clone, Debug)]
pub struct StreamLoop {
    /// Where to connect.
    pub target: SocketAddr,
    /// Request path.
    pub path: String,
    /// What to send, cycled through (each asks for the streamed answer).
    pub templates: Arc<Vec<RequestTemplate>>,
    /// Connections, each with one stream in flight.
    pub connections: usize,
    /// Content chunks every stream must carry (what its body's `max_tokens` asks for).
    pub chunks: u32,
}

/// What a streamed run measured.
#[derive(Clone, Debug, Default)]
pub struct StreamResult {
    /// Streams read whole and found as expected.
    pub ok: u64,
    /// Other statuses, transport failures and streams that failed the check.
    pub errors: u64,
    /// The first error seen.
    pub first_error: Option<String>,
    /// Response-headers latency of every good stream, microseconds (what the first chunk
    /// adds to it is the response path of the chunk alone).
    pub headers_us: Vec<u32>,
    /// First-chunk latency of every good stream, microseconds.
    pub first_chunk_us: Vec<u32>,
    /// Whole-stream latency of every good stream, microseconds.
    pub total_us: Vec<u32>,
    /// Good streams whose response carried the quota stage's rate-limit headers.
    pub quota_headers: u64,
    /// Wall time of the runs.
    pub elapsed: Duration,
}

impl StreamResult {
    /// Adds another run's figures.
    pub fn merge(&mut self, other: StreamResult) {
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.headers_us.extend(other.headers_us);
        self.first_chunk_us.extend(other.first_chunk_us);
        self.total_us.extend(other.total_us);
        self.quota_headers += other.quota_headers;
        self.elapsed += other.elapsed;
    }

    fn fail(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// One good stream's timings.
struct Timed {
    headers: Duration,
    first_chunk: Duration,
    total: Duration,
    quota_header: bool,
}

impl StreamLoop {
    /// Runs for `duration`; streams in flight at the deadline finish and are counted.
    pub async fn run(&self, duration: Duration) -> StreamResult {
        let start = Instant::now();
        let deadline = start + duration;
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..self.connections.max(1) {
            let me = self.clone();
            tasks.spawn(async move { me.connection(c, deadline).await });
        }
        let mut total = StreamResult::default();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(r) => total.merge(r),
                Err(e) => total.fail(e.to_string()),
            }
        }
        total.elapsed = start.elapsed();
        total
    }

    async fn connection(&self, index: usize, deadline: Instant) -> StreamResult {
        let mut out = StreamResult::default();
        let mut sender: Option<Sender> = None;
        let mut next = index;
        while Instant::now() < deadline {
            let Some(template) = self.templates.get(next % self.templates.len().max(1)) else {
                out.fail("no request templates".into());
                break;
            };
            next += 1;
            match self.exchange(&mut sender, template).await {
                Ok(t) => {
                    out.ok += 1;
                    out.quota_headers += u64::from(t.quota_header);
                    out.headers_us.push(micros(t.headers));
                    out.first_chunk_us.push(micros(t.first_chunk));
                    out.total_us.push(micros(t.total));
                }
                Err(e) => {
                    out.fail(format!("{e:#}"));
                    sender = None;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        out
    }

    /// One streamed request on the connection (opened first if needed).
    async fn exchange(
        &self,
        sender: &mut Option<Sender>,
        template: &RequestTemplate,
    ) -> Result<Timed> {
        let mut conn = match sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => connect(self.target).await?,
        };
        conn.ready().await?;
        let mut req = Request::post(self.path.as_str())
            .header("host", self.target.to_string())
            .header("content-type", "application/json");
        for (k, v) in &template.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let sent = Instant::now();
        let mut resp = conn
            .send_request(req.body(Full::new(template.body.clone()))?)
            .await?;
        let headers = sent.elapsed();
        let status = resp.status().as_u16();
        let quota_header = resp.headers().contains_key(QUOTA_HEADER);
        let mut first_chunk = None;
        let mut text = Vec::new();
        while let Some(frame) = resp.body_mut().frame().await {
            if let Ok(data) = frame?.into_data() {
                if !data.is_empty() {
                    first_chunk.get_or_insert_with(|| sent.elapsed());
                    text.extend_from_slice(&data);
                }
            }
        }
        let total = sent.elapsed();
        *sender = Some(conn);
        if status != 200 {
            bail!("HTTP {status}");
        }
        check_stream(&text, self.chunks)?;
        Ok(Timed {
            headers,
            first_chunk: first_chunk.unwrap_or(total),
            total,
            quota_header,
        })
    }
}

/// A stream as the client must receive it: every content chunk, `[DONE]`, no usage.
fn check_stream(text: &[u8], chunks: u32) -> Result<()> {
    let text = String::from_utf8_lossy(text);
    let events = text.matches("data: ").count();
    if events != chunks as usize + 1 || !text.ends_with("data: [DONE]\n\n") {
        bail!("stream of {events} events, not {chunks} chunks and [DONE]");
    }
    if text.contains("usage") {
        bail!("the client received usage it never asked for");
    }
    Ok(())
}

fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

async fn connect(target: SocketAddr) -> Result<Sender> {
    let stream = TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::backend::{BenchBackend, CHUNK_GAP, STREAM_CHUNKS, STREAM_HEADER};
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn first_chunks_come_before_the_end_and_every_stream_is_checked() {
        let backend = BenchBackend::start(1).await.unwrap();
        let template = |headers: Vec<(String, String)>| RequestTemplate {
            body: Bytes::from_static(br#"{"model":"m","stream":true}"#),
            headers,
        };
        let lp = StreamLoop {
            target: backend.addrs()[0],
            path: "/v1/chat/completions".into(),
            templates: Arc::new(vec![template(vec![(STREAM_HEADER.into(), "1".into())])]),
            connections: 2,
            chunks: STREAM_CHUNKS,
        };
        let r = lp.run(Duration::from_millis(300)).await;
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        assert!(r.ok >= 4, "only {} streams", r.ok);
        assert_eq!(r.quota_headers, 0, "no gateway, no quota headers");
        let gaps = CHUNK_GAP * (STREAM_CHUNKS - 1);
        assert_eq!(r.headers_us.len(), r.first_chunk_us.len());
        for (headers, first) in r.headers_us.iter().zip(&r.first_chunk_us) {
            assert!(headers <= first, "{headers} {first}");
        }
        for (first, total) in r.first_chunk_us.iter().zip(&r.total_us) {
            assert!(
                u128::from(total - first) >= gaps.as_micros(),
                "{first} {total}"
            );
        }
        // Without the header the backend answers JSON: not a stream, so an error.
        let lp = StreamLoop {
            templates: Arc::new(vec![template(Vec::new())]),
            connections: 1,
            ..lp
        };
        let r = lp.run(Duration::from_millis(50)).await;
        assert_eq!(r.ok, 0);
        assert!(r.first_error.unwrap().contains("events"));
    }

    #[test]
    fn usage_in_the_client_stream_fails_the_check() {
        let mut text = String::new();
        for i in 0..STREAM_CHUNKS {
            text.push_str(&format!("data: {{\"n\":{i}}}\n\n"));
        }
        text.push_str("data: [DONE]\n\n");
        assert!(check_stream(text.as_bytes(), STREAM_CHUNKS).is_ok());
        assert!(check_stream(text.as_bytes(), STREAM_CHUNKS + 1).is_err());
        let with_usage = text.replacen("{\"n\":0}", "{\"usage\":{}}", 1);
        assert!(check_stream(with_usage.as_bytes(), STREAM_CHUNKS).is_err());
        assert!(check_stream(b"data: [DONE]\n\n", STREAM_CHUNKS).is_err());
    }
}
