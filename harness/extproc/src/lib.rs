//! `infergate-extproc`: an Envoy external processor (`envoy.service.ext_proc.v3`) that
//! routes LLM requests the way an out-of-proxy endpoint picker does — the architecture the
//! in-proxy gateway replaces, and the second reference of `bench overhead`.
//!
//! Envoy's `ext_proc` filter streams each request to it over gRPC; it answers with the
//! routing headers (`x-gateway-destination-endpoint`, `x-gateway-base-model-name`) once the
//! body is complete, with a route-cache clear so Envoy routes on them. [`route`] holds the
//! decision (`null`: none; `parse`: the core's parse and prefix hashing first), [`service`]
//! the protocol in the `FULL_DUPLEX_STREAMED` and `BUFFERED` body modes, [`options`] the
//! command line.

pub mod options;
pub mod route;
pub mod service;

use std::net::SocketAddr;

use anyhow::{Context as _, Result};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;

pub use options::Options;
pub use route::{Mode, Router};
pub use service::Processor;

/// The largest gRPC message accepted or sent: a buffered body of the largest size the
/// benchmark sends, with room to spare (tonic's default is 4 MiB).
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Serves `processor` on `listener` until the process ends.
pub async fn serve(processor: Processor, listener: tokio::net::TcpListener) -> Result<()> {
    // Without TCP_NODELAY a small answer can wait for the peer's delayed ACK (~40 ms).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let service = ExternalProcessorServer::new(processor)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(service)
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
