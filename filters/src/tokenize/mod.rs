//! Tokenizes a request's prompt the way the engine will, so the precise prefix index can be
//! asked about the engine's own blocks.
//!
//! A [`Tokenizer`] turns a [`PromptInput`] (a completions prompt string, or a chat
//! conversation) into the token ids the engine computes for it. Two tokenizers exist:
//!
//! - [`SimTokenizer`] ([`sim`]): the simulator's token model, the default. The simulator's
//!   prompt byte stream cut into 4-byte little-endian chunks.
//! - `HfTokenizer` (module `hf`, cargo feature `hf-tokenizer`, never built for Wasm): a real
//!   model's `tokenizer.json` and the chat template of its `tokenizer_config.json`, as vLLM
//!   renders and encodes a chat request.
//!
//! [`from_config`] builds one from the precise producer's `tokenizer` parameter:
//! `{"type":"sim"}` (also when the parameter is absent, `null`) or
//! `{"type":"huggingface","path":DIR}`.
//!
//! Tokenizing runs on the request path: every tokenizer is bounded (input size, template
//! rendering) and returns a [`TokenizeError`], never panics.

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

#[cfg(feature = "hf-tokenizer")]
pub mod hf;
pub mod sim;

#[cfg(feature = "hf-tokenizer")]
pub use hf::HfTokenizer;
pub use sim::SimTokenizer;

/// One message of a chat conversation, as the engine's chat template sees it.
///
/// A message whose OpenAI `content` is an array of parts is given here as the parts' texts
/// concatenated in order (what the simulator and text-only chat templates do); a message
/// without content has `content: ""`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatMessage<'a> {
    /// `role`: `system`, `user`, `assistant`, `tool`, ...
    pub role: &'a str,
    /// The message's text.
    pub content: &'a str,
}

/// What is tokenized: the prompt of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptInput<'a> {
    /// A `/v1/completions` prompt string: encoded as it is.
    Text(&'a str),
    /// A `/v1/chat/completions` conversation: rendered with the chat template and its
    /// generation prompt, then encoded.
    Chat(&'a [ChatMessage<'a>]),
}

/// Why a prompt could not be tokenized, or a tokenizer could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizeError {
    /// The `tokenizer` parameter is malformed, or names a kind this build lacks.
    Config(String),
    /// A tokenizer's files could not be read or parsed (path and reason).
    Load(String),
    /// The chat template failed: a syntax error, `raise_exception`, or a bound (fuel, output
    /// size) was reached.
    Template(String),
    /// The prompt is too large, or the encoder failed on it.
    Encode(String),
}

impl fmt::Display for TokenizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenizeError::Config(m) => write!(f, "tokenizer config: {m}"),
            TokenizeError::Load(m) => write!(f, "tokenizer load: {m}"),
            TokenizeError::Template(m) => write!(f, "chat template: {m}"),
            TokenizeError::Encode(m) => write!(f, "tokenize: {m}"),
        }
    }
}

impl std::error::Error for TokenizeError {}

/// Turns a prompt into the engine's token ids. Shared by every worker: `Send + Sync`, no
/// interior mutability a caller could observe.
pub trait Tokenizer: Send + Sync {
    /// The token ids the engine computes for `prompt` (chat: template with the generation
    /// prompt, special tokens added once, as the template writes them).
    fn tokenize(&self, prompt: &PromptInput<'_>) -> Result<Vec<u32>, TokenizeError>;
}

/// The `type` values [`from_config`] accepts.
pub const TOKENIZER_TYPES: &[&str] = &["sim", "huggingface"];

/// Builds the tokenizer a precise producer's `tokenizer` parameter names.
///
/// `null` (the parameter is absent) or `{"type":"sim"}` → [`SimTokenizer`];
/// `{"type":"huggingface","path":DIR}` → `HfTokenizer::load(DIR)` (reads
/// `DIR/tokenizer.json` and `DIR/tokenizer_config.json` now, at config time). Unknown keys
/// are refused, so a misspelt `path` is not silently ignored. In a build without the
/// `hf-tokenizer` feature (the Wasm flavour) `huggingface` is a [`TokenizeError::Config`].
pub fn from_config(config: &Value) -> Result<Arc<dyn Tokenizer>, TokenizeError> {
    let obj = match config {
        Value::Null => return Ok(Arc::new(SimTokenizer)),
        Value::Object(obj) => obj,
        _ => {
            return Err(TokenizeError::Config(
                "`tokenizer` must be an object such as {\"type\":\"sim\"}".into(),
            ))
        }
    };
    let kind = match obj.get("type") {
        None => "sim",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            return Err(TokenizeError::Config(
                "`tokenizer.type` must be a string".into(),
            ))
        }
    };
    let allowed: &[&str] = match kind {
        "sim" => &["type"],
        "huggingface" => &["type", "path"],
        other => {
            return Err(TokenizeError::Config(format!(
                "unknown `tokenizer.type` {other:?} (expected one of {TOKENIZER_TYPES:?})"
            )))
        }
    };
    if let Some(key) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(TokenizeError::Config(format!(
            "unknown key `tokenizer.{key}` for type {kind:?} (allowed: {allowed:?})"
        )));
    }
    if kind == "sim" {
        return Ok(Arc::new(SimTokenizer));
    }
    let path = match obj.get("path") {
        Some(Value::String(p)) if !p.is_empty() => p.as_str(),
        _ => {
            return Err(TokenizeError::Config(
                "`tokenizer.path` (a directory holding tokenizer.json) is required for type \"huggingface\""
                    .into(),
            ))
        }
    };
    load_huggingface(path)
}

#[cfg(feature = "hf-tokenizer")]
fn load_huggingface(path: &str) -> Result<Arc<dyn Tokenizer>, TokenizeError> {
    Ok(Arc::new(HfTokenizer::load(std::path::Path::new(path))?))
}

#[cfg(not(feature = "hf-tokenizer"))]
fn load_huggingface(path: &str) -> Result<Arc<dyn Tokenizer>, TokenizeError> {
    Err(TokenizeError::Config(format!(
        "tokenizer type \"huggingface\" (path {path:?}) is not available in this build: \
         it needs the native flavour (infergate-filters feature `hf-tokenizer`)"
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests;

#[cfg(all(test, feature = "hf-tokenizer"))]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod hf_tests;
