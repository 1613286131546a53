//! Kubernetes quantities (`"1k"`, `"10Gi"`, `500`) and durations (`"60s"`, `"1m30s"`).

use alloc::string::String;
use serde_json::Value;

/// A count or size: a JSON number, or a string with a Kubernetes quantity suffix.
pub fn parse_quantity(value: &Value) -> Result<u64, String> {
    let _ = value;
    Err("not implemented yet".into())
}

/// A duration in milliseconds: a Go/Kubernetes duration string, or a JSON number of seconds.
pub fn parse_duration_ms(value: &Value) -> Result<u64, String> {
    let _ = value;
    Err("not implemented yet".into())
}
