//! Token usage read from responses as they stream past: SSE and JSON bodies.
