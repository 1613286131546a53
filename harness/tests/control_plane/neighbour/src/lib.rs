//! Another vendor's plugin, for the control-plane tier: it shares the proxy's `vm_id ""`
//! with the gateway and keeps shared data of its own under unprefixed keys, two of which are
//! names a careless gateway would use (`snapshot`, `infergate.snapshot`). Every request
//! increments `counter` by compare-and-swap and carries the count back in the response
//! header `x-neighbour-count`; nothing else is changed.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        // Keys a gateway without an instance prefix would meet.
        let _ = self.set_shared_data("snapshot", Some(b"not a snapshot"), None);
        let _ = self.set_shared_data("infergate.snapshot", Some(b"\xff\xfegarbage"), None);
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream { count: 0 }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    count: u64,
}

impl Context for Stream {}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _n: usize, _end: bool) -> Action {
        for _ in 0..64 {
            let (value, cas) = self.get_shared_data("counter");
            let n = value
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0);
            if self
                .set_shared_data("counter", Some((n + 1).to_string().as_bytes()), cas)
                .is_ok()
            {
                self.count = n + 1;
                break;
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _end: bool) -> Action {
        self.set_http_response_header("x-neighbour-count", Some(&self.count.to_string()));
        Action::Continue
    }
}
