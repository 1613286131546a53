//! `infergate-ratelimit`: the rate-limit service that shares a tenant's quotas across
//! gateway replicas.
//!
//! Every replica's Envoy runs its `ratelimit` HTTP filter against this service, which
//! speaks Envoy's global rate-limit protocol (`envoy.service.ratelimit.v3`) and keeps the
//! counters in Redis through Kuadrant's limitador engine, so every replica draws on the
//! same minute of requests and tokens. Token costs travel as `hits_addend`: the pre-debit
//! at admission (held as a limitador reservation), the tokens actually used when the
//! stream ends (committing the reservation). See [`service`] for the protocol and [`limits`]
//! for the limits derived from the platform's `TenantQuota` objects.

pub mod limits;
pub mod service;

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use limitador::reservation::ReservationLimits;
use limitador::storage::redis::AsyncRedisStorage;
use limitador::storage::{AsyncCounterStorage, AsyncStorage};
use limitador::AsyncRateLimiterBuilder;

pub use limits::LimitTable;
pub use service::QuotaService;

/// How long a reservation holds its pre-debit at most: one window ([`WINDOW_SECONDS`]).
///
/// A hold stands for tokens the window it was admitted in will be charged, and limitador
/// ends it at its counter's window end whatever it is asked for, so a longer value changes
/// nothing but what the configuration claims. A shorter one would let a hold lapse while
/// its stream still runs, admitting others against tokens that are about to be counted.
/// A stream that outlives its hold loses nothing: the settlement counts the tokens used
/// whether or not the hold is still live. And a hold nothing settles (a replica gone, a
/// settlement lost) stops counting when its window ends.
///
/// [`WINDOW_SECONDS`]: limits::WINDOW_SECONDS
pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(limits::WINDOW_SECONDS);

/// A service for `domain` with `table`'s limits, its counters in the Redis at `redis_url`;
/// `reservation_ttl` is capped at one window (see [`DEFAULT_RESERVATION_TTL`]).
pub async fn connect(
    redis_url: &str,
    table: LimitTable,
    domain: &str,
    reservation_ttl: Duration,
) -> Result<QuotaService> {
    let storage = AsyncRedisStorage::new(redis_url)
        .await
        .with_context(|| format!("connecting to Redis at {redis_url}"))?;
    over_storage(Box::new(storage), table, domain, reservation_ttl).await
}

/// A service for `domain` with `table`'s limits over any limitador counter `storage` (a
/// test's wrapper around Redis, say); `reservation_ttl` as in [`connect`].
pub async fn over_storage(
    storage: Box<dyn AsyncCounterStorage>,
    table: LimitTable,
    domain: &str,
    reservation_ttl: Duration,
) -> Result<QuotaService> {
    let reservation_ttl = reservation_ttl.min(DEFAULT_RESERVATION_TTL);
    let limiter = AsyncRateLimiterBuilder::new(AsyncStorage::with_counter_storage(storage))
        .reservation_limits(ReservationLimits {
            max_fraction: 1.0,
            max_ttl: reservation_ttl,
        })
        .build();
    QuotaService::new(limiter, table, domain, reservation_ttl).await
}

/// Serve `service` on `listener` until the process ends.
pub async fn serve(service: QuotaService, listener: tokio::net::TcpListener) -> Result<()> {
    // Without TCP_NODELAY a small answer can wait for the peer's delayed ACK (~40 ms).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(service))
        .serve_with_incoming(incoming)
        .await
        .context("serving gRPC")
}

/// The line the binary prints once it listens: `listening on IP:PORT`.
pub fn listening_line(addr: SocketAddr) -> String {
    format!("listening on {addr}")
}

/// The address in a [`listening_line`].
pub fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    line.trim().strip_prefix("listening on ")?.parse().ok()
}
