//! A real model's tokenizer, as vLLM runs it: Hugging Face's `tokenizer.json` (the
//! `tokenizers` crate, the implementation behind vLLM's fast tokenizers) and the chat
//! template of the model's `tokenizer_config.json` (a Jinja template, rendered by
//! `minijinja` the way `transformers` renders it).
//!
//! What vLLM sends to the engine, and so what this computes:
//! - a completions prompt is encoded with the tokenizer's special tokens added (its
//!   post-processor, e.g. a BOS token);
//! - a chat conversation is rendered with `add_generation_prompt = true`, `bos_token` and
//!   `eos_token` from the config, `trim_blocks` and `lstrip_blocks` on, then encoded
//!   *without* adding special tokens (the template writes them).
//!
//! Files, read once at config time from the directory `path`:
//! - `tokenizer.json` (required; truncation and padding it declares are turned off, as
//!   vLLM does for prompts);
//! - the chat template: `chat_template.jinja` when present (newer model repositories),
//!   else `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates
//!   of which `default` is used). Without one, chat requests fail to tokenize (and get no
//!   precise keys) while completions still work.
//!
//! Templates get what Hugging Face's templates call: `raise_exception(msg)`,
//! `strftime_now(fmt)`, `namespace`, loop controls, `tojson`, and Python string methods
//! (`.strip()`, `.startswith()`, ...). Rendering is bounded by fuel (template instructions)
//! and by the size of its output; the prompt by [`MAX_PROMPT_BYTES`].

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, Error as JinjaError, ErrorKind as JinjaErrorKind, Value};
use serde_json::Value as Json;

use super::{ChatMessage, PromptInput, TokenizeError, Tokenizer};

/// Largest `tokenizer.json` / `tokenizer_config.json` / template file read (the largest
/// public vocabularies are ~35 MB).
pub const MAX_FILE_BYTES: u64 = 128 << 20;

/// Largest prompt tokenized: a completions prompt's bytes, or a chat conversation's
/// content bytes.
pub const MAX_PROMPT_BYTES: usize = 16 << 20;

/// One render's fuel (minijinja's budget: one per instruction, one per 64 bytes of data a
/// template produces or a filter reads): a million instructions, and eight passes over the
/// largest prompt.
const RENDER_FUEL: u64 = 1_000_000 + (MAX_PROMPT_BYTES as u64 * 8) / 64;

/// A rendered chat prompt may be this much longer than its messages' contents.
const RENDER_SLACK_BYTES: usize = 1 << 20;

const TEMPLATE_NAME: &str = "chat";

/// A Hugging Face tokenizer with its chat template. `Send + Sync`; shared by every worker.
pub struct HfTokenizer {
    tokenizer: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.chat.is_some())
            .finish()
    }
}

/// The compiled chat template and the special tokens it is given.
struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl HfTokenizer {
    /// Reads `dir/tokenizer.json` and the chat template (see the module doc).
    pub fn load(dir: &Path) -> Result<Self, TokenizeError> {
        let tokenizer_json = read_bounded(&dir.join("tokenizer.json"))?;
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(&tokenizer_json).map_err(|e| {
            TokenizeError::Load(format!("{}: {e}", dir.join("tokenizer.json").display()))
        })?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| TokenizeError::Load(format!("turning truncation off: {e}")))?;

        let config_path = dir.join("tokenizer_config.json");
        let config: Json = if config_path.exists() {
            let bytes = read_bounded(&config_path)?;
            serde_json::from_slice(&bytes)
                .map_err(|e| TokenizeError::Load(format!("{}: {e}", config_path.display())))?
        } else {
            Json::Null
        };
        let template_path = dir.join("chat_template.jinja");
        let template = if template_path.exists() {
            let bytes = read_bounded(&template_path)?;
            Some(String::from_utf8(bytes).map_err(|_| {
                TokenizeError::Load(format!("{}: not UTF-8", template_path.display()))
            })?)
        } else {
            config_template(&config)?
        };
        let chat = match template {
            Some(source) => Some(ChatTemplate::compile(
                source,
                special_token(&config, "bos_token"),
                special_token(&config, "eos_token"),
            )?),
            None => None,
        };
        Ok(HfTokenizer { tokenizer, chat })
    }

    /// The chat template rendered for `messages` with the generation prompt: the text
    /// that is then encoded.
    pub fn render_chat(&self, messages: &[ChatMessage<'_>]) -> Result<String, TokenizeError> {
        let chat = self
            .chat
            .as_ref()
            .ok_or_else(|| TokenizeError::Template("the tokenizer has no chat template".into()))?;
        chat.render(messages)
    }

    fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    }
}

