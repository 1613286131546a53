//! [`Host`]: load a proxy-wasm module, start it, configure plugins, drive time and HTTP calls.
//!
//! One `Host` is one VM instance (Envoy runs one per worker thread per `vm_id`). Several
//! plugins (root contexts, each with its root id and configuration) can live in one host, as
//! several filters sharing a `vm_id` do in Envoy; several hosts can share a [`SharedData`]
//! scope, as a singleton service VM and the worker VMs of the same `vm_id` do.
//!
//! Time is the test's: it only moves with [`Host::set_time_ms`] / [`Host::advance_time_ms`],
//! and advancing fires the ticks and HTTP-call timeouts that fall due, in order.

use crate::abi::Status;
use crate::builder::HostBuilder;
use crate::runtime::Runtime;
use crate::shared::SharedData;
use crate::state::{
    ForeignCall, HostState, HostcallFault, HttpCall, HttpCallResponse, LogLine, Metric, RootState,
    StreamState,
};
use crate::stream::HttpStream;
use anyhow::{anyhow, bail, Result};
use std::cell::{RefCell, RefMut};
use std::path::Path;
use std::rc::Rc;

/// A proxy-wasm module instance driven by a test.
#[derive(Clone)]
pub struct Host {
    pub(crate) runtime: Rc<RefCell<Runtime>>,
}

impl Host {
    /// Options for a host.
    pub fn builder() -> HostBuilder {
        HostBuilder::default()
    }

