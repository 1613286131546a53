//! Panic containment at the FFI boundary.
//!
//! A Rust panic unwinding into Envoy's C++ frames is undefined behaviour (in practice an
//! abort that takes every connection down). Every exported hook therefore runs its body inside
//! [`catch`], which turns a panic into `None` after logging it through Envoy's logger; the hook
//! then fails only its own request closed (500, or a reset once the response has started) and
//! returns a value that keeps Envoy running.
//!
//! The panic message is captured by a process-wide panic hook (installed once from
//! `envoy_dynamic_module_on_program_init`) into a thread-local, because the payload alone
//! carries no location.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    /// Message and location of the last panic on this thread, set by our panic hook.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs the panic hook that records panic messages for [`catch`]. Idempotent.
pub fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Keep the previous hook (stderr printing) so nothing is hidden, and record the text.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let location = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let text = format!("{}{location}", payload_text(info.payload()));
            // `try_with`: the thread-local may already be gone during thread teardown.
            let _ = LAST_PANIC.try_with(|slot| {
                if let Ok(mut slot) = slot.try_borrow_mut() {
                    *slot = Some(text);
                }
            });
            previous(info);
        }));
    });
}

/// Runs `body`; on panic logs `"panic in <hook>: <message>"` at error level and returns `None`.
pub fn catch<R>(hook: &'static str, body: impl FnOnce() -> R) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => Some(value),
        Err(payload) => {
            let recorded = LAST_PANIC
                .try_with(|slot| slot.try_borrow_mut().ok().and_then(|mut s| s.take()))
                .ok()
                .flatten();
            let text = recorded.unwrap_or_else(|| payload_text(payload.as_ref()));
            crate::log::error(&format!("infergate: panic in {hook}: {text}"));
            None
        }
    }
}

/// Best-effort text of a panic payload (`&str` or `String`, which is what `panic!` produces).
fn payload_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_envoy;

    #[test]
    fn catch_returns_value_without_logging() {
        fake_envoy::reset();
        assert_eq!(catch("t", || 7), Some(7));
        assert!(fake_envoy::logs().is_empty());
    }

    #[test]
    #[allow(clippy::panic)]
    fn catch_turns_panic_into_none_and_logs_message_and_location() {
        install_panic_hook();
        fake_envoy::reset();
        let out: Option<u32> = catch("on_test_hook", || panic!("boom {}", 42));
        assert_eq!(out, None);
        let logs = fake_envoy::logs();
        assert_eq!(logs.len(), 1, "{logs:?}");
        assert!(
            logs[0].contains("panic in on_test_hook: boom 42 at "),
            "{logs:?}"
        );
        assert!(logs[0].contains("guard.rs"), "{logs:?}");
    }
}
