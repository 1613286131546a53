//! The service against a real Redis (a `redis-server` of the test's own; skipped when
//! none is installed): admission reserves the pre-debit, settlement commits the actual
//! tokens, refusals carry the gateway's 429, and two services over one Redis (two
//! replicas' views) share the counters. A storage wrapper makes Redis fail mid-admission.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, UInt64Value};
use infergate_harness::launch::global_quotas::RedisServer;
use infergate_ratelimit::limits::{BUCKET_KEY, LIMIT_KEY, RESERVATION_KEY};
use infergate_ratelimit::service::RESERVATION_METADATA;
use infergate_ratelimit::{LimitTable, QuotaService};
use limitador::counter::Counter;
use limitador::limit::Limit;
use limitador::reservation::ReservationId;
use limitador::storage::redis::AsyncRedisStorage;
use limitador::storage::{AsyncCounterStorage, Authorization, StorageErr};
use serde_json::json;

const BUCKET: &str = "tenant-a/*";

fn table(rpm: u64, tpm: u64) -> LimitTable {
    LimitTable::from_objects(&[json!({
        "apiVersion": "mini-platform.local/v1alpha1",
        "kind": "TenantQuota",
        "metadata": {"name": "tenant-a"},
        "spec": {
            "identity": {"apiKeyHashes": [infergate_filters::tenants::sha256_hex(b"k")]},
            "limits": [{"model": "*", "rpm": rpm, "tpm": tpm}]
        }
    })])
    .unwrap()
}

fn redis() -> Option<RedisServer> {
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        // CI installs it: there a missing server is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "redis-server is not installed (apt-get install redis-server)"
        );
        eprintln!("SKIPPED: redis-server is not installed");
        return None;
    }
    Some(RedisServer::start().unwrap())
}

async fn service(redis: &RedisServer, rpm: u64, tpm: u64) -> QuotaService {
    infergate_ratelimit::connect(
        &redis.url(),
        table(rpm, tpm),
        "infergate",
        infergate_ratelimit::DEFAULT_RESERVATION_TTL,
    )
    .await
    .unwrap()
}

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..RateLimitDescriptor::default()
    }
}

/// What the gateway's filter sends at admission.
fn admission(pre_debit: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "infergate".into(),
        descriptors: vec![
            descriptor(&[(BUCKET_KEY, BUCKET), (LIMIT_KEY, "rpm")], None),
            descriptor(&[(BUCKET_KEY, BUCKET), (LIMIT_KEY, "tpm")], Some(pre_debit)),
        ],
        hits_addend: 0,
    }
}

/// What it sends when the stream is done.
fn settlement(reservation: &str, actual: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "infergate".into(),
        descriptors: vec![descriptor(
            &[
                (BUCKET_KEY, BUCKET),
                (LIMIT_KEY, "tpm"),
                (RESERVATION_KEY, reservation),
            ],
            Some(actual),
        )],
        hits_addend: 0,
    }
}

fn reservation(r: &RateLimitResponse) -> String {
    let field = &r.dynamic_metadata.as_ref().unwrap().fields[RESERVATION_METADATA];
    match &field.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("reservation {other:?}"),
    }
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

