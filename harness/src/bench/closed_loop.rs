//! A closed-loop HTTP/1.1 load client: `connections` keep-alive connections, each sending
//! its next request as soon as the previous response has been read to the end, until a
//! deadline. Requests/s then measures how fast the server side turns requests around at
//! that concurrency, and each request's latency is recorded.
//!
//! With a [`ClosedLoop::rate`], each connection instead sends on a fixed schedule (its share
//! of the rate, the connections staggered), or at once when its previous answer came late:
//! targets that keep up then see the same arrivals, so their CPU per request compares like
//! with like (a closed loop runs a slower target at a lower rate, with more idle wake-ups
//! per request).
//!
//! Requests are taken from a list of templates (body and extra headers), connection `c`
//! starting at template `c` and stepping by one, so every connection cycles through all
//! bodies and the mix is the same for every target.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One request to send: body and extra headers (path and method are per run).
#[derive(Clone, Debug)]
pub struct RequestTemplate {
    /// The `POST` body.
    pub body: Bytes,
    /// Headers besides `host`, `content-type` and `content-length`.
    pub headers: Vec<(String, String)>,
}

/// A closed-loop run against one address.
#[derive(Clone, Debug)]
pub struct ClosedLoop {
    /// Where to connect.
    pub target: SocketAddr,
    /// Request path (`/v1/chat/completions`).
    pub path: String,
    /// What to send, cycled through.
    pub templates: Arc<Vec<RequestTemplate>>,
    /// Connections, each with one request in flight.
    pub connections: usize,
    /// Requests per second offered over all connections; `None`: each connection sends as
    /// soon as its previous answer is in.
    pub rate: Option<f64>,
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct LoopResult {
    /// Requests answered 200.
    pub ok: u64,
    /// Requests answered otherwise, or failed in transport.
    pub errors: u64,
    /// The first error seen, for the report.
    pub first_error: Option<String>,
    /// Latency of every successful request, microseconds.
    pub latencies_us: Vec<u32>,
    /// Wall time from the first request to the last response.
    pub elapsed: Duration,
}

impl LoopResult {
    /// Successful requests per second.
    pub fn rps(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.ok as f64 / s
        } else {
            0.0
        }
    }

    /// Adds another run's figures (latencies appended, times summed).
    pub fn merge(&mut self, other: LoopResult) {
        self.ok += other.ok;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies_us.extend(other.latencies_us);
        self.elapsed += other.elapsed;
    }
}

type Sender = SendRequest<Full<Bytes>>;