    /// Loads the module at `path` with default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Host> {
        HostBuilder::default().load(path)
    }

    pub(crate) fn from_runtime(runtime: Rc<RefCell<Runtime>>) -> Self {
        Self { runtime }
    }

    pub(crate) fn rt(&self) -> Result<RefMut<'_, Runtime>> {
        self.runtime
            .try_borrow_mut()
            .map_err(|_| anyhow!("the host is already busy (re-entrant use from a callback?)"))
    }

    fn state<T>(&self, f: impl FnOnce(&HostState) -> T) -> T {
        // Inspection never overlaps a callback (callbacks run inside `rt()` and return).
        match self.runtime.try_borrow() {
            Ok(rt) => f(rt.store.data()),
            Err(_) => f(&HostState::new(String::new(), SharedData::new())),
        }
    }

    fn state_mut<T>(&self, f: impl FnOnce(&mut HostState) -> T) -> Result<T> {
        Ok(f(self.rt()?.store.data_mut()))
    }

    /// Runs the module's initialisation (`_initialize`, else `_start`). Idempotent.
    pub fn start_vm(&self) -> Result<()> {
        let mut rt = self.rt()?;
        if rt.started {
            return Ok(());
        }
        rt.started = true;
        if let Some(f) = rt.exports.initialize.clone() {
            rt.call("_initialize", 0, |s| f.call(s, ()))?;
        } else if let Some(f) = rt.exports.start.clone() {
            rt.call("_start", 0, |s| f.call(s, ()))?;
        }
        Ok(())
    }

    /// Creates a plugin (root context) with this root id and configuration, runs
    /// `proxy_on_vm_start` and `proxy_on_configure` on it, and returns its context id.
    /// Fails when either returns false.
    pub fn configure_plugin(&self, root_id: &str, config: impl AsRef<[u8]>) -> Result<u32> {
        self.start_vm()?;
        let mut rt = self.rt()?;
        let state = rt.store.data_mut();
        state.last_context_id += 1;
        let id = state.last_context_id;
        state.roots.insert(
            id,
            RootState {
                root_id: root_id.to_string(),
                ..RootState::default()
            },
        );
        let vm_config_len = u32::try_from(state.vm_config.len()).unwrap_or(u32::MAX);
        if let Some(f) = rt.exports.context_create.clone() {
            rt.call("proxy_on_context_create", id, |s| f.call(s, (id, 0)))?;
        }
        if let Some(f) = rt.exports.vm_start.clone() {
            if rt.call("proxy_on_vm_start", id, |s| f.call(s, (id, vm_config_len)))? == 0 {
                bail!("proxy_on_vm_start returned false for root `{root_id}`");
            }
        }
        let config = config.as_ref().to_vec();
        let config_len = u32::try_from(config.len()).unwrap_or(u32::MAX);
        rt.store.data_mut().plugin_config = Some(config);
        let configured = match rt.exports.configure.clone() {
            Some(f) => rt.call("proxy_on_configure", id, |s| f.call(s, (id, config_len))),
            None => Ok(1),
        };
        rt.store.data_mut().plugin_config = None;
        if configured? == 0 {
            bail!("proxy_on_configure returned false for root `{root_id}`");
        }
        Ok(id)
    }

    /// Removes the plugin `root_context_id`, as Envoy does when a configuration update
    /// replaces it: `proxy_on_done`, then `proxy_on_delete`; it ticks no more.
    pub fn remove_plugin(&self, root_context_id: u32) -> Result<()> {
        let mut rt = self.rt()?;
        if !rt.store.data_mut().roots.contains_key(&root_context_id) {
            bail!("no plugin {root_context_id}");
        }
        if let Some(f) = rt.exports.done.clone() {
            rt.call("proxy_on_done", root_context_id, |s| {
                f.call(s, root_context_id)
            })?;
        }
        if let Some(f) = rt.exports.delete.clone() {
            rt.call("proxy_on_delete", root_context_id, |s| {
                f.call(s, root_context_id)
            })?;
        }
        rt.store.data_mut().roots.remove(&root_context_id);
        Ok(())
    }

    /// The context id of the plugin configured with `root_id`.
    pub fn root_context_id(&self, root_id: &str) -> Option<u32> {
        self.state(|s| {
            s.roots
                .iter()
                .find(|(_, r)| r.root_id == root_id)
                .map(|(id, _)| *id)
        })
    }

    /// A new HTTP stream on the only configured plugin.
    pub fn new_http_stream(&self) -> Result<HttpStream> {
        let roots: Vec<u32> = self.state(|s| s.roots.keys().copied().collect());
        match roots.as_slice() {
            [only] => self.new_http_stream_on(*only),
            [] => bail!("no plugin configured: call configure_plugin first"),
            _ => bail!("several plugins configured: use new_http_stream_on(root_context_id)"),
        }
    }

    /// A new HTTP stream on the plugin whose root context id is `root_context_id`.
    pub fn new_http_stream_on(&self, root_context_id: u32) -> Result<HttpStream> {
        let mut rt = self.rt()?;
        let state = rt.store.data_mut();
        if !state.roots.contains_key(&root_context_id) {
            bail!("no root context {root_context_id}");
        }
        state.last_context_id += 1;
        let id = state.last_context_id;
        state.streams.insert(
            id,
            StreamState {
                root_context_id,
                ..StreamState::default()
            },
        );
        if let Some(f) = rt.exports.context_create.clone() {
            rt.call("proxy_on_context_create", id, |s| {
                f.call(s, (id, root_context_id))
            })?;
        }
        Ok(HttpStream::new(self.clone(), id))
    }

    /// Calls `proxy_on_tick` on every plugin that set a tick period, now.
    pub fn tick(&self) -> Result<()> {
        let now = self.now_ms();
        let due: Vec<(u32, u32)> = self.state(|s| {
            s.roots
                .iter()
                .filter(|(_, r)| r.tick_period_ms > 0)
                .map(|(id, r)| (*id, r.tick_period_ms))
                .collect()
        });
        for (id, period) in due {
            self.fire_tick(id, now.saturating_add(u64::from(period)))?;
        }
        Ok(())
    }

    fn fire_tick(&self, root: u32, next_ms: u64) -> Result<()> {
        let mut rt = self.rt()?;
        if let Some(r) = rt.store.data_mut().roots.get_mut(&root) {
            r.next_tick_ms = next_ms;
        }
        if let Some(f) = rt.exports.tick.clone() {
            rt.call("proxy_on_tick", root, |s| f.call(s, root))?;
        }
        Ok(())
    }

    /// Calls `proxy_on_queue_ready` for every shared queue this host's roots registered
    /// that holds data (Envoy posts it to the registering thread when data arrives);
    /// returns how many it notified. Several hosts sharing one [`SharedData`] exchange
    /// queue messages by calling this on each in turn.
    pub fn deliver_queues(&self) -> Result<usize> {
        let ready = self.state(|s| s.shared.ready_queues(s.host_id));
        let mut rt = self.rt()?;
        let Some(f) = rt.exports.queue_ready.clone() else {
            return Ok(0);
        };
        for (queue, root) in &ready {
            let (queue, root) = (*queue, *root);
            rt.call("proxy_on_queue_ready", root, |s| f.call(s, (root, queue)))?;
        }
        Ok(ready.len())
    }

    /// The tick period a plugin set, in milliseconds (0: none).
    pub fn tick_period_ms(&self, root_context_id: u32) -> Option<u32> {
        self.state(|s| s.roots.get(&root_context_id).map(|r| r.tick_period_ms))
    }

    /// Host time in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.state(HostState::now_ms)
    }

    /// Sets host time without firing anything.
    pub fn set_time_ms(&self, ms: u64) -> Result<()> {
        self.state_mut(|s| s.now_ns = ms.saturating_mul(1_000_000))
    }

    /// Moves time forward by `ms`, firing every tick and HTTP-call timeout that falls due,
    /// in time order (a timeout before a tick due at the same instant).
    pub fn advance_time_ms(&self, ms: u64) -> Result<()> {
        let target = self.now_ms().saturating_add(ms);
        loop {
            let next_timeout = self.state(|s| {
                s.pending_calls
                    .iter()
                    .filter(|c| c.timeout_ms > 0)
                    .map(|c| {
                        (
                            c.sent_at_ms.saturating_add(u64::from(c.timeout_ms)),
                            c.token,
                        )
                    })
                    .min()
            });
            let next_tick = self.state(|s| {
                s.roots
                    .iter()
                    .filter(|(_, r)| r.tick_period_ms > 0)
                    .map(|(id, r)| (r.next_tick_ms, *id, r.tick_period_ms))
                    .min()
            });
            match (next_timeout, next_tick) {
                (Some((at, token)), tick) if at <= target && tick.is_none_or(|t| at <= t.0) => {
                    self.set_time_ms(at)?;
                    self.fail_http_call(token)?;
                }
                (_, Some((at, root, period))) if at <= target => {
                    self.set_time_ms(at)?;
                    self.fire_tick(root, at.saturating_add(u64::from(period)))?;
                }
                _ => break,
            }
        }
        self.set_time_ms(target)
    }

    /// HTTP calls waiting for an answer, in dispatch order.
    pub fn pending_http_calls(&self) -> Vec<HttpCall> {
        self.state(|s| s.pending_calls.clone())
    }

    /// HTTP calls dropped because the context that made them finished first.
    pub fn cancelled_http_calls(&self) -> Vec<HttpCall> {
        self.state(|s| s.cancelled_calls.clone())
    }

    /// Answers a pending HTTP call: `proxy_on_http_call_response` runs now.
    pub fn respond_http_call(&self, token: u32, mut response: HttpCallResponse) -> Result<()> {
        if !response.headers.contains(":status") {
            response.headers.add(":status", b"200");
        }
        self.deliver(token, Some(response))
    }

    /// Fails a pending HTTP call (reset or timeout): the module sees zero headers.
    pub fn fail_http_call(&self, token: u32) -> Result<()> {
        self.deliver(token, None)
    }

    fn deliver(&self, token: u32, response: Option<HttpCallResponse>) -> Result<()> {
        let mut rt = self.rt()?;
        let state = rt.store.data_mut();
        let index = state
            .pending_calls
            .iter()
            .position(|c| c.token == token)
            .ok_or_else(|| anyhow!("no pending HTTP call with token {token}"))?;
        let call = state.pending_calls.remove(index);
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let (headers, body, trailers) = response.as_ref().map_or((0, 0, 0), |r| {
            (
                count(r.headers.len()),
                count(r.body.len()),
                count(r.trailers.len()),
            )
        });
        state.call_failed = response.is_none();
        state.call_response = response;
        let result = match rt.exports.http_call_response.clone() {
            Some(f) => rt.call("proxy_on_http_call_response", call.context_id, |s| {
                f.call(s, (call.context_id, token, headers, body, trailers))
            }),
            None => Ok(()),
        };
        rt.store.data_mut().call_response = None;
        rt.store.data_mut().call_failed = false;
        result
    }

    /// Loses a pending HTTP call: the host never answers it (no response, no timeout), as
    /// when a callout's answer goes missing.
    pub fn drop_http_call(&self, token: u32) -> Result<()> {
        let mut rt = self.rt()?;
        let calls = &mut rt.store.data_mut().pending_calls;
        let before = calls.len();
        calls.retain(|c| c.token != token);
        if calls.len() == before {
            bail!("no pending HTTP call with token {token}");
        }
        Ok(())
    }

    /// From now on hostcall `name` (e.g. `proxy_get_header_map_value`) answers `fault`
    /// instead of doing its work, until [`Host::clear_faults`].
    pub fn inject_fault(&self, name: &str, fault: HostcallFault) -> Result<()> {
        self.state_mut(|s| {
            s.faults.insert(name.to_string(), fault);
        })
    }

    /// Hostcall `name` answers status `status` from now on (see [`Host::inject_fault`]).
    pub fn inject_status(&self, name: &str, status: Status) -> Result<()> {
        self.inject_fault(name, HostcallFault::Status(status.code()))
    }

    /// Every hostcall behaves normally again.
    pub fn clear_faults(&self) -> Result<()> {
        self.state_mut(|s| s.faults.clear())
    }

    /// The shared-data scope of this host.
    pub fn shared_data(&self) -> SharedData {
        self.state(|s| s.shared.clone())
    }

    /// Every metric the module defined.
    pub fn metrics(&self) -> Vec<Metric> {
        self.state(|s| s.metrics.clone())
    }

    /// Current value of the metric named `name`.
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.state(|s| s.metrics.iter().find(|m| m.name == name).map(|m| m.value))
    }

    /// Every log line so far (proxy_log and WASI stdout/stderr).
    pub fn logs(&self) -> Vec<LogLine> {
        self.state(|s| s.logs.clone())
    }

    /// Whether some log message contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.state(|s| s.logs.iter().any(|l| l.message.contains(needle)))
    }

    /// Forgets the log lines so far.
    pub fn clear_logs(&self) -> Result<()> {
        self.state_mut(|s| s.logs.clear())
    }

    /// A host-level property (set by the test, or by the module from a root context).
    pub fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let key: Vec<String> = path.iter().map(|p| p.to_string()).collect();
        self.state(|s| s.properties.get(&key).cloned())
    }

    /// Sets a host-level property the module can read.
    pub fn set_property(&self, path: &[&str], value: impl Into<Vec<u8>>) -> Result<()> {
        let key: Vec<String> = path.iter().map(|p| p.to_string()).collect();
        let value = value.into();
        self.state_mut(|s| {
            s.properties.insert(key, value);
        })
    }

    /// Registers a foreign function the module can call by name.
    pub fn register_foreign_function(
        &self,
        name: &str,
        function: impl FnMut(&[u8]) -> Result<Vec<u8>, Status> + Send + 'static,
    ) -> Result<()> {
        self.state_mut(|s| {
            s.foreign_functions
                .insert(name.to_string(), Box::new(function));
        })
    }

    /// Every foreign-function call the module made.
    pub fn foreign_calls(&self) -> Vec<ForeignCall> {
        self.state(|s| s.foreign_calls.clone())
    }

    /// The state of stream `id` (also after it finished).
    pub fn stream_state(&self, id: u32) -> Option<StreamState> {
        self.state(|s| s.streams.get(&id).cloned())
    }

    /// Why the module is unusable, if it trapped.
    pub fn trapped(&self) -> Option<String> {
        self.runtime
            .try_borrow()
            .ok()
            .and_then(|rt| rt.poisoned.clone())
    }
}
