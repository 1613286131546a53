//! A JWT issuer for tests: HS256 tokens under one symmetric key, and the JWKS that lets
//! Envoy's `jwt_authn` verify them (`local_jwks`, so no key server is needed).
//!
//! Symmetric keys keep the issuer tiny (HMAC-SHA256, no key generation); a deployment would
//! give Envoy an asymmetric issuer's public keys instead, and the gateway would not notice:
//! it only reads the claims `jwt_authn` verified.

use hmac::{Hmac, Mac};
use infergate_cli::config::tenancy::JwtProvider;
use serde_json::{json, Value};
use sha2::Sha256;

/// The key id the issuer signs with and its JWKS announces.
pub const TEST_KID: &str = "infergate-test";

/// The default issuer (`iss`) of [`TestIssuer::new`]: the one the platform's
/// `TenantQuota` objects name in `jwtClaims.issuer` (`testdata/tenants/`), so its tokens
/// can map to those tenants.
pub const TEST_ISSUER: &str = "https://sso.example.internal";

/// The default secret of [`TestIssuer::new`]: 32 bytes, the HS256 key size.
const TEST_SECRET: &[u8; 32] = b"infergate-test-hs256-secret-key!";

/// Signs tokens for one issuer with one HS256 key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestIssuer {
    issuer: String,
    secret: Vec<u8>,
}

impl Default for TestIssuer {
    fn default() -> Self {
        TestIssuer::new()
    }
}

impl TestIssuer {
    /// The issuer [`TEST_ISSUER`] with the project's fixed test secret.
    pub fn new() -> Self {
        TestIssuer::for_issuer(TEST_ISSUER)
    }

    /// The issuer `issuer` with the project's fixed test secret.
    pub fn for_issuer(issuer: impl Into<String>) -> Self {
        TestIssuer::with_secret(issuer, TEST_SECRET.to_vec())
    }

    /// An issuer `issuer` signing with `secret`.
    pub fn with_secret(issuer: impl Into<String>, secret: Vec<u8>) -> Self {
        TestIssuer {
            issuer: issuer.into(),
            secret,
        }
    }

    /// The `iss` its tokens should carry.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The JWKS (JSON text) with its one key:
    /// `{"keys":[{"kty":"oct","alg":"HS256","kid":"infergate-test","k":"<base64url>"}]}`.
    pub fn jwks(&self) -> String {
        json!({"keys": [{
            "kty": "oct",
            "alg": "HS256",
            "kid": TEST_KID,
            "k": base64url(&self.secret),
        }]})
        .to_string()
    }

    /// The provider to configure Envoy's `jwt_authn` with.
    pub fn provider(&self) -> JwtProvider {
        JwtProvider {
            issuer: self.issuer.clone(),
            jwks: self.jwks(),
        }
    }

    /// A compact JWS of `claims` exactly as given (add `iss` = [`TestIssuer::issuer`] for
    /// `jwt_authn` to accept it, and `exp` if it should expire).
    pub fn mint(&self, claims: &Value) -> String {
        let header = json!({"alg": "HS256", "typ": "JWT", "kid": TEST_KID}).to_string();
        sign(
            header.as_bytes(),
            claims.to_string().as_bytes(),
            &self.secret,
        )
    }

    /// [`TestIssuer::mint`] with a signature that does not verify: the same header and
    /// claims, signed under another key. Still shaped like a JWT, so `jwt_authn` checks it.
    pub fn mint_bad_signature(&self, claims: &Value) -> String {
        let mut wrong = self.secret.clone();
        wrong.push(0x5a);
        TestIssuer::with_secret(self.issuer.clone(), wrong).mint(claims)
    }

    /// `claims` with `iss` set to this issuer (an existing `iss` is replaced).
    pub fn claims(&self, mut claims: Value) -> Value {
        if let Some(map) = claims.as_object_mut() {
            map.insert("iss".into(), Value::String(self.issuer.clone()));
        }
        claims
    }
}

