//! An HTTP/2 client over cleartext with prior knowledge (h2c, no upgrade), as gRPC-style
//! and many LLM SDK clients talk to a gateway: one connection, many streams.

use super::ChannelBody;
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use infergate_harness::launch::client::HttpResponse;
use std::convert::Infallible;
use std::net::SocketAddr;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

type AnyBody = BoxBody<Bytes, Infallible>;

/// One HTTP/2 connection to `addr`.
#[derive(Clone)]
pub struct H2 {
    addr: SocketAddr,
    sender: SendRequest<AnyBody>,
}

impl H2 {
    /// Connects and completes the HTTP/2 handshake (prior knowledge).
    pub async fn connect(addr: SocketAddr) -> H2 {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        H2 { addr, sender }
    }

    /// Sends one request on a new stream; the error (a reset stream, a closed connection)
    /// is returned as text.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, HeaderValue)],
        body: impl Into<Bytes>,
    ) -> Result<Response<Incoming>, String> {
        self.send_body(method, path, headers, Full::new(body.into()).boxed())
            .await
    }

    /// Sends one request whose body is whatever `rx` yields until its sender is dropped.
    pub async fn send_streaming(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, HeaderValue)],
        rx: mpsc::Receiver<Bytes>,
    ) -> Result<Response<Incoming>, String> {
        self.send_body(method, path, headers, ChannelBody::from_channel(rx).boxed())
            .await
    }

    async fn send_body(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, HeaderValue)],
        body: AnyBody,
    ) -> Result<Response<Incoming>, String> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .body(body)
            .unwrap();
        for (k, v) in headers {
            req.headers_mut()
                .append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.clone());
        }
        let mut sender = self.sender.clone();
        sender.ready().await.map_err(|e| format!("{e:#}"))?;
        sender.send_request(req).await.map_err(|e| format!("{e:#}"))
    }

    /// A JSON `POST`, buffered.
    pub async fn post_json(
        &self,
        path: &str,
        headers: &[(&str, HeaderValue)],
        body: &serde_json::Value,
    ) -> Result<HttpResponse, String> {
        let mut all = vec![("content-type", HeaderValue::from_static("application/json"))];
        all.extend_from_slice(headers);
        let resp = self.send("POST", path, &all, body.to_string()).await?;
        collect(resp).await
    }
}

/// Reads a response whole.
pub async fn collect(resp: Response<Incoming>) -> Result<HttpResponse, String> {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{e:#}"))?
        .to_bytes();
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}
