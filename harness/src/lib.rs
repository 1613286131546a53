//! Everything that runs the gateway for tests, benchmarks and demos: the engine simulator,
//! the load generator, the real-Envoy launcher, the benchmarks and `explain`. Its binaries:
//! `infergate-sim`, `infergate-load`, `infergate` (explain) and `infergate-bench` (what
//! `cargo xtask up|demo|bench` runs).
pub mod artefacts;
pub mod bench;
pub mod explain;
pub mod launch;
pub mod load;
pub mod sim;
