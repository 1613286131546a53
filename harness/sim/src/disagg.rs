//! The decode replica's sidecar for prefill/decode disaggregation.
//!
//! A request that arrives with `x-prefiller-host-port: ip:port` (set by the gateway's
//! picker beside the destination) is disaggregated as llm-d's routing sidecar does it:
//!
//! 1. the decode replica (this one) sends the request to the named replica over real HTTP
//!    as a prefill: the same body with `max_tokens: 1` (and `max_completion_tokens`, if
//!    given), `stream: false` and no `stream_options`, and without the prefiller header, so
//!    the prefill replica's engine really computes the prompt (queueing behind its own load)
//!    and its prefix cache holds it afterwards;
//! 2. once that answers 200, it waits the KV-transfer time (simulated:
//!    `kv_transfer_base_ms + kv_transfer_ms_per_1k_tokens × prompt tokens ÷ 1000`, divided
//!    by the time scale in real time);
//! 3. it imports the prompt's full blocks into its own prefix cache
//!    ([`crate::engine::Engine::import_prefix`]) and submits the request, which therefore
//!    computes only its last partial block before decoding.
//!
//! So the client's time to first token is honestly the sum of the remote prefill (its
//! queue and compute), the transfer, and the decode replica's own admission. A prefill
//! that fails (unreachable, non-200) is logged in the response headers and the request is
//! prefilled locally, as if no prefiller had been named. A prefiller naming this replica
//! itself is ignored.
//!
//! Every completion response says who did what: `x-sim-prefilled-by` and
//! `x-sim-decoded-by` (`ip:port` of the replicas; both this replica when not
//! disaggregated), and for a disaggregated request `x-sim-remote-prefill-ms` (the prefill
//! call's wall time) and `x-sim-kv-transfer-ms` (simulated).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

use super::config::SimConfig;
use super::engine::BlockHash;
use super::prompt::ApiKind;
use super::server::Replica;

/// Request header naming the replica that prefills the prompt (`ip:port`).
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// Response header: the replica that computed the prompt.
pub const PREFILLED_BY_HEADER: &str = "x-sim-prefilled-by";
/// Response header: the replica that generated the completion.
pub const DECODED_BY_HEADER: &str = "x-sim-decoded-by";
/// Response header: the remote prefill call's wall time, ms.
pub const REMOTE_PREFILL_MS_HEADER: &str = "x-sim-remote-prefill-ms";
/// Response header: the simulated KV-transfer time, ms.
pub const KV_TRANSFER_MS_HEADER: &str = "x-sim-kv-transfer-ms";
/// Response header: why a named prefiller was not used (the prompt was prefilled locally).
pub const PREFILL_FAILED_HEADER: &str = "x-sim-prefill-failed";

/// How long a remote prefill may take before the replica prefills locally instead.
const PREFILL_TIMEOUT: Duration = Duration::from_secs(60);

/// What happened to a request's prefill.
#[derive(Debug, Clone, PartialEq)]
pub enum Prefill {
    /// Computed by this replica (no prefiller named).
    Local,
    /// Computed by `by`, then moved here.
    Remote {
        /// The prefill replica, `ip:port`.
        by: String,
        /// The prefill call's wall time, ms.
        prefill_ms: f64,
        /// The simulated KV-transfer time, ms.
        transfer_ms: f64,
    },
    /// A prefiller was named but did not prefill; computed here.
    Failed {
        /// The named prefiller.
        by: String,
        /// Why.
        reason: String,
    },
}

/// The prefiller a request names, unless it names this replica (or nothing usable).
pub fn prefiller(headers: &HeaderMap, own: SocketAddr) -> Option<String> {
    let value = headers.get(PREFILLER_HEADER)?.to_str().ok()?.trim();
    let addr: SocketAddr = value.parse().ok()?;
    (addr != own).then(|| addr.to_string())
}

/// The simulated KV-transfer time of a prompt, ms.
pub fn transfer_ms(cfg: &SimConfig, prompt_tokens: u32) -> f64 {
    (cfg.kv_transfer_base_ms + cfg.kv_transfer_ms_per_1k_tokens * f64::from(prompt_tokens) / 1e3)
        .max(0.0)
}

/// What the decode replica imports once the prefill is done.
#[derive(Debug, Clone, PartialEq)]
pub struct Import {
    /// The prompt's full blocks' hashes.
    pub blocks: Vec<BlockHash>,
    /// The sequence's bytes (the KV events' token ids), when events are published.
    pub content: Option<std::sync::Arc<[u8]>>,
    /// The adapter, if the request targets one.
    pub lora: Option<String>,
}

