//! Tests that exercise what `wasi-run` must provide to a cargo test binary on wasm32-wasip1.

/// Adds two numbers (something for the tests to call).
pub fn add(a: u64, b: u64) -> u64 {
    a + b
}

#[cfg(test)]
mod tests {
    #[test]
    fn arithmetic() {
        assert_eq!(super::add(2, 3), 5);
    }

    #[test]
    fn relative_and_absolute_paths_resolve() {
        // cargo runs tests in the package directory.
        let relative = std::fs::read_to_string("Cargo.toml").expect("relative path");
        assert!(relative.contains("wasi-run-testbin"));
        // Absolute, with a `..` that stays inside the preopened top-level directory.
        let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it at run time");
        let absolute = std::fs::read_to_string(format!("{manifest}/../testbin/src/lib.rs"))
            .expect("absolute path");
        assert!(absolute.contains("relative_and_absolute_paths_resolve"));
    }

    #[test]
    fn failure_is_reported_when_asked() {
        assert!(
            std::env::var_os("WASI_RUN_TEST_FAIL").is_none(),
            "failing on purpose"
        );
    }
}
