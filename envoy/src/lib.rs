//! Envoy dynamic-module adapter (native `.so`).
