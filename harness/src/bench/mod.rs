//! The benchmarks behind `cargo xtask bench …` and `cargo xtask demo`: every number the
//! issues ask for, measured through a real Envoy in one run, as ratios.
//!
//! - [`calibration`]: the simulator calibration (4 replicas × 160k tokens of KV,
//!   16k tokens/s prefill) and its multi-turn workload (64 conversations growing to ~8k
//!   tokens over 6 turns, concurrency 16), run through one or more gateway stacks on one
//!   shared simulated pool: the demo, `bench ttft` and `bench affinity`.
//!   [`columns`] holds a run's results and renders them; [`cli`] parses the shared flags.
//! - [`hotspot`]: the demo's second scenario: one replica kept full of long-context
//!   requests, the calibration's chat workload through `/rr` and through the picker.
//! - [`tenants`]: the demo's tenant scenario: two tenants with token quotas on one pool,
//!   through the gateway and through `/rr`, with the billing log's totals per tenant.
//! - [`canary`]: the demo's canary scenario: a 10% canary build through a model rewrite,
//!   split per request and per conversation, then rolled back under load.
//! - [`closed_loop`]: a fixed-concurrency keep-alive HTTP/1.1 client measuring requests/s
//!   and latency.
//! - [`overhead`]: `bench overhead`: requests/s and latency through Envoy with no gateway
//!   filter, with the Wasm filters and with the native filters (each also with tenancy:
//!   auth, quota and usage stages), in interleaved rounds, plus streamed windows for
//!   first-chunk latency, in front of a backend that answers at once
//!   ([`overhead::backend`]); [`overhead_table`] renders its report.
//! - [`flow`]: `bench flow`: flow control's dispatch rate at saturation (in process) and
//!   Envoy's memory per queued request, through each flavour.
//! - [`lora`]: `bench lora`: adapter loads per 1,000 requests with more adapters than
//!   slots per replica, through `/rr` and through the picker with the LoRA scorer.
//! - [`replicas`]: `bench replicas`: the calibration workload through 1, 2 and 4 gateway
//!   replicas (Envoy processes, each with its own picker state) with each turn on a new
//!   connection to any of them, as behind an L4 balancer: hit ratio and TTFT against one.
//! - [`pd`]: `bench pd`: prefill/decode disaggregation against aggregated serving on a
//!   long-prompt workload: TTFT p50/p99 and throughput through the picker, PD vs no PD.
//! - [`logic`]: the filters' parse and hash work per request, timed in-process, to split a
//!   flavour's added cost between the filter logic and Envoy around it.
//! - [`report`]: small formatting helpers shared by the tables; [`html`]: the demo's HTML
//!   report (inline SVG charts, readable offline).
//! - [`soak`]: `bench soak` (minutes of multi-turn load with replica kills, client aborts
//!   and hostile requests, watching Envoy's memory) and `bench memory` (the most memory one
//!   request can make Envoy take).

pub mod calibration;
pub mod canary;
pub mod cli;
pub mod closed_loop;
pub mod clusters;
pub mod columns;
pub mod flow;
pub mod hotspot;
pub mod html;
pub mod logic;
pub mod lora;
pub mod overhead;
pub mod overhead_table;
pub mod pd;
pub mod pressure;
pub mod profile;
pub mod replicas;
pub mod report;
pub mod soak;
pub mod tenants;
