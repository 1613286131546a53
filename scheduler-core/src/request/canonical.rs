//! Canonical JSON: the byte form of structured request parts (tools, tool calls, non-text
//! content parts) inside the prompt byte stream.
//!
//! Compact JSON (no whitespace) with object keys sorted by their UTF-8 bytes, so two clients
//! that send the same tools with keys in a different order or with different whitespace
//! produce the same bytes. Strings escape only `"`, `\` and control characters (`\u00XX`,
//! lowercase hex); everything else is raw UTF-8. Integers print in decimal; other numbers
//! print as Rust's shortest round-trip `f64` form (`2.0` → `2`, `0.1` → `0.1`). The sort is
//! done here rather than relying on `serde_json::Map` ordering, which a `preserve_order`
//! feature elsewhere in the build could change.

use alloc::vec::Vec;
use core::fmt::Write;
use serde_json::Value;

/// Appends the canonical JSON of `value` to `out`.
pub(crate) fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&str, &Value)> =
                map.iter().map(|(k, v)| (k.as_str(), v)).collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            write_object(&entries, out);
        }
    }
}

/// Appends the canonical JSON of an object given as (key, value) pairs already sorted.
pub(crate) fn write_object(entries: &[(&str, &Value)], out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (key, value)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(key, out);
        out.push(b':');
        write_value(value, out);
    }
    out.push(b'}');
}

/// Appends a JSON string with the minimal canonical escaping described in the module doc.
pub(crate) fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s.as_bytes() {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
            _ => out.push(b),
        }
    }
    out.push(b'"');
}

fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    let mut w = VecWriter(out);
    // Writing into a Vec cannot fail; the Result only exists for the fmt::Write signature.
    let _ = if let Some(u) = n.as_u64() {
        write!(w, "{u}")
    } else if let Some(i) = n.as_i64() {
        write!(w, "{i}")
    } else {
        let f = n.as_f64().unwrap_or(0.0);
        if f.abs() < 9.007_199_254_740_992e15 && (f as i64) as f64 == f {
            // Integral floats print like integers so `2.0` and `2` agree.
            write!(w, "{}", f as i64)
        } else {
            write!(w, "{f}")
        }
    };
}

/// `core::fmt::Write` into a byte vector.
struct VecWriter<'a>(&'a mut Vec<u8>);

impl Write for VecWriter<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}
