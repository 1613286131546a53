//! Everything that runs the gateway for tests, benchmarks and demos: the real-Envoy
//! launcher and the benchmarks, over the engine simulator (`infergate-sim`) and the load
//! generator (`infergate-load`). Its binary: `infergate-bench` (what `cargo xtask
//! up|demo|bench` runs). The gateway's configuration (templates, bootstrap, routes,
//! tenants), `render` and `explain` are the CLI's (`infergate-cli`, binary `infergate`),
//! the artefact paths `infergate-artefacts`'.
pub mod bench;
pub mod launch;

// The simulator and the load generator are crates of their own (`harness/sim`,
// `harness/load`), so a change to one rebuilds neither the other nor their binaries; the
// launcher, the benchmarks and the tests reach them under their old paths.
pub use infergate_load as load;
pub use infergate_sim as sim;
