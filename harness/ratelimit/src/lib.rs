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
use limitador::storage::AsyncStorage;
use limitador::AsyncRateLimiterBuilder;

pub use limits::LimitTable;
pub use service::QuotaService;

/// How long a reservation holds its pre-debit at most: longer than any stream the gateway
/// serves within one window (a hold never outlives its counter's window anyway).
pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(600);

/// A service for `domain` with `table`'s limits, its counters in the Redis at `redis_url`.
pub async fn connect(
    redis_url: &str,
    table: LimitTable,
    domain: &str,
    reservation_ttl: Duration,
) -> Result<QuotaService> {
    let storage = AsyncRedisStorage::new(redis_url)
        .await
        .with_context(|| format!("connecting to Redis at {redis_url}"))?;
    let limiter =
        AsyncRateLimiterBuilder::new(AsyncStorage::with_counter_storage(Box::new(storage)))
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