/// Has `prefiller` compute the prompt of `body` (a request of `kind`), waits the transfer,
/// and imports the prompt's blocks into this replica's cache (see the module doc).
pub async fn prefill_remotely(
    replica: &Replica,
    prefiller: &str,
    kind: ApiKind,
    body: &Bytes,
    prompt_tokens: u32,
    import: Import,
) -> Prefill {
    let started = Instant::now();
    let failed = |reason: String| Prefill::Failed {
        by: prefiller.to_string(),
        reason,
    };
    let prefill_body = match prefill_body(body) {
        Ok(b) => b,
        Err(e) => return failed(e),
    };
    let call = send_prefill(prefiller, kind, prefill_body);
    match tokio::time::timeout(PREFILL_TIMEOUT, call).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return failed(e),
        Err(_) => return failed(format!("no answer in {PREFILL_TIMEOUT:?}")),
    }
    let prefill_ms = started.elapsed().as_secs_f64() * 1e3;
    let transfer = transfer_ms(&replica.cfg, prompt_tokens);
    let scale = replica.cfg.time_scale.max(1e-9);
    tokio::time::sleep(Duration::from_secs_f64(transfer / 1e3 / scale)).await;
    let imported = replica
        .engine
        .import_prefix_bytes(import.blocks, import.content, import.lora)
        .await;
    if let Err(e) = imported {
        return failed(format!("import: {e}"));
    }
    Prefill::Remote {
        by: prefiller.to_string(),
        prefill_ms,
        transfer_ms: transfer,
    }
}

/// The prefill request's body: one token, not streamed.
fn prefill_body(body: &Bytes) -> Result<Bytes, String> {
    let mut v: Value = serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
    let Some(obj) = v.as_object_mut() else {
        return Err("body is not a JSON object".into());
    };
    obj.insert("max_tokens".into(), Value::from(1));
    if obj.contains_key("max_completion_tokens") {
        obj.insert("max_completion_tokens".into(), Value::from(1));
    }
    obj.insert("stream".into(), Value::Bool(false));
    obj.remove("stream_options");
    serde_json::to_vec(&v)
        .map(Bytes::from)
        .map_err(|e| format!("body: {e}"))
}

/// POSTs the prefill and reads its whole answer; any status but 200 is an error.
async fn send_prefill(prefiller: &str, kind: ApiKind, body: Bytes) -> Result<(), String> {
    let path = match kind {
        ApiKind::Chat => "/v1/chat/completions",
        ApiKind::Completions => "/v1/completions",
    };
    let stream = TcpStream::connect(prefiller)
        .await
        .map_err(|e| format!("connect {prefiller}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let conn = tokio::spawn(conn);
    let req = Request::post(path)
        .header(HOST, prefiller)
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| format!("request: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = resp.status();
    let collected = resp.into_body().collect().await;
    drop(sender);
    conn.abort();
    collected.map_err(|e| format!("answer: {e}"))?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("prefill answered {status}"))
    }
}

/// Writes the served-by headers of a completion response.
pub fn mark<B>(resp: &mut Response<B>, own: SocketAddr, prefill: &Prefill) {
    let h = resp.headers_mut();
    let own = own.to_string();
    let set = |h: &mut HeaderMap, name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    };
    set(h, DECODED_BY_HEADER, &own);
    match prefill {
        Prefill::Local => set(h, PREFILLED_BY_HEADER, &own),
        Prefill::Remote {
            by,
            prefill_ms,
            transfer_ms,
        } => {
            set(h, PREFILLED_BY_HEADER, by);
            set(h, REMOTE_PREFILL_MS_HEADER, &format!("{prefill_ms:.1}"));
            set(h, KV_TRANSFER_MS_HEADER, &format!("{transfer_ms:.1}"));
        }
        Prefill::Failed { by, reason } => {
            set(h, PREFILLED_BY_HEADER, &own);
            let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
            set(h, PREFILL_FAILED_HEADER, &format!("{by}: {reason}"));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_body_asks_for_one_unstreamed_token() {
        let body = Bytes::from_static(
            br#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":50}"#,
        );
        let v: Value = serde_json::from_slice(&prefill_body(&body).unwrap()).unwrap();
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(v["max_completion_tokens"], 1);
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn a_prefiller_naming_this_replica_or_garbage_is_ignored() {
        let own: SocketAddr = "127.0.0.2:8000".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(prefiller(&h, own), None);
        h.insert(PREFILLER_HEADER, HeaderValue::from_static("127.0.0.3:8000"));
        assert_eq!(prefiller(&h, own).as_deref(), Some("127.0.0.3:8000"));
        h.insert(PREFILLER_HEADER, HeaderValue::from_static("127.0.0.2:8000"));
        assert_eq!(prefiller(&h, own), None);
        h.insert(PREFILLER_HEADER, HeaderValue::from_static("not-an-address"));
        assert_eq!(prefiller(&h, own), None);
    }

    #[test]
    fn transfer_time_grows_with_the_prompt() {
        let cfg = SimConfig::default();
        assert_eq!(transfer_ms(&cfg, 0), 1.0);
        assert_eq!(transfer_ms(&cfg, 4000), 21.0);
    }
}
