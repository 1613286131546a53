//! Kubernetes quantities (`"1k"`, `"10Gi"`, `500`) and durations (`"60s"`, `"1m30s"`).
//!
//! Quantities follow Kubernetes' `resource.Quantity` notation for whole, non-negative
//! counts: digits with an optional fraction, then at most one suffix, decimal (`k` = 10³, `M`,
//! `G`, `T`, `P`, `E` = 10¹⁸), binary (`Ki` = 2¹⁰, `Mi`, `Gi`, `Ti`, `Pi`, `Ei` = 2⁶⁰) or a
//! decimal exponent (`1e3`). A fraction is accepted only when the result is whole (`"1.5k"`
//! is 1500, `"0.5"` is refused), as a count of requests or bytes cannot be fractional.
//!
//! Durations follow Go's `time.ParseDuration` (what Kubernetes' `metav1.Duration` reads): a
//! sequence of decimal numbers, each with a unit `ns`, `us` (`µs`), `ms`, `s`, `m`, `h`, e.g.
//! `"1m30s"`, `"1.5s"`, `"500ms"`; `"0"` alone needs no unit. A bare JSON number is seconds.
//! The result is in whole milliseconds, rounded up, so a positive duration never becomes 0.

use alloc::format;
use alloc::string::String;
use serde_json::Value;

/// 2^53: the largest float below which every integer is exact.
const MAX_EXACT_F64: f64 = 9_007_199_254_740_992.0;

/// A count or size: a JSON number, or a string with a Kubernetes quantity suffix.
pub fn parse_quantity(value: &Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => {
            if let Some(v) = n.as_u64() {
                return Ok(v);
            }
            if n.as_i64().is_some_and(|v| v < 0) {
                return Err(format!("must not be negative, got {n}"));
            }
            // Whole floats (`1e3` in JSON) are counts too; up to 2^53 they are exact.
            match n.as_f64() {
                Some(f) if f < 0.0 => Err(format!("must not be negative, got {n}")),
                Some(f) if f > MAX_EXACT_F64 => Err(format!("is too large, got {n}")),
                Some(f) if (f as u64) as f64 == f => Ok(f as u64),
                _ => Err(format!("must be a whole number, got {n}")),
            }
        }
        Value::String(s) => parse_quantity_str(s),
        other => Err(format!(
            "must be a number or a quantity string such as \"1k\" or \"10Gi\", got {other}"
        )),
    }
}

fn parse_quantity_str(text: &str) -> Result<u64, String> {
    let bad = |why: &str| format!("invalid quantity {text:?}: {why}");
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(bad("must not be negative"));
    }
    let digits_end = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return Err(bad("expected digits"));
    }
    if frac.contains('.') {
        return Err(bad("more than one decimal point"));
    }
    // value = (whole.frac) × multiplier, computed as digits × multiplier / 10^len(frac).
    let multiplier: u128 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        e if e.starts_with(['e', 'E']) => {
            let exp: u32 = e[1..]
                .parse()
                .map_err(|_| bad("the exponent must be a non-negative integer"))?;
            if exp > 30 {
                return Err(bad("too large"));
            }
            10u128.pow(exp)
        }
        "m" | "u" | "n" => {
            return Err(bad(
                "milli/micro/nano suffixes are fractions; a count must be whole",
            ))
        }
        _ => {
            return Err(bad(
                "unknown suffix (known: k M G T P E, Ki Mi Gi Ti Pi Ei, e<N>)",
            ))
        }
    };
    let too_large = || bad("too large");
    let mut mantissa: u128 = 0;
    for c in whole.bytes().chain(frac.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(c - b'0')))
            .ok_or_else(too_large)?;
    }
    let frac_len = u32::try_from(frac.len()).map_err(|_| too_large())?;
    let divisor = 10u128.checked_pow(frac_len).ok_or_else(too_large)?;
    let scaled = mantissa.checked_mul(multiplier).ok_or_else(too_large)?;
    if scaled % divisor != 0 {
        return Err(bad("not a whole number"));
    }
    u64::try_from(scaled / divisor).map_err(|_| too_large())
}

/// A duration in milliseconds: a Go/Kubernetes duration string, or a JSON number of seconds.
pub fn parse_duration_ms(value: &Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => {
            let Some(secs) = n.as_f64() else {
                return Err(format!("must be a number of seconds, got {n}"));
            };
            if secs < 0.0 {
                return Err(format!("must not be negative, got {n}"));
            }
            let ms = secs * 1000.0;
            // 2^53 ms keeps the conversion exact (about 285,000 years).
            if !ms.is_finite() || ms > MAX_EXACT_F64 {
                return Err(format!("is too large, got {n}"));
            }
            // Rounded up (no_std has no `f64::ceil`): truncate, then add the part cut off.
            let whole = ms as u64;
            Ok(if (whole as f64) < ms {
                whole + 1
            } else {
                whole
            })
        }
        Value::String(s) => parse_duration_str(s),
        other => Err(format!(
            "must be a duration such as \"60s\" or \"1m30s\", or a number of seconds, got {other}"
        )),
    }
}

fn parse_duration_str(text: &str) -> Result<u64, String> {
    let bad = |why: &str| format!("invalid duration {text:?}: {why}");
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(bad("must not be negative"));
    }
    if s == "0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(bad("empty"));
    }
    let too_large = || bad("too large");
    // Exact arithmetic in nanoseconds; u128 holds any sum of u64-sized terms.
    let mut total_ns: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(num_end);
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() {
            return Err(bad("expected a number before each unit"));
        }
        if frac.contains('.') {
            return Err(bad("more than one decimal point"));
        }
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_end);
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(bad("missing unit (ns, us, ms, s, m, h), e.g. \"60s\"")),
            other => {
                return Err(bad(&format!(
                    "unknown unit {other:?} (known: ns, us, ms, s, m, h)"
                )))
            }
        };
        let mut mantissa: u128 = 0;
        for c in whole.bytes().chain(frac.bytes()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(c - b'0')))
                .ok_or_else(too_large)?;
        }
        let frac_len = u32::try_from(frac.len()).map_err(|_| too_large())?;
        let divisor = 10u128.checked_pow(frac_len).ok_or_else(too_large)?;
        // Go truncates a fraction finer than a nanosecond; so do we.
        let ns = mantissa.checked_mul(unit_ns).ok_or_else(too_large)? / divisor;
        total_ns = total_ns.checked_add(ns).ok_or_else(too_large)?;
        rest = next;
    }
    let ms = total_ns.div_ceil(1_000_000);
    u64::try_from(ms).map_err(|_| too_large())
}
