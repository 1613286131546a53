//! The module's exports: initialisation, the allocator, the configuration check and the
//! request headers. Nothing else is exported, so Envoy enters this VM once per request
//! (crate doc).

use infergate_wasm_abi::{header_edits, hostcalls, memory, Action, BufferType, LogLevel};

extern "C" {
    fn __wasm_call_ctors();
}

/// Module initialisation: static constructors.
#[no_mangle]
pub extern "C" fn _initialize() {
    // SAFETY: the linker-generated constructor runner, called once, before anything else.
    unsafe {
        __wasm_call_ctors();
    }
}

/// The ABI version this module speaks.
#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// A block of `size` bytes for the host to write a returned value into.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    memory::allocate(size)
}

/// The plugin configuration arrived; false refuses it (Envoy then rejects the plugin), with
/// the reason in Envoy's log.
#[no_mangle]
pub extern "C" fn proxy_on_configure(_root_context_id: u32, _configuration_size: usize) -> u32 {
    let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .ok()
        .flatten()
        .unwrap_or_default();
    match crate::check_config(&bytes) {
        Ok(()) => 1,
        Err(e) => {
            let _ = hostcalls::log(LogLevel::Critical, &format!("infergate: {e}"));
            0
        }
    }
}

/// A request's headers: apply the router's edits, then go on.
#[no_mangle]
pub extern "C" fn proxy_on_request_headers(
    _context_id: u32,
    _num_headers: usize,
    _end_of_stream: u32,
) -> u32 {
    header_edits::apply_pending();
    Action::Continue as u32
}
