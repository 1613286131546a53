//! A proxy-wasm host on wasmtime implementing the ABI subset our module uses.
