//! The instantiated module: its exported callbacks and the one place that calls into it.
//!
//! Every callback goes through [`Runtime::call`], which sets the effective context, turns a
//! trap into an error that quotes the module's last error logs (the SDK's and the product
//! module's panic hooks log at `Critical`), poisons the instance after a trap (its state can no longer be trusted, as in
//! Envoy, which would restart the VM), and afterwards applies what the module asked for
//! during the callback: continuing a paused stream, finishing a context with `proxy_done`.

use crate::abi::LogLevel;
use crate::engine::wt;
use crate::state::{Direction, HostState};
use anyhow::{anyhow, bail, Result};
use wasmtime::{Instance, Store, TypedFunc, WasmParams, WasmResults};

/// `proxy_on_http_call_response(context, token, headers, body_size, trailers)`.
type HttpCallResponseFn = TypedFunc<(u32, u32, u32, u32, u32), ()>;

/// The module's exported callbacks (each optional, as the ABI says).
pub(crate) struct Exports {
    pub initialize: Option<TypedFunc<(), ()>>,
    pub start: Option<TypedFunc<(), ()>>,
    pub context_create: Option<TypedFunc<(u32, u32), ()>>,
    pub vm_start: Option<TypedFunc<(u32, u32), u32>>,
    pub configure: Option<TypedFunc<(u32, u32), u32>>,
    pub tick: Option<TypedFunc<u32, ()>>,
    pub queue_ready: Option<TypedFunc<(u32, u32), ()>>,
    pub request_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub request_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub request_trailers: Option<TypedFunc<(u32, u32), u32>>,
    pub response_headers: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub response_body: Option<TypedFunc<(u32, u32, u32), u32>>,
    pub response_trailers: Option<TypedFunc<(u32, u32), u32>>,
    pub http_call_response: Option<HttpCallResponseFn>,
    pub done: Option<TypedFunc<u32, u32>>,
    pub log: Option<TypedFunc<u32, ()>>,
    pub delete: Option<TypedFunc<u32, ()>>,
}

fn export<P: WasmParams, R: WasmResults>(
    instance: &Instance,
    store: &mut Store<HostState>,
    name: &str,
) -> Result<Option<TypedFunc<P, R>>> {
    match instance.get_func(&mut *store, name) {
        None => Ok(None),
        Some(func) => func
            .typed::<P, R>(&*store)
            .map(Some)
            .map_err(|e| anyhow!("export `{name}` has the wrong signature: {}", wt(e))),
    }
}

impl Exports {
    pub(crate) fn resolve(instance: &Instance, store: &mut Store<HostState>) -> Result<Self> {
        Ok(Self {
            initialize: export(instance, store, "_initialize")?,
            start: export(instance, store, "_start")?,
            context_create: export(instance, store, "proxy_on_context_create")?,
            vm_start: export(instance, store, "proxy_on_vm_start")?,
            configure: export(instance, store, "proxy_on_configure")?,
            tick: export(instance, store, "proxy_on_tick")?,
            queue_ready: export(instance, store, "proxy_on_queue_ready")?,
            request_headers: export(instance, store, "proxy_on_request_headers")?,
            request_body: export(instance, store, "proxy_on_request_body")?,
            request_trailers: export(instance, store, "proxy_on_request_trailers")?,
            response_headers: export(instance, store, "proxy_on_response_headers")?,
            response_body: export(instance, store, "proxy_on_response_body")?,
            response_trailers: export(instance, store, "proxy_on_response_trailers")?,
            http_call_response: export(instance, store, "proxy_on_http_call_response")?,
            done: export(instance, store, "proxy_on_done")?,
            log: export(instance, store, "proxy_on_log")?,
            delete: export(instance, store, "proxy_on_delete")?,
        })
    }
}

/// The instance, its store and its callbacks.
pub(crate) struct Runtime {
    pub store: Store<HostState>,
    pub exports: Exports,
    pub started: bool,
    /// Why the instance is unusable (set by the first trap).
    pub poisoned: Option<String>,
}

impl Runtime {
    /// Calls into the module with `context_id` as the effective context.
    pub(crate) fn call<R>(
        &mut self,
        what: &str,
        context_id: u32,
        f: impl FnOnce(&mut Store<HostState>) -> wasmtime::Result<R>,
    ) -> Result<R> {
        if let Some(reason) = &self.poisoned {
            bail!("{what}: the module trapped earlier and cannot be used: {reason}");
        }
        self.store.data_mut().effective_context = context_id;
        let result = f(&mut self.store);
        self.store.data_mut().effective_context = 0;
        match result {
            Ok(value) => {
                self.after_callback()?;
                Ok(value)
            }
            Err(error) => {
                let errors: Vec<String> = self
                    .store
                    .data()
                    .logs
                    .iter()
                    .rev()
                    .filter(|l| l.level >= LogLevel::Error)
                    .take(5)
                    .map(|l| l.message.clone())
                    .collect();
                let reason = format!("{what} (context {context_id}) trapped: {}; module errors (latest first): {errors:?}", wt(error));
                self.poisoned = Some(reason.clone());
                Err(anyhow!(reason))
            }
        }
    }

    /// Applies the stream continuations and `proxy_done` requests made during a callback.
    fn after_callback(&mut self) -> Result<()> {
        let mut finished = Vec::new();
        let state = self.store.data_mut();
        let mut to_settle = std::mem::take(&mut state.to_settle);
        to_settle.sort_unstable();
        to_settle.dedup();
        for id in to_settle {
            let Some(stream) = state.streams.get_mut(&id) else {
                continue;
            };
            for direction in [&mut stream.request, &mut stream.response] {
                if direction.continue_requested {
                    direction.continue_requested = false;
                    release(direction);
                }
            }
            if stream.done_called && !stream.deleted {
                finished.push(id);
            }
        }
        for id in finished {
            self.finish(id)?;
        }
        Ok(())
    }

    /// Runs `proxy_on_log` and `proxy_on_delete` for a context and forgets its HTTP calls.
    pub(crate) fn finish(&mut self, id: u32) -> Result<()> {
        if let Some(stream) = self.store.data_mut().streams.get_mut(&id) {
            // Mark first: on_log may call proxy_done again, which must not recurse.
            stream.deleted = true;
        }
        if let Some(f) = self.exports.log.clone() {
            self.call("proxy_on_log", id, |s| f.call(s, id))?;
        }
        if let Some(f) = self.exports.delete.clone() {
            self.call("proxy_on_delete", id, |s| f.call(s, id))?;
        }
        // Envoy cancels a context's outstanding calls when it is destroyed.
        let state = self.store.data_mut();
        let (cancelled, kept) = std::mem::take(&mut state.pending_calls)
            .into_iter()
            .partition(|c| c.context_id == id);
        state.pending_calls = kept;
        let cancelled: Vec<_> = cancelled;
        state.cancelled_calls.extend(cancelled);
        Ok(())
    }
}

/// Forwards a direction: its headers (once) and every buffered body byte.
pub(crate) fn release(direction: &mut Direction) {
    if direction.forwarded_headers.is_none() {
        direction.forwarded_headers = direction.headers.clone();
    }
    let buffered = std::mem::take(&mut direction.buffered);
    direction.forwarded.extend_from_slice(&buffered);
}