#[tokio::test]
async fn pre_debits_are_held_and_settlements_count_what_was_used() {
    let Some(redis) = redis() else { return };
    let svc = service(&redis, 1000, 300).await;
    // Two pre-debits of 120 are held; a third does not fit (240 + 120 > 300).
    let a = svc.decide(&admission(120)).await.unwrap();
    assert_eq!(a.overall_code, Code::Ok as i32);
    assert_eq!(header(&a, "x-ratelimit-limit-tokens"), Some("300"));
    assert_eq!(header(&a, "x-ratelimit-remaining-tokens"), Some("180"));
    let b = svc.decide(&admission(120)).await.unwrap();
    assert_eq!(b.overall_code, Code::Ok as i32);
    let refused = svc.decide(&admission(120)).await.unwrap();
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(
        header(&refused, "x-llm-d-request-dropped-reason"),
        Some("rejected-quota-tpm")
    );
    let retry: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    let body: serde_json::Value = serde_json::from_slice(&refused.raw_body).unwrap();
    assert_eq!(body["error"]["type"], "tokens");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(header(&refused, "content-type"), Some("application/json"));
    // The first used 20 of its 120: 20 counted, its hold released, so 120 fits again.
    let settled = svc.decide(&settlement(&reservation(&a), 20)).await.unwrap();
    assert_eq!(settled.overall_code, Code::Ok as i32);
    let c = svc.decide(&admission(120)).await.unwrap();
    assert_eq!(c.overall_code, Code::Ok as i32, "20 used + 2 × 120 held");
    assert_eq!(header(&c, "x-ratelimit-remaining-tokens"), Some("40"));
    // The second used 150 of its 120: the excess is charged too.
    svc.decide(&settlement(&reservation(&b), 150))
        .await
        .unwrap();
    svc.decide(&settlement(&reservation(&c), 120))
        .await
        .unwrap();
    // 20 + 150 + 120 = 290 used: 10 tokens left.
    let d = svc.decide(&admission(11)).await.unwrap();
    assert_eq!(d.overall_code, Code::OverLimit as i32);
    let e = svc.decide(&admission(10)).await.unwrap();
    assert_eq!(e.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn a_refusal_on_requests_spends_no_tokens_and_one_on_tokens_no_request() {
    let Some(redis) = redis() else { return };
    let svc = service(&redis, 2, 100).await;
    // Refused on tokens: no request is counted.
    let r = svc.decide(&admission(500)).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    for _ in 0..2 {
        let ok = svc.decide(&admission(10)).await.unwrap();
        assert_eq!(ok.overall_code, Code::Ok as i32);
    }
    let r = svc.decide(&admission(10)).await.unwrap();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        header(&r, "x-llm-d-request-dropped-reason"),
        Some("rejected-quota-rpm")
    );
    let body: serde_json::Value = serde_json::from_slice(&r.raw_body).unwrap();
    assert_eq!(body["error"]["type"], "requests");
}

#[tokio::test]
async fn two_services_over_one_redis_share_the_minute() {
    let Some(redis) = redis() else { return };
    let one = service(&redis, 1000, 100).await;
    let two = service(&redis, 1000, 100).await;
    let a = one.decide(&admission(60)).await.unwrap();
    assert_eq!(a.overall_code, Code::Ok as i32);
    let b = two.decide(&admission(60)).await.unwrap();
    assert_eq!(
        b.overall_code,
        Code::OverLimit as i32,
        "the other's hold counts"
    );
    one.decide(&settlement(&reservation(&a), 30)).await.unwrap();
    let c = two.decide(&admission(60)).await.unwrap();
    assert_eq!(c.overall_code, Code::Ok as i32, "30 used, 60 held");
}

#[tokio::test]
async fn other_domains_and_unknown_descriptors_are_not_limited() {
    let Some(redis) = redis() else { return };
    let svc = service(&redis, 1, 1).await;
    let mut other = admission(500);
    other.domain = "elsewhere".into();
    assert_eq!(
        svc.decide(&other).await.unwrap().overall_code,
        Code::Ok as i32
    );
    let unknown = RateLimitRequest {
        domain: "infergate".into(),
        descriptors: vec![descriptor(
            &[(BUCKET_KEY, "nobody/*"), (LIMIT_KEY, "tpm")],
            Some(9),
        )],
        hits_addend: 0,
    };
    assert_eq!(
        svc.decide(&unknown).await.unwrap().overall_code,
        Code::Ok as i32
    );
}

/// Clients admitting, serving for a while and settling at once, on two services over one
/// Redis: what they were let to use stays within the minute.
#[tokio::test]
async fn concurrent_clients_stay_within_the_minute() {
    let Some(redis) = redis() else { return };
    let services = std::sync::Arc::new([
        service(&redis, 100_000, 3000).await,
        service(&redis, 100_000, 3000).await,
    ]);
    let used = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..6 {
        let services = std::sync::Arc::clone(&services);
        let used = std::sync::Arc::clone(&used);
        clients.spawn(async move {
            let mut n = c;
            while tokio::time::Instant::now() < deadline {
                let svc = &services[n % 2];
                n += 1;
                let r = svc.decide(&admission(105)).await.unwrap();
                if r.overall_code == Code::Ok as i32 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    used.fetch_add(30, std::sync::atomic::Ordering::Relaxed);
                    svc.decide(&settlement(&reservation(&r), 30)).await.unwrap();
                } else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
    }
    while clients.join_next().await.is_some() {}
    let used = used.load(std::sync::atomic::Ordering::Relaxed);
    assert!(used <= 3000 + 105, "used {used}");
    assert!(used >= 3000 - 7 * 105, "used {used}");
}

/// Redis whose RPM counting fails while `failing` is set: its `update_counter` on an RPM
/// counter goes to a Redis that is gone (a real connection error); everything else to the
/// live one.
struct RpmCountFails {
    live: AsyncRedisStorage,
    gone: AsyncRedisStorage,
    failing: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl AsyncCounterStorage for RpmCountFails {
    async fn is_within_limits(&self, counter: &Counter, delta: u64) -> Result<bool, StorageErr> {
        self.live.is_within_limits(counter, delta).await
    }
    async fn update_counter(&self, counter: &Counter, delta: u64) -> Result<(), StorageErr> {
        let rpm = counter.limit().name().is_some_and(|n| n.ends_with(" rpm"));
        if rpm && self.failing.load(Ordering::SeqCst) {
            return self.gone.update_counter(counter, delta).await;
        }
        self.live.update_counter(counter, delta).await
    }
    async fn check<'a>(
        &self,
        counters: &mut Vec<Counter>,
        delta: u64,
    ) -> Result<Authorization, StorageErr> {
        self.live.check(counters, delta).await
    }
    async fn check_and_update<'a>(
        &self,
        counters: &mut Vec<Counter>,
        delta: u64,
    ) -> Result<Authorization, StorageErr> {
        self.live.check_and_update(counters, delta).await
    }
    async fn get_counters(
        &self,
        limits: &HashSet<Arc<Limit>>,
    ) -> Result<HashSet<Counter>, StorageErr> {
        self.live.get_counters(limits).await
    }
    async fn delete_counters(&self, limits: &HashSet<Arc<Limit>>) -> Result<(), StorageErr> {
        self.live.delete_counters(limits).await
    }
    async fn clear(&self) -> Result<(), StorageErr> {
        self.live.clear().await
    }
    async fn reserve(
        &self,
        counters: &mut Vec<Counter>,
        reservation_id: &ReservationId,
        check_amount: u64,
        hold_amount: u64,
        ttl: Duration,
    ) -> Result<Authorization, StorageErr> {
        self.live
            .reserve(counters, reservation_id, check_amount, hold_amount, ttl)
            .await
    }
    async fn release_reservation(
        &self,
        counters: &[Counter],
        reservation_id: &ReservationId,
    ) -> Result<bool, StorageErr> {
        self.live
            .release_reservation(counters, reservation_id)
            .await
    }
}

/// Redis fails after the pre-debit is held (counting the request): the admission is an
/// error (Envoy lets the request through, with no reservation id to settle), and the hold
/// is given back rather than counting against the tenant until its window ends.
#[tokio::test]
async fn an_admission_failing_after_its_hold_gives_the_hold_back() {
    let Some(redis) = redis() else { return };
    let Some(doomed) = self::redis() else { return };
    let gone = AsyncRedisStorage::new(&doomed.url()).await.unwrap();
    drop(doomed);
    let failing = Arc::new(AtomicBool::new(true));
    let storage = RpmCountFails {
        live: AsyncRedisStorage::new(&redis.url()).await.unwrap(),
        gone,
        failing: Arc::clone(&failing),
    };
    let svc = infergate_ratelimit::over_storage(
        Box::new(storage),
        table(1000, 300),
        "infergate",
        infergate_ratelimit::DEFAULT_RESERVATION_TTL,
    )
    .await
    .unwrap();
    let error = svc.decide(&admission(200)).await.unwrap_err();
    assert!(error.contains("counting on tenant-a/*"), "{error}");
    failing.store(false, Ordering::SeqCst);
    // The whole minute is still there: the failed admission holds nothing.
    let full = svc.decide(&admission(300)).await.unwrap();
    assert_eq!(full.overall_code, Code::Ok as i32, "{full:?}");
    assert_eq!(header(&full, "x-ratelimit-remaining-tokens"), Some("0"));
}
