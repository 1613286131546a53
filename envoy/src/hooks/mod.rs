//! Every `envoy_dynamic_module_on_*` hook this module exports, each wrapped in
//! [`crate::guard::catch`] so no panic crosses into Envoy.

mod http;
mod lb;
