//! Load classes over real sockets: two tenants at once against the simulator (their headers
//! reach it, their tokens add up on both sides, a class that aborts mid-stream is cut), and
//! the per-class counts of 429s by reason and other statuses against a scripted server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use infergate_load::{run_classes, ClassRun, LoadClass};
use infergate_sim::{self as sim, SimConfig};
use tokio::net::TcpListener;

const FAIRNESS: &str = "x-llm-d-inference-fairness-id";

#[tokio::test]
async fn two_classes_at_once_are_reported_apart() {
    let pool = sim::start(SimConfig {
        time_scale: 20.0,
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let mut a = LoadClass::short_chats("a")
        .bearer("ka")
        .header(FAIRNESS, "a");
    a.workload.conversations = 4;
    a.workload.turns = 2;
    a.workload.max_tokens = 8;
    a.concurrency = 2;
    let mut b = LoadClass::long_batch("b", 500).header(FAIRNESS, "b");
    b.workload.conversations = 6;
    b.workload.max_tokens = 400;
    b.concurrency = 6;
    b.abort_after = Some(5);
    // Like b, with a running usage on every chunk: the client's count is the usage's.
    let mut c = b.clone().header(FAIRNESS, "c");
    c.name = "c".into();
    c.headers.retain(|(_, v)| v != "b");
    c.workload.continuous_usage = true;
    c.abort_after = Some(3);
    let run = ClassRun {
        url: pool.base_urls()[0].clone(),
        classes: vec![a, b, c],
        timeout: Duration::from_secs(60),
        progress: false,
    };
    let reports = run_classes(&run).await.unwrap();
    assert_eq!(reports.len(), 3);
    let (ra, rb) = (&reports[0], &reports[1]);
    assert_eq!((ra.name.as_str(), rb.name.as_str()), ("a", "b"));
    let sa = &ra.summary;
    assert_eq!((sa.requests, sa.ok, sa.aborted), (8, 8, 0));
    assert_eq!(sa.tokens_received, 8 * 8, "usage of every answer");
    assert!(ra.records.iter().all(|r| r.usage_seen));
    assert!(
        ra.records
            .iter()
            .all(|r| r.model.as_deref() == Some("sim-model")),
        "every record names the model that answered"
    );
    assert!(sa.ttft_p50_s > 0.0 && sa.ttft_p99_s >= sa.ttft_p50_s);
    let sb = &rb.summary;
    assert_eq!((sb.requests, sb.ok, sb.aborted), (6, 6, 6));
    for r in &rb.records {
        assert!(r.aborted && !r.usage_seen, "{r:?}");
        assert!(r.content_chunks >= 5);
        assert_eq!(r.tokens_received(), r.content_chunks);
    }
    let sc = &reports[2].summary;
    assert_eq!((sc.requests, sc.aborted), (6, 6));
    for r in &reports[2].records {
        assert!(r.usage_seen && r.content_chunks >= 3, "{r:?}");
        assert_eq!(r.completion_tokens, r.content_chunks);
        assert_eq!(r.prompt_tokens, reports[2].records[0].prompt_tokens);
    }
    // The server saw each class's header and served what each client counted.
    let mut served = std::collections::BTreeMap::new();
    let settled = async {
        loop {
            served = pool
                .served(0)
                .unwrap()
                .into_iter()
                .map(|(k, t)| (k.fairness_id, t))
                .collect();
            let cut = |k: &str| served.get(k).is_some_and(|t| t.requests_cut_off == 6);
            if cut("b") && cut("c") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), settled)
        .await
        .expect("the aborted streams reach the server's ledger");
    let ta = served["a"];
    assert_eq!(
        (ta.requests_completed, ta.completion_tokens),
        (8, sa.tokens_received)
    );
    assert_eq!(ta.prompt_tokens, sa.prompt_tokens);
    let tb = served["b"];
    assert_eq!(tb.requests_completed, 0);
    // The server sent at least what the clients read before closing.
    assert!(
        tb.cut_off_completion_tokens >= sb.tokens_received,
        "{tb:?} vs {sb:?}"
    );
    assert!(tb.cut_off_completion_tokens < 6 * 400);
    let tc = served["c"];
    assert!(tc.cut_off_completion_tokens >= sc.tokens_received);
    assert_eq!(
        tc.prompt_tokens, sc.prompt_tokens,
        "each cut stream sent its prompt's usage"
    );
}

/// Answers by bearer key: `tpm` → 429 with a drop reason, `bare` → 429 without, `down`
/// → 503, anything else → a 3-token stream with usage.
async fn scripted(
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut resp = Response::builder();
    let body = match auth.as_str() {
        "Bearer tpm" => {
            resp = resp
                .status(429)
                .header("x-llm-d-request-dropped-reason", "rejected-quota-tpm");
            r#"{"error":{"message":"tokens","type":"tokens","code":"rate_limit_exceeded"}}"#
                .to_string()
        }
        "Bearer bare" => {
            resp = resp.status(429);
            "{}".to_string()
        }
        "Bearer down" => {
            resp = resp.status(503);
            r#"{"error":{"message":"no endpoint"}}"#.to_string()
        }
        _ => {
            resp = resp.header("content-type", "text/event-stream");
            let mut s = String::new();
            for t in ["one ", "two ", "six "] {
                s.push_str(&format!(
                    "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{t}\"}}}}]}}\n\n"
                ));
            }
            s.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"total_tokens\":12,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n");
            s
        }
    };
    Ok(resp.body(Full::new(Bytes::from(body))).unwrap())
}

#[tokio::test]
async fn rejections_are_counted_per_class_by_reason() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service_fn(scripted))
                    .await;
            });
        }
    });
    let class = |name: &str, key: &str, n: u32| {
        let mut c = LoadClass::short_chats(name).bearer(key);
        c.workload.conversations = n;
        c.workload.turns = 1;
        c.concurrency = 2;
        c
    };
    let run = ClassRun {
        url: format!("http://{addr}"),
        classes: vec![
            class("fine", "ok", 4),
            class("tpm", "tpm", 3),
            class("bare", "bare", 2),
            class("down", "down", 1),
        ],
        timeout: Duration::from_secs(10),
        progress: false,
    };
    let r = run_classes(&run).await.unwrap();
    let s: Vec<_> = r.iter().map(|c| &c.summary).collect();
    assert_eq!((s[0].ok, s[0].tokens_received), (4, 12));
    assert!(s[0].rejected_429.is_empty() && s[0].other_statuses.is_empty());
    assert_eq!(s[1].ok, 0);
    assert_eq!(
        s[1].rejected_429.get("rejected-quota-tpm"),
        Some(&3),
        "{:?}",
        s[1]
    );
    assert_eq!(s[2].rejected_429.get("none"), Some(&2));
    assert_eq!(s[3].other_statuses.get("503"), Some(&1));
    assert!(s[3].rejected_429.is_empty());
    let table =
        infergate_load::class_table(&r.iter().map(|c| c.summary.clone()).collect::<Vec<_>>());
    assert!(table.contains("429 rejected-quota-tpm"), "{table}");
}