/// The JWS compact serialisation `b64(header).b64(payload).b64(HMAC-SHA256(key, signing
/// input))` of the exact bytes given.
pub fn sign(header: &[u8], payload: &[u8], key: &[u8]) -> String {
    let signing_input = format!("{}.{}", base64url(header), base64url(payload));
    let signature = hs256(key, signing_input.as_bytes());
    format!("{signing_input}.{}", base64url(&signature))
}

/// HMAC-SHA256 of `data` under `key`.
fn hs256(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC accepts a key of any length (long keys are hashed first), so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => return [0; 32],
    };
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Base64url without padding (RFC 4648 section 5), as JWS and JWK use it.
pub fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        // One input byte gives two characters, two give three, three give four.
        for i in 0..=chunk.len() {
            let sextet = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(ALPHABET[sextet as usize]));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    /// Base64url decoding, for checking what was encoded.
    fn decode(text: &str) -> Vec<u8> {
        let value = |c: u8| match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => panic!("not base64url: {c}"),
        };
        let mut out = Vec::new();
        let (mut acc, mut bits) = (0u32, 0);
        for c in text.bytes() {
            acc = (acc << 6) | u32::from(value(c));
            bits += 6;
            if bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        out
    }

    /// RFC 7515 appendix A.1: the HS256 example, with its exact header and payload bytes.
    #[test]
    fn signs_the_rfc_7515_hs256_example() {
        let header = b"{\"typ\":\"JWT\",\r\n \"alg\":\"HS256\"}";
        let payload =
            b"{\"iss\":\"joe\",\r\n \"exp\":1300819380,\r\n \"http://example.com/is_root\":true}";
        let key = decode(
            "AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow",
        );
        assert_eq!(
            sign(header, payload, &key),
            "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9\
             .eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ\
             .dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
        );
    }

    #[test]
    fn base64url_has_no_padding_and_round_trips() {
        assert_eq!(base64url(b""), "");
        assert_eq!(base64url(b"f"), "Zg");
        assert_eq!(base64url(b"fo"), "Zm8");
        assert_eq!(base64url(b"foo"), "Zm9v");
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&base64url(&bytes)), bytes);
    }

    #[test]
    fn minted_tokens_carry_the_claims_and_the_jwks_the_key() {
        let issuer = TestIssuer::new();
        let claims = issuer.claims(json!({"org": "product-team", "iss": "someone else"}));
        let token = issuer.mint(&claims);
        let parts: Vec<&str> = token.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: Value = serde_json::from_slice(&decode(parts[0])).unwrap();
        assert_eq!(
            header,
            json!({"alg": "HS256", "typ": "JWT", "kid": TEST_KID})
        );
        let payload: Value = serde_json::from_slice(&decode(parts[1])).unwrap();
        assert_eq!(payload, json!({"org": "product-team", "iss": TEST_ISSUER}));
        let jwks: Value = serde_json::from_str(&issuer.jwks()).unwrap();
        let key = &jwks["keys"][0];
        assert_eq!(
            (key["kty"].as_str(), key["kid"].as_str()),
            (Some("oct"), Some(TEST_KID))
        );
        let secret = decode(key["k"].as_str().unwrap());
        assert_eq!(token, sign(&decode(parts[0]), &decode(parts[1]), &secret));
        let bad = issuer.mint_bad_signature(&claims);
        let bad_parts: Vec<&str> = bad.split('.').collect();
        assert_eq!(bad_parts[..2], parts[..2], "same header and claims");
        assert_ne!(bad_parts[2], parts[2]);
        assert_eq!(issuer.provider().issuer, TEST_ISSUER);
        let other = TestIssuer::for_issuer("https://other.test");
        assert_eq!(other.jwks(), issuer.jwks(), "same test key");
        assert_eq!(other.claims(json!({}))["iss"], "https://other.test");
    }
}
