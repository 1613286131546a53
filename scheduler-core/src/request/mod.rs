//! One-pass parsing of OpenAI and Anthropic request bodies (DESIGN §6, §10).
//!
//! CONTRACT STUB — owned by the request/prefix work. Agreed interface:
//!
//! ```ignore
//! pub enum Api { ChatCompletions, Completions, AnthropicMessages }
//! impl Api { pub fn from_path(path: &str) -> Option<Api> }   // query string ignored
//! pub struct ParsedRequest {
//!     pub api: Api, pub model: String,
//!     pub prompt: Vec<u8>,               // canonical prompt byte stream (DESIGN §6)
//!     pub prompt_tokens: Tokens,         // estimate: prompt.len() / 4, rounded up
//!     pub max_output_tokens: Option<u64>, // max_completion_tokens, else max_tokens
//!     pub stream: bool, pub include_usage: bool, pub cache_salt: Option<String>,
//! }
//! pub fn parse(api: Api, body: &[u8]) -> Result<ParsedRequest, RequestError>;
//! pub enum RequestError { NotJson, MissingModel, WrongType { field: &'static str, expected: &'static str }, ... }
//! impl RequestError { pub fn message(&self) -> String; pub fn param(&self) -> Option<&'static str>; pub fn code(&self) -> &'static str }
//! ```
