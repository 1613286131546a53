//! An HTTP/1.1 client that puts exactly the given bytes on the wire: header values with
//! bytes no HTTP library would send (control bytes, 0x80–0xFF), duplicate headers in any
//! case, a body announced by `content-length` but never finished. It reads the answer
//! until the connection closes (every request asks for `connection: close`).

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What came back: the status, the raw head, the body (de-chunked when chunked).
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl RawResponse {
    /// A header's value (the first, case-insensitive name).
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, `Null` when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// The bytes of a request: `method path`, a `host`, the `headers` in order as given, a
/// `content-length` for `body` (unless `headers` announce a length themselves) and
/// `connection: close`.
pub fn request(method: &str, path: &str, headers: &[(&[u8], &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: gateway\r\n").into_bytes();
    let announces = headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case(b"content-length"));
    for (k, v) in headers {
        out.extend_from_slice(k);
        out.extend_from_slice(b": ");
        out.extend_from_slice(v);
        out.extend_from_slice(b"\r\n");
    }
    if !announces {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"connection: close\r\n\r\n");
    out.extend_from_slice(body);
    out
}

/// A JSON `POST` of `body` to `path` with extra `headers`.
pub fn post_json(path: &str, headers: &[(&[u8], &[u8])], body: &[u8]) -> Vec<u8> {
    let mut all: Vec<(&[u8], &[u8])> = vec![(b"content-type", b"application/json")];
    all.extend_from_slice(headers);
    request("POST", path, &all, body)
}

/// Sends `bytes` to `addr` and reads until the peer closes (or `timeout` passes). The
/// request is written while the answer is read, so an early answer (413, 431) is not lost
/// to a write error. Errors name what was seen.
pub async fn exchange(
    addr: SocketAddr,
    bytes: Vec<u8>,
    timeout: Duration,
) -> Result<RawResponse, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&bytes).await;
        // Keep the write half open: shutting it would end the request early for Envoy.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(wr);
    });
    let mut got = Vec::new();
    let read = tokio::time::timeout(timeout, async {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
            if complete(&got) {
                break;
            }
        }
    })
    .await;
    writer.abort();
    if read.is_err() && !complete(&got) {
        return Err(format!(
            "no complete answer within {timeout:?}; got {} bytes: {:?}",
            got.len(),
            String::from_utf8_lossy(&got[..got.len().min(300)])
        ));
    }
    parse(&got)
}

fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

/// Whether `buf` holds a whole response (by `content-length` or the last chunk).
fn complete(buf: &[u8]) -> bool {
    let Some(end) = head_end(buf) else {
        return false;
    };
    let Ok(r) = parse_head(&buf[..end]) else {
        return false;
    };
    if let Some(len) = r
        .header("content-length")
        .and_then(|l| l.parse::<usize>().ok())
    {
        return buf.len() >= end + len;
    }
    if r.header("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        return dechunk(&buf[end..]).is_some_and(|(_, done)| done);
    }
    false
}

fn parse_head(head: &[u8]) -> Result<RawResponse, String> {
    let head = String::from_utf8_lossy(head).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {head:?}"))?;
    Ok(RawResponse {
        status,
        head,
        body: Vec::new(),
    })
}

fn parse(buf: &[u8]) -> Result<RawResponse, String> {
    let end = head_end(buf).ok_or_else(|| {
        format!(
            "connection closed after {} bytes, no response head: {:?}",
            buf.len(),
            String::from_utf8_lossy(&buf[..buf.len().min(300)])
        )
    })?;
    let mut r = parse_head(&buf[..end])?;
    let rest = &buf[end..];
    r.body = if r
        .header("transfer-encoding")
        .is_some_and(|t| t.contains("chunked"))
    {
        dechunk(rest).map(|(b, _)| b).unwrap_or_default()
    } else {
        rest.to_vec()
    };
    Ok(r)
}

/// The chunked body's data so far, and whether the last chunk was seen.
fn dechunk(mut rest: &[u8]) -> Option<(Vec<u8>, bool)> {
    let mut out = Vec::new();
    loop {
        let Some(line_end) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Some((out, false));
        };
        let size_text = String::from_utf8_lossy(&rest[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some((out, true));
        }
        let data = rest.get(line_end + 2..line_end + 2 + size);
        let Some(data) = data else {
            return Some((out, false));
        };
        out.extend_from_slice(data);
        rest = rest.get(line_end + 4 + size..).unwrap_or_default();
    }
}
