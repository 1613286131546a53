//! Reading the claims of a JWT that Envoy's `jwt_authn` already verified.
//!
//! The gateway never checks a signature: `jwt_authn` does, and leaves its verified payload
//! in the request's dynamic metadata. A host that can only tell *that* a JWT was verified
//! (the dynamic-module ABI reads top-level metadata values, not the nested payload) reads the
//! claims from the token itself, the same bytes `jwt_authn` verified; nothing here may be
//! called for a token nobody verified.

use serde_json::Value;

/// The namespace `jwt_authn` writes its verified payload under.
pub const JWT_AUTHN_NAMESPACE: &str = "envoy.filters.http.jwt_authn";
/// The key the shipped configs ask `jwt_authn` to write the payload under.
pub const JWT_PAYLOAD_KEY: &str = "jwt_payload";

/// The longest token read (Envoy's header limits bound it anyway).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The string claim `name` of the bearer token in `authorization`, read without
/// verification (see the module doc); `None` if the header holds no decodable JWT or the
/// claim is absent or not a string.
pub fn claim_of_verified_bearer(authorization: &str, name: &str) -> Option<String> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.len() > MAX_TOKEN_BYTES {
        return None;
    }
    let payload = token.trim().split('.').nth(1)?;
    let json = base64url_decode(payload)?;
    let claims: Value = serde_json::from_slice(&json).ok()?;
    claims.get(name)?.as_str().map(str::to_owned)
}

/// Decodes unpadded (or padded) base64url.
fn base64url_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_read_from_the_payload_segment() {
        // {"iss":"https://sso.example.internal","org":"product-team","n":1}
        let payload = "eyJpc3MiOiJodHRwczovL3Nzby5leGFtcGxlLmludGVybmFsIiwib3JnIjoicHJvZHVjdC10ZWFtIiwibiI6MX0";
        let header = format!("Bearer eyJhbGciOiJIUzI1NiJ9.{payload}.c2ln");
        assert_eq!(
            claim_of_verified_bearer(&header, "iss").as_deref(),
            Some("https://sso.example.internal")
        );
        assert_eq!(
            claim_of_verified_bearer(&header, "org").as_deref(),
            Some("product-team")
        );
        assert_eq!(claim_of_verified_bearer(&header, "n"), None);
        assert_eq!(claim_of_verified_bearer(&header, "missing"), None);
        assert_eq!(claim_of_verified_bearer("Bearer sk-key", "iss"), None);
        assert_eq!(claim_of_verified_bearer("Bearer a.!!!.c", "iss"), None);
        assert_eq!(claim_of_verified_bearer("Basic a.b.c", "iss"), None);
    }

    #[test]
    fn base64url_round_trips_known_vectors() {
        assert_eq!(base64url_decode("aGk").as_deref(), Some(&b"hi"[..]));
        assert_eq!(base64url_decode("aGk=").as_deref(), Some(&b"hi"[..]));
        assert_eq!(base64url_decode("_-8").as_deref(), Some(&[0xff, 0xef][..]));
        assert_eq!(base64url_decode("").as_deref(), Some(&[][..]));
    }
}
