//! Everything that runs the gateway for tests, benchmarks and demos: the engine simulator,
//! the load generator, the real-Envoy launcher and the command-line tools.
pub mod bench;
pub mod explain;
pub mod launch;
pub mod load;
pub mod sim;
pub mod xtask;
