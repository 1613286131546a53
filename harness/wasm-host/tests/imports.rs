//! Linking: unknown imports are named, a module without the proxy-wasm exports is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // helpers outside #[test] fns

use infergate_wasm_host::engine::engine;
use infergate_wasm_host::{Action, Host};
use wasmtime::Module;

fn module(wat: &str) -> Module {
    Module::new(engine(), wat).expect("valid wat")
}

#[test]
fn unknown_imports_fail_linking_with_every_name() {
    let m = module(
        r#"(module
            (import "env" "proxy_log" (func (param i32 i32 i32) (result i32)))
            (import "env" "proxy_not_in_the_abi" (func))
            (import "wasi_snapshot_preview1" "path_open" (func (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
            (memory (export "memory") 1))"#,
    );
    let err = Host::builder()
        .instantiate(&m)
        .err()
        .expect("must not link")
        .to_string();
    assert!(err.contains("env::proxy_not_in_the_abi"), "{err}");
    assert!(err.contains("wasi_snapshot_preview1::path_open"), "{err}");
    assert!(!err.contains("proxy_log"), "{err}");
}

#[test]
fn a_module_without_allocator_is_refused() {
    let m = module(r#"(module (memory (export "memory") 1))"#);
    let err = Host::builder()
        .instantiate(&m)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("proxy_on_memory_allocate"), "{err}");
}

#[test]
fn a_hand_written_module_sees_host_calls() {
    // Replaces the :path header with "/rewritten" and pauses; allocation is a bump pointer.
    let m = module(
        r#"(module
            (import "env" "proxy_replace_header_map_value" (func $replace (param i32 i32 i32 i32 i32) (result i32)))
            (memory (export "memory") 1)
            (global $next (mut i32) (i32.const 1024))
            (data (i32.const 16) ":path/rewritten")
            (func (export "proxy_on_memory_allocate") (param i32) (result i32)
                (local $p i32)
                (local.set $p (global.get $next))
                (global.set $next (i32.add (global.get $next) (local.get 0)))
                (local.get $p))
            (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32)
                (drop (call $replace (i32.const 0) (i32.const 16) (i32.const 5) (i32.const 21) (i32.const 10)))
                (i32.const 1)))"#,
    );
    let host = Host::builder().instantiate(&m).unwrap();
    host.configure_plugin("x", "").unwrap();
    let s = host.new_http_stream().unwrap();
    assert_eq!(
        s.request_headers(&[(":path", "/orig"), ("a", "b")], false)
            .unwrap(),
        Action::Pause
    );
    assert_eq!(s.request_header(":path").as_deref(), Some("/rewritten"));
    assert_eq!(s.request_header("a").as_deref(), Some("b"));
    assert_eq!(s.upstream_request_headers(), None);
}
