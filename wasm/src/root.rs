//! The root context: reads the plugin configuration, builds the role's shared state
//! (one per VM, i.e. per Envoy worker for HTTP filters, and one for the singleton
//! scraper service), creates the HTTP contexts, and runs the scraper's ticks and
//! callout responses.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use infergate_filters::host::{CalloutOutcome, CalloutToken};
use infergate_filters::picker::PickerShared;
use infergate_filters::router::Router;
use infergate_filters::scraper::Scraper;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel, MapType};

use crate::config::{self, PluginConfig, RoleKind, DEFAULT_SNAPSHOT_KEY};
use crate::host::{log, VmShared, WasmHost};
use crate::http::{
    FailClosedContext, PassThroughContext, PickerContext, ProbeContext, RouterContext,
};

/// What this module instance runs, with its per-VM state.
enum Role {
    Router(Rc<Router>),
    Picker(Rc<RefCell<PickerShared>>),
    Scraper(Box<Scraper>),
    Probe,
}

/// The root context of every role.
pub struct Root {
    context_id: u32,
    vm: Rc<VmShared>,
    role: Option<Role>,
}

impl Root {
    /// A root context before configuration.
    pub fn new(context_id: u32) -> Self {
        Root {
            context_id,
            vm: Rc::new(VmShared::new(
                DEFAULT_SNAPSHOT_KEY.to_owned(),
                true,
                u64::from(context_id),
            )),
            role: None,
        }
    }

    fn configure(&mut self, cfg: PluginConfig) -> Result<(), String> {
        self.vm = Rc::new(VmShared::new(
            cfg.snapshot_key.clone(),
            cfg.filter_state_override,
            u64::from(self.context_id),
        ));
        self.role = Some(match cfg.role {
            RoleKind::Router => Role::Router(Rc::new(
                Router::from_json(cfg.rest).map_err(|e| e.to_string())?,
            )),
            RoleKind::Picker => Role::Picker(Rc::new(RefCell::new(
                PickerShared::from_json(cfg.rest).map_err(|e| e.to_string())?,
            ))),
            RoleKind::Scraper => {
                let scraper = Scraper::from_json(cfg.rest)?;
                hostcalls::set_tick_period(Duration::from_millis(scraper.tick_period_ms()))
                    .map_err(|s| format!("set_tick_period failed: {s:?}"))?;
                Role::Scraper(Box::new(scraper))
            }
            RoleKind::Probe => Role::Probe,
        });
        Ok(())
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some(Role::Scraper(scraper)) = &mut self.role else {
            return;
        };
        // A failed or timed-out call arrives without headers. Envoy then answers any read of
        // the response header map with BadArgument, on which the SDK panics (killing the
        // scraper VM), so the map is only read when headers exist.
        let status = if num_headers == 0 {
            None
        } else {
            hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
                .ok()
                .flatten()
                .and_then(|s| s.parse::<u16>().ok())
        };
        let outcome = match status {
            Some(status) => CalloutOutcome::Response {
                status,
                body: hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                    .ok()
                    .flatten()
                    .unwrap_or_default(),
            },
            None => CalloutOutcome::Failed,
        };
        let mut host = WasmHost::new(&self.vm);
        scraper.on_callout_done(&mut host, CalloutToken(u64::from(token_id)), outcome);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _plugin_configuration_size: usize) -> bool {
        let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
            .ok()
            .flatten()
            .unwrap_or_default();
        match config::parse(&bytes).and_then(|cfg| self.configure(cfg)) {
            Ok(()) => true,
            Err(e) => {
                log(LogLevel::Critical, &format!("infergate: {e}"));
                self.role = None;
                false
            }
        }
    }

    fn on_tick(&mut self) {
        if let Some(Role::Scraper(scraper)) = &mut self.role {
            let mut host = WasmHost::new(&self.vm);
            scraper.on_tick(&mut host);
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        // Always HTTP: the SDK aborts the VM if a host creates a child context of a root
        // without a type, and an unconfigured or scraper root must still answer safely.
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let vm = Rc::clone(&self.vm);
        Some(match &self.role {
            Some(Role::Router(router)) => Box::new(RouterContext::new(vm, Rc::clone(router))),
            Some(Role::Picker(shared)) => Box::new(PickerContext::new(vm, Rc::clone(shared))),
            Some(Role::Scraper(_)) => Box::new(PassThroughContext),
            Some(Role::Probe) => Box::<ProbeContext>::default(),
            None => Box::new(FailClosedContext::new(vm)),
        })
    }
}
