//! [`HostBuilder`]: the options of a [`Host`] (VM id and configuration, shared-data scope,
//! environment, known clusters, start time, random seed) and its instantiation: linking the
//! imports (every missing one is named in the error), then resolving memory, allocator and
//! callbacks.

use crate::engine::{engine, load_module, wt};
use crate::host::Host;
use crate::hostcalls;
use crate::runtime::{Exports, Runtime};
use crate::shared::SharedData;
use crate::state::HostState;
use anyhow::{anyhow, bail, Context as _, Result};
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use wasmtime::{Linker, Module, Store};

/// Options for building a [`Host`].
#[derive(Debug, Clone, Default)]
pub struct HostBuilder {
    vm_id: String,
    vm_config: Vec<u8>,
    shared: Option<SharedData>,
    env: Vec<(String, String)>,
    clusters: Option<Vec<String>>,
    time_ms: Option<u64>,
    random_seed: Option<u64>,
}

impl HostBuilder {
    /// The VM id (`plugin_vm_id`); default empty.
    pub fn vm_id(mut self, vm_id: &str) -> Self {
        self.vm_id = vm_id.to_string();
        self
    }

    /// The VM configuration passed to `proxy_on_vm_start`.
    pub fn vm_config(mut self, config: impl Into<Vec<u8>>) -> Self {
        self.vm_config = config.into();
        self
    }

    /// Shares this shared-data scope (same `vm_id` in Envoy terms).
    pub fn shared_data(mut self, shared: &SharedData) -> Self {
        self.shared = Some(shared.clone());
        self
    }

    /// Adds an environment variable the module sees through WASI.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Restricts `proxy_http_call` to these upstreams (others get `BadArgument`, like an
    /// unknown Envoy cluster). Default: any upstream.
    pub fn clusters(mut self, clusters: &[&str]) -> Self {
        self.clusters = Some(clusters.iter().map(|c| c.to_string()).collect());
        self
    }

    /// Initial host time in milliseconds since the Unix epoch.
    pub fn time_ms(mut self, ms: u64) -> Self {
        self.time_ms = Some(ms);
        self
    }

    /// Seed of WASI `random_get`.
    pub fn random_seed(mut self, seed: u64) -> Self {
        self.random_seed = Some(seed);
        self
    }

    /// Loads (compiles, or takes from the process cache) and instantiates the module.
    pub fn load(self, path: impl AsRef<Path>) -> Result<Host> {
        let module = load_module(path.as_ref())?;
        self.instantiate(&module)
            .with_context(|| format!("instantiating {}", path.as_ref().display()))
    }

    /// Instantiates an already compiled module (see [`crate::engine::load_module`]).
    pub fn instantiate(self, module: &Module) -> Result<Host> {
        let mut state = HostState::new(self.vm_id, self.shared.unwrap_or_default());
        state.vm_config = self.vm_config;
        state.env = self.env;
        state.clusters = self.clusters;
        if let Some(ms) = self.time_ms {
            state.now_ns = ms.saturating_mul(1_000_000);
        }
        if let Some(seed) = self.random_seed {
            state.rng = seed | 1;
        }
        let mut store = Store::new(engine(), state);
        let mut linker: Linker<HostState> = Linker::new(engine());
        hostcalls::add_to_linker(&mut linker).map_err(wt)?;
        let missing: Vec<String> = module
            .imports()
            .filter(|i| linker.get(&mut store, i.module(), i.name()).is_err())
            .map(|i| format!("{}::{}", i.module(), i.name()))
            .collect();
        if !missing.is_empty() {
            bail!(
                "the module imports functions this host does not provide: {}",
                missing.join(", ")
            );
        }
        let instance = linker.instantiate(&mut store, module).map_err(wt)?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| anyhow!("the module exports no `memory`"))?;
        let alloc = ["proxy_on_memory_allocate", "malloc"]
            .iter()
            .find_map(|name| instance.get_typed_func::<u32, u32>(&mut store, name).ok())
            .ok_or_else(|| {
                anyhow!("the module exports neither `proxy_on_memory_allocate` nor `malloc`")
            })?;
        let exports = Exports::resolve(&instance, &mut store)?;
        store.data_mut().memory = Some(memory);
        store.data_mut().alloc = Some(alloc);
        let runtime = Runtime {
            store,
            exports,
            started: false,
            poisoned: None,
        };
        Ok(Host::from_runtime(Rc::new(RefCell::new(runtime))))
    }
}
