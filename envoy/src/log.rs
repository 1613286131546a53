//! Logging through Envoy's own logger (`[dynamic_modules]` id), so module messages land in the
//! same stream, with the same level filtering, as Envoy's.

use crate::abi::{LogLevel, ModuleBuffer};

/// Logs `message` at `level` via `envoy_dynamic_module_callback_log`.
pub fn log(level: LogLevel, message: &str) {
    let buffer = ModuleBuffer::from_bytes(message.as_bytes());
    // SAFETY: `buffer` borrows `message`, which outlives the call; Envoy copies the text and
    // allows this callback from any thread.
    unsafe { crate::abi::callbacks::envoy_dynamic_module_callback_log(level, buffer) }
}

/// Logs at error level.
pub fn error(message: &str) {
    log(LogLevel::Error, message);
}

/// Logs at warn level.
pub fn warn(message: &str) {
    log(LogLevel::Warn, message);
}

/// Logs at info level.
pub fn info(message: &str) {
    log(LogLevel::Info, message);
}