impl Tokenizer for HfTokenizer {
    fn tokenize(&self, prompt: &PromptInput<'_>) -> Result<Vec<u32>, TokenizeError> {
        match prompt {
            PromptInput::Text(text) => {
                check_size(text.len())?;
                self.encode(text, true)
            }
            PromptInput::Chat(messages) => {
                check_size(messages.iter().map(|m| m.content.len()).sum())?;
                let rendered = self.render_chat(messages)?;
                self.encode(&rendered, false)
            }
        }
    }
}

impl ChatTemplate {
    fn compile(
        source: String,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self, TokenizeError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| TokenizeError::Template(format!("compiling: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
        })
    }

    fn render(&self, messages: &[ChatMessage<'_>]) -> Result<String, TokenizeError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        let list: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => m.role, content => m.content })
            .collect();
        let ctx = context! {
            messages => list,
            add_generation_prompt => true,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let rendered = template
            .render(ctx)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        let contents: usize = messages.iter().map(|m| m.content.len()).sum();
        if rendered.len()
            > contents
                .saturating_mul(2)
                .saturating_add(RENDER_SLACK_BYTES)
        {
            return Err(TokenizeError::Template(format!(
                "rendered {} bytes for {contents} bytes of messages",
                rendered.len()
            )));
        }
        Ok(rendered)
    }
}

fn check_size(bytes: usize) -> Result<(), TokenizeError> {
    if bytes > MAX_PROMPT_BYTES {
        return Err(TokenizeError::Encode(format!(
            "prompt of {bytes} bytes is above the tokenizer's {MAX_PROMPT_BYTES}"
        )));
    }
    Ok(())
}

/// `raise_exception(msg)`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(JinjaErrorKind::InvalidOperation, message))
}

/// `strftime_now(fmt)`: today's date in UTC, for `%Y %m %d %b %B %H %M %S %%` (what chat
/// templates print); other directives are written as they are.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Formats the UTC time `unix_secs` (see [`strftime_now`]).
pub(crate) fn strftime(format: &str, unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let month_name = MONTHS
        .get(month.saturating_sub(1) as usize)
        .copied()
        .unwrap_or("January");
    let mut out = String::with_capacity(format.len() + 8);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('b') => out.push_str(month_name.get(..3).unwrap_or(month_name)),
            Some('B') => out.push_str(month_name),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Year, month (1–12), day (1–31) of the day `days` after 1970-01-01 (proleptic
/// Gregorian calendar; Howard Hinnant's days-to-civil algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The config's chat template: a string, or the `default` of a list of named templates.
fn config_template(config: &Json) -> Result<Option<String>, TokenizeError> {
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(list)) => {
            let default = list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"));
            match default
                .and_then(|t| t.get("template"))
                .and_then(Json::as_str)
            {
                Some(s) => Ok(Some(s.to_string())),
                None => Err(TokenizeError::Load(
                    "tokenizer_config.json: `chat_template` is a list without a `default` template"
                        .into(),
                )),
            }
        }
        Some(_) => Err(TokenizeError::Load(
            "tokenizer_config.json: `chat_template` must be a string or a list of {name, template}"
                .into(),
        )),
    }
}

/// A special token of the config: a string, or an added-token object's `content`; empty
/// when absent.
fn special_token(config: &Json, key: &str) -> String {
    match config.get(key) {
        Some(Json::String(s)) => s.clone(),
        Some(obj @ Json::Object(_)) => obj
            .get("content")
            .and_then(Json::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, TokenizeError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| TokenizeError::Load(format!("{}: {e}", path.display())))?;
    if meta.len() > MAX_FILE_BYTES {
        return Err(TokenizeError::Load(format!(
            "{}: {} bytes is above the {MAX_FILE_BYTES}-byte limit",
            path.display(),
            meta.len()
        )));
    }
    std::fs::read(path).map_err(|e| TokenizeError::Load(format!("{}: {e}", path.display())))
}
