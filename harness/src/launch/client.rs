//! A small HTTP/1.1 client for tests and tools: JSON requests, and streamed (SSE) responses
//! with the arrival time of every chunk, so a test can prove a proxy did not buffer.
//!
//! One connection per request: simple and isolated, which is what tests want. Load
//! generation belongs to the load generator, which pools connections.

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// A buffered response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl HttpResponse {
    /// The body parsed as JSON.
    pub fn json(&self) -> Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
            .with_context(|| format!("body is not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// One body chunk of a streamed response and when it arrived (since the request was sent).
#[derive(Debug, Clone)]
pub struct Chunk {
    /// Time from sending the request to receiving this chunk.
    pub at: Duration,
    /// The bytes.
    pub data: Bytes,
}

/// A response read chunk by chunk.
#[derive(Debug, Clone)]
pub struct StreamedResponse {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// Time to the response headers.
    pub headers_at: Duration,
    /// Every data chunk in order.
    pub chunks: Vec<Chunk>,
}

impl StreamedResponse {
    /// The whole body.
    pub fn body(&self) -> Vec<u8> {
        self.chunks
            .iter()
            .flat_map(|c| c.data.iter().copied())
            .collect()
    }

    /// The `data:` payloads of the SSE events, in order (`[DONE]` included).
    pub fn sse_data(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body())
            .split("\n\n")
            .filter_map(|event| {
                let lines: Vec<&str> = event
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                (!lines.is_empty()).then(|| lines.join("\n"))
            })
            .collect()
    }
}

/// `GET url`.
pub async fn get(url: &str) -> Result<HttpResponse> {
    request(Method::GET, url, &[], Bytes::new()).await
}

/// `POST url` with a JSON body and extra headers.
pub async fn post_json(
    url: &str,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    request(Method::POST, url, &all, Bytes::from(body.to_string())).await
}

/// Sends a request and buffers the whole response.
pub async fn request(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<HttpResponse> {
    let resp = send(method, url, headers, body).await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading body")?
        .to_bytes();
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// Sends a request and records each response chunk with its arrival time.
pub async fn request_streamed(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<StreamedResponse> {
    let started = Instant::now();
    let resp = send(method, url, headers, body).await?;
    let headers_at = started.elapsed();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.into_body();
    let mut chunks = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.context("reading body frame")?;
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                chunks.push(Chunk {
                    at: started.elapsed(),
                    data,
                });
            }
        }
    }
    Ok(StreamedResponse {
        status,
        headers,
        headers_at,
        chunks,
    })
}

/// `POST url` with a JSON body, read as a stream.
pub async fn post_json_streamed(
    url: &str,
    body: &serde_json::Value,
    headers: &[(&str, &str)],
) -> Result<StreamedResponse> {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    request_streamed(Method::POST, url, &all, Bytes::from(body.to_string())).await
}

async fn send(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<hyper::Response<Incoming>> {
    let uri: Uri = url.parse().with_context(|| format!("bad URL {url}"))?;
    let authority = uri
        .authority()
        .ok_or_else(|| anyhow!("URL without host: {url}"))?
        .clone();
    let port = uri.port_u16().unwrap_or(80);
    let stream = TcpStream::connect((authority.host(), port))
        .await
        .with_context(|| format!("connecting to {authority}"))?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .body(Full::new(body))?;
    let h = req.headers_mut();
    h.insert(
        hyper::header::HOST,
        HeaderValue::from_str(authority.as_str())?,
    );
    for (k, v) in headers {
        h.append(
            HeaderName::from_bytes(k.as_bytes())?,
            HeaderValue::from_str(v)?,
        );
    }
    sender
        .send_request(req)
        .await
        .with_context(|| format!("sending to {url}"))
}
