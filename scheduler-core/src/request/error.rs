//! Typed request errors: the "400 with an OpenAI error JSON" answers.
//!
//! Each variant knows its HTTP status, its OpenAI error `type`, `code` and `param`, so the
//! filters can build `{"error": {"message", "type", "param", "code"}}` without guessing.

use alloc::format;
use alloc::string::String;
use core::fmt;

/// Why a request body was rejected. Every variant is answered with HTTP 400.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestError {
    /// The body is not valid JSON (syntax error, truncated, bad UTF-8, trailing bytes).
    NotJson,
    /// The body is valid JSON but not an object.
    NotObject,
    /// The body has no `model`, or `model` is an empty string.
    MissingModel,
    /// A field the gateway reads has the wrong JSON type (or an out-of-range value).
    WrongType {
        /// The field, as a path such as `messages[].content`.
        field: &'static str,
        /// What was expected, in words ("string", "array of token ids", ...).
        expected: &'static str,
    },
}

impl RequestError {
    /// HTTP status of the answer (always 400 for these errors).
    pub fn http_status(&self) -> u16 {
        400
    }

    /// The OpenAI error `type` field.
    pub fn error_type(&self) -> &'static str {
        "invalid_request_error"
    }

    /// Human-readable message for the OpenAI error JSON.
    pub fn message(&self) -> String {
        match self {
            RequestError::NotJson => String::from(
                "We could not parse the JSON body of your request: the body must be a JSON object.",
            ),
            RequestError::NotObject => String::from("The request body must be a JSON object."),
            RequestError::MissingModel => String::from(
                "You must provide a model parameter: `model` must be a non-empty string.",
            ),
            RequestError::WrongType { field, expected } => {
                format!("Invalid type for '{field}': expected {expected}.")
            }
        }
    }

    /// The offending request field, for the OpenAI error `param` field.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            RequestError::NotJson | RequestError::NotObject => None,
            RequestError::MissingModel => Some("model"),
            RequestError::WrongType { field, .. } => Some(field),
        }
    }

    /// Machine-readable error code for the OpenAI error `code` field.
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::NotJson => "invalid_json",
            RequestError::NotObject => "invalid_request_body",
            RequestError::MissingModel => "missing_required_parameter",
            RequestError::WrongType { .. } => "invalid_type",
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}
