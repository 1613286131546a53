//! The exported bootstrap-extension hooks (`envoy_dynamic_module_on_bootstrap_extension_*`):
//! all 17 that Envoy 1.40 resolves, on the main thread. Only `scraper` is a known
//! `extension_name`; the lifecycle hooks drive [`ScraperExtension`], the rest do nothing.
//!
//! Object lifetimes: `config_new` leaks a `Box<ScraperExtension>` (dropped in
//! `config_destroy`); `extension_new` leaks a `Box<ExtensionHandle>` pointing at that config
//! (dropped in `extension_destroy`). Envoy destroys the extension before its config.

use core::ffi::c_void;

use crate::abi::{
    BootstrapConfigEnvoyPtr, BootstrapConfigModulePtr, BootstrapExtensionEnvoyPtr,
    BootstrapExtensionModulePtr, BootstrapTimerModulePtr, EnvoyBuffer, EnvoyHttpHeader,
    EventCallback,
};
use crate::guard;
use crate::scraper::ScraperExtension;

/// Our object behind `bootstrap_extension_module_ptr`: which config it belongs to.
struct ExtensionHandle {
    config: *const ScraperExtension,
}

/// # Safety
/// `ptr` must be NULL or a live pointer returned by `config_new`, used on the main thread.
unsafe fn config<'a>(ptr: BootstrapConfigModulePtr) -> Option<&'a ScraperExtension> {
    // SAFETY: per the contract; shared reference only (mutation goes through cells).
    unsafe { ptr.cast::<ScraperExtension>().as_ref() }
}

/// # Safety
/// `ptr` must be NULL or a live pointer returned by `extension_new` whose config is alive.
unsafe fn extension_config<'a>(ptr: BootstrapExtensionModulePtr) -> Option<&'a ScraperExtension> {
    // SAFETY: per the contract; Envoy keeps the config alive longer than the extension.
    unsafe {
        let handle = ptr.cast::<ExtensionHandle>().as_ref()?;
        handle.config.as_ref()
    }
}

