//! proxy-wasm adapter: turns the `filters/` state machines into proxy-wasm contexts.
