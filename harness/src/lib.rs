//! Everything that runs the gateway for tests, benchmarks and demos: the real-Envoy
//! launcher, the benchmarks, `explain` and `render` (the user's Kubernetes objects as a
//! gateway's configuration), over the engine simulator (`infergate-sim`) and the load
//! generator (`infergate-load`). Its binaries: `infergate` (explain, render) and
//! `infergate-bench` (what `cargo xtask up|demo|bench` runs).
pub mod artefacts;
pub mod bench;
pub mod explain;
pub mod launch;
pub mod render;

// The simulator and the load generator are crates of their own (`harness/sim`,
// `harness/load`), so a change to one rebuilds neither the other nor their binaries; the
// launcher, the benchmarks and the tests reach them under their old paths.
pub use infergate_load as load;
pub use infergate_sim as sim;