/// Copies an Envoy array view into a slice for the duration of the hook.
///
/// # Safety
/// `ptr` must point to `len` valid elements for the duration of the hook, or be NULL.
unsafe fn slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { core::slice::from_raw_parts(ptr, len) }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_new(
    config_envoy_ptr: BootstrapConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> BootstrapConfigModulePtr {
    guard::catch("on_bootstrap_extension_config_new", || {
        // SAFETY: both buffers are valid for this hook; copied at once.
        let (name, config) = unsafe { (name.as_bytes().to_vec(), config.as_bytes().to_vec()) };
        let name = String::from_utf8_lossy(&name).into_owned();
        if name != "scraper" {
            crate::log::error(&format!(
                "infergate: unknown bootstrap extension_name `{name}` (expected scraper)"
            ));
            return core::ptr::null();
        }
        match ScraperExtension::new(config_envoy_ptr, &config) {
            Ok(ext) => Box::into_raw(Box::new(ext)).cast_const().cast(),
            Err(e) => {
                crate::log::error(&format!("infergate: scraper config rejected: {e}"));
                core::ptr::null()
            }
        }
    })
    .unwrap_or(core::ptr::null())
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_destroy(
    config_ptr: BootstrapConfigModulePtr,
) {
    let _ = guard::catch("on_bootstrap_extension_config_destroy", || {
        if !config_ptr.is_null() {
            // SAFETY: from `Box::into_raw` in config_new; Envoy destroys it once.
            drop(unsafe { Box::from_raw(config_ptr.cast_mut().cast::<ScraperExtension>()) });
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_new(
    config_ptr: BootstrapConfigModulePtr,
    _extension_envoy_ptr: BootstrapExtensionEnvoyPtr,
) -> BootstrapExtensionModulePtr {
    guard::catch("on_bootstrap_extension_new", || {
        let handle = ExtensionHandle {
            config: config_ptr.cast::<ScraperExtension>(),
        };
        Box::into_raw(Box::new(handle))
            .cast_const()
            .cast::<c_void>()
    })
    .unwrap_or(core::ptr::null())
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_server_initialized(
    _extension_envoy_ptr: BootstrapExtensionEnvoyPtr,
    extension_ptr: BootstrapExtensionModulePtr,
) {
    let _ = guard::catch("on_bootstrap_extension_server_initialized", || {
        // SAFETY: our live extension handle, main thread.
        if let Some(ext) = unsafe { extension_config(extension_ptr) } {
            ext.start();
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_worker_thread_initialized(
    _extension_envoy_ptr: BootstrapExtensionEnvoyPtr,
    _extension_ptr: BootstrapExtensionModulePtr,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_drain_started(
    _extension_envoy_ptr: BootstrapExtensionEnvoyPtr,
    _extension_ptr: BootstrapExtensionModulePtr,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_shutdown(
    _extension_envoy_ptr: BootstrapExtensionEnvoyPtr,
    extension_ptr: BootstrapExtensionModulePtr,
    completion_callback: EventCallback,
    completion_context: *mut c_void,
) {
    let _ = guard::catch("on_bootstrap_extension_shutdown", || {
        // SAFETY: our live extension handle, main thread.
        if let Some(ext) = unsafe { extension_config(extension_ptr) } {
            ext.stop();
        }
    });
    // Outside the guarded body: exactly once, whatever happened above, or Envoy waits forever.
    if let Some(done) = completion_callback {
        // SAFETY: Envoy's callback with Envoy's context, invoked once as the ABI requires.
        unsafe { done(completion_context) };
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_destroy(
    extension_ptr: BootstrapExtensionModulePtr,
) {
    let _ = guard::catch("on_bootstrap_extension_destroy", || {
        if !extension_ptr.is_null() {
            // SAFETY: from `Box::into_raw` in extension_new; destroyed once.
            drop(unsafe { Box::from_raw(extension_ptr.cast_mut().cast::<ExtensionHandle>()) });
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_timer_fired(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    config_ptr: BootstrapConfigModulePtr,
    timer_ptr: BootstrapTimerModulePtr,
) {
    let _ = guard::catch("on_bootstrap_extension_timer_fired", || {
        // SAFETY: our live config, main thread.
        if let Some(ext) = unsafe { config(config_ptr) } {
            ext.on_timer(timer_ptr);
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_http_callout_done(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    config_ptr: BootstrapConfigModulePtr,
    callout_id: u64,
    result: u32,
    headers: *const EnvoyHttpHeader,
    headers_size: usize,
    body_chunks: *const EnvoyBuffer,
    body_chunks_size: usize,
) {
    let _ = guard::catch("on_bootstrap_extension_http_callout_done", || {
        // SAFETY: our live config; Envoy's arrays are valid for this hook (NULL when empty).
        if let Some(ext) = unsafe { config(config_ptr) } {
            let headers = unsafe { slice(headers, headers_size) };
            let body = unsafe { slice(body_chunks, body_chunks_size) };
            ext.on_callout_done(callout_id, result, headers, body);
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_scheduled(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    _config_ptr: BootstrapConfigModulePtr,
    _event_id: u64,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_file_changed(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    _config_ptr: BootstrapConfigModulePtr,
    _path: EnvoyBuffer,
    _events: u32,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_admin_request(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    _config_ptr: BootstrapConfigModulePtr,
    _method: EnvoyBuffer,
    _path: EnvoyBuffer,
    _body: EnvoyBuffer,
) -> u32 {
    // No admin handler is registered, so Envoy never routes a request here.
    404
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_cluster_add_or_update(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    _config_ptr: BootstrapConfigModulePtr,
    _cluster_name: EnvoyBuffer,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_cluster_removal(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    _config_ptr: BootstrapConfigModulePtr,
    _cluster_name: EnvoyBuffer,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_listener_add_or_update(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    _config_ptr: BootstrapConfigModulePtr,
    _listener_name: EnvoyBuffer,
) {
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_bootstrap_extension_listener_removal(
    _config_envoy_ptr: BootstrapConfigEnvoyPtr,
    _config_ptr: BootstrapConfigModulePtr,
    _listener_name: EnvoyBuffer,
) {
}

#[cfg(test)]
#[path = "bootstrap_tests.rs"]
mod tests;