impl ClosedLoop {
    /// Runs for `duration`; requests in flight at the deadline finish and are counted.
    pub async fn run(&self, duration: Duration) -> LoopResult {
        let start = Instant::now();
        let deadline = start + duration;
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..self.connections.max(1) {
            let me = self.clone();
            tasks.spawn(async move { me.connection(c, start, deadline).await });
        }
        let mut total = LoopResult::default();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(r) => total.merge(r),
                Err(e) => {
                    total.errors += 1;
                    total.first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        total.elapsed = start.elapsed();
        total
    }

    /// The gap between one connection's sends at [`ClosedLoop::rate`], if any.
    fn gap(&self) -> Option<Duration> {
        let rate = self.rate.filter(|r| r.is_finite() && *r > 0.0)?;
        Some(Duration::from_secs_f64(
            self.connections.max(1) as f64 / rate,
        ))
    }

    async fn connection(&self, index: usize, start: Instant, deadline: Instant) -> LoopResult {
        let mut out = LoopResult::default();
        let mut sender: Option<Sender> = None;
        let mut next = index;
        let gap = self.gap();
        // Connection `index` starts `index / connections` of a gap late: the sends interleave.
        let mut due = gap.map(|g| start + g.mul_f64(index as f64 / self.connections.max(1) as f64));
        while Instant::now() < deadline {
            if let (Some(at), Some(g)) = (due.as_mut(), gap) {
                tokio::time::sleep_until((*at).into()).await;
                // Behind schedule (a late answer): send now, with no burst to catch up.
                *at = (*at + g).max(Instant::now());
                if Instant::now() >= deadline {
                    break;
                }
            }
            let Some(template) = self.templates.get(next % self.templates.len().max(1)) else {
                out.first_error = Some("no request templates".into());
                break;
            };
            next += 1;
            let sent = Instant::now();
            match self.exchange(&mut sender, template).await {
                Ok(200) => {
                    out.ok += 1;
                    let us = sent.elapsed().as_micros();
                    out.latencies_us.push(u32::try_from(us).unwrap_or(u32::MAX));
                }
                Ok(status) => {
                    out.errors += 1;
                    out.first_error
                        .get_or_insert_with(|| format!("HTTP {status}"));
                }
                Err(e) => {
                    out.errors += 1;
                    out.first_error.get_or_insert_with(|| format!("{e:#}"));
                    sender = None;
                    // A refused connection would otherwise spin at full speed.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        out
    }

    /// One request on the connection (opened first if needed); the status it got.
    async fn exchange(
        &self,
        sender: &mut Option<Sender>,
        template: &RequestTemplate,
    ) -> anyhow::Result<u16> {
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
        let resp = conn
            .send_request(req.body(Full::new(template.body.clone()))?)
            .await?;
        let status = resp.status().as_u16();
        resp.into_body().collect().await?;
        *sender = Some(conn);
        Ok(status)
    }
}

async fn connect(target: SocketAddr) -> anyhow::Result<Sender> {
    let stream = TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::bench::overhead::backend::BenchBackend;
    use std::sync::atomic::Ordering;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_request_is_counted_and_timed() {
        let backend = BenchBackend::start(1).await.unwrap();
        let templates = vec![
            RequestTemplate {
                body: Bytes::from_static(b"{\"a\":1}"),
                headers: vec![],
            },
            RequestTemplate {
                body: Bytes::from_static(b"{\"bb\":22}"),
                headers: vec![("x-test".into(), "1".into())],
            },
        ];
        let lp = ClosedLoop {
            target: backend.addrs()[0],
            path: "/v1/chat/completions".into(),
            templates: Arc::new(templates),
            connections: 3,
            rate: None,
        };
        let r = lp.run(Duration::from_millis(300)).await;
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        assert!(r.ok > 10, "only {} requests", r.ok);
        assert_eq!(r.latencies_us.len() as u64, r.ok);
        assert!(r.rps() > 0.0);
        let posts = backend.counters().posts.load(Ordering::Relaxed);
        assert_eq!(posts, r.ok);
        // Bodies of 7 and 9 bytes alternate per connection.
        let bytes = backend.counters().body_bytes.load(Ordering::Relaxed);
        assert!(bytes >= 7 * posts && bytes <= 9 * posts);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paced_loop_sends_no_more_than_its_rate() {
        let backend = BenchBackend::start(1).await.unwrap();
        let lp = ClosedLoop {
            target: backend.addrs()[0],
            path: "/v1/chat/completions".into(),
            templates: Arc::new(vec![RequestTemplate {
                body: Bytes::from_static(b"{}"),
                headers: vec![],
            }]),
            connections: 2,
            rate: Some(40.0),
        };
        let r = lp.run(Duration::from_millis(500)).await;
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        // Each connection sends every 50 ms from its start, the second 25 ms after the
        // first: at most 10 sends each within 500 ms (an unpaced loop makes thousands).
        assert!(r.ok >= 2 && r.ok <= 20, "{} requests", r.ok);
        assert_eq!(backend.counters().posts.load(Ordering::Relaxed), r.ok);
    }

    #[tokio::test]
    async fn a_refused_connection_is_an_error_not_a_hang() {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let lp = ClosedLoop {
            target: addr,
            path: "/".into(),
            templates: Arc::new(vec![RequestTemplate {
                body: Bytes::new(),
                headers: vec![],
            }]),
            connections: 1,
            rate: None,
        };
        let r = lp.run(Duration::from_millis(100)).await;
        assert_eq!(r.ok, 0);
        assert!(r.errors > 0 && r.first_error.is_some());
    }
}
