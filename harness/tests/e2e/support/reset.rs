//! A replica that looks healthy to the scraper and resets every request: `GET /metrics`
//! answers the vLLM page (idle, KV at the level it was given, so the picker finds it the
//! most attractive endpoint), every other request is read and then answered with a TCP
//! reset (the socket closed with `SO_LINGER` 0) before a byte of response. Envoy sees
//! `reset before headers`, the case its retry policy retries on the next endpoint.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The resetting replica; it stops listening when dropped.
pub struct ResettingBackend {
    pub addr: SocketAddr,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

/// What the test sets and reads on a running resetting replica.
#[derive(Debug, Default)]
struct Counters {
    /// KV usage `/metrics` reports, in thousandths.
    kv_permille: AtomicU64,
    /// Requests answered with a reset.
    resets: AtomicU64,
    /// `/metrics` requests answered.
    scrapes: AtomicU64,
}

impl Drop for ResettingBackend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ResettingBackend {
    /// Listens on a free loopback port; `/metrics` reports KV usage `kv` (0..1).
    pub async fn start(kv: f64) -> ResettingBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let backend_counters = counters.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, backend_counters.clone()));
            }
        });
        let backend = ResettingBackend {
            addr,
            counters,
            task,
        };
        backend.set_kv(kv);
        backend
    }

    /// Sets the KV usage (0..1) the next `/metrics` pages report.
    pub fn set_kv(&self, utilisation: f64) {
        let permille = (utilisation * 1000.0).round().clamp(0.0, 1000.0) as u64;
        self.counters.kv_permille.store(permille, Ordering::SeqCst);
    }

    /// Requests (other than `/metrics`) answered with a reset so far.
    pub fn resets(&self) -> u64 {
        self.counters.resets.load(Ordering::SeqCst)
    }

    /// Waits until `/metrics` has been answered `more` more times, at most 10 s.
    pub async fn wait_scrapes(&self, more: u64) {
        let target = self.counters.scrapes.load(Ordering::SeqCst) + more;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.counters.scrapes.load(Ordering::SeqCst) < target {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the resetting replica {} was not scraped",
                self.addr
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Serves one connection: `/metrics` as often as asked (keep-alive), the first other
/// request with a reset.
async fn serve(mut stream: TcpStream, counters: Arc<Counters>) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let Some((head_len, body_len, path)) = read_head(&mut stream, &mut buf).await else {
            return;
        };
        // The body (the scraper's GET has none; a completion's JSON does).
        while buf.len() < head_len + body_len {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..head_len + body_len);
        if path != "/metrics" {
            counters.resets.fetch_add(1, Ordering::SeqCst);
            // A zero linger never blocks: the close sends a reset at once. (The
            // deprecation is about a non-zero linger blocking the runtime thread.)
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
            return;
        }
        let kv = counters.kv_permille.load(Ordering::SeqCst) as f64 / 1000.0;
        let page = format!(
            "# backend resetting\n\
             vllm:num_requests_waiting{{model_name=\"m\"}} 0\n\
             vllm:num_requests_running{{model_name=\"m\"}} 0\n\
             vllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n"
        );
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n\
             content-length: {}\r\n\r\n{page}",
            page.len()
        );
        if stream.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        counters.scrapes.fetch_add(1, Ordering::SeqCst);
    }
}

/// Reads until the end of a request head; returns its length, the body's
/// `content-length` and the path.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize, String)> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
            let body_len = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse().ok())
                .unwrap_or(0);
            return Some((end + 4, body_len, path));
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
