//! The test build's owner trap: a request carrying [`TRAP_HEADER`] makes the Wasm VM that
//! holds the owner's lease trap at its next tick (the module's `test-stages` feature).

use infergate_harness::launch::Flavor;

/// The header that asks the owner's VM to trap.
pub const TRAP_HEADER: &str = "x-infergate-test-trap-owner";

/// Whether the Wasm module under test is a build with the test stages (the trap header).
pub fn has_test_stages() -> bool {
    Flavor::Wasm
        .artefact()
        .and_then(|p| std::fs::read(p).ok())
        .is_some_and(|bytes| {
            bytes
                .windows(TRAP_HEADER.len())
                .any(|w| w == TRAP_HEADER.as_bytes())
        })
}
