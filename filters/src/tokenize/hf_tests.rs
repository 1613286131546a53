//! Tests of the Hugging Face tokenizer: ids and rendered prompts against the reference
//! implementation's (`testdata/tokenizer/golden.json`, from `tokenizers` and Jinja2), the
//! files it accepts and refuses, and the bounds of a render.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use proptest::prelude::*;
use serde_json::{json, Value};

use super::hf::{strftime, HfTokenizer, MAX_PROMPT_BYTES};
use super::*;

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizer/tiny")
}

fn golden() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/tokenizer/golden.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// A fresh directory holding the tiny tokenizer.json and, when given, these other files.
fn dir_with(files: &[(&str, &str)]) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "infergate-hf-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(tiny().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

fn messages(case: &Value) -> Vec<(String, String)> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn chat<'a>(owned: &'a [(String, String)]) -> Vec<ChatMessage<'a>> {
    owned
        .iter()
        .map(|(role, content)| ChatMessage { role, content })
        .collect()
}

#[test]
fn ids_and_renders_match_the_reference() {
    let t = HfTokenizer::load(&tiny()).unwrap();
    check_cases(&t, &golden(), true);
}

/// Opt-in: a real model's directory and the cases `generate.py --model` wrote for it.
#[test]
fn matches_a_real_model() {
    let (Ok(dir), Ok(golden)) = (
        std::env::var("INFERGATE_HF_MODEL_DIR"),
        std::env::var("INFERGATE_HF_MODEL_GOLDEN"),
    ) else {
        return;
    };
    let t = HfTokenizer::load(Path::new(&dir)).unwrap();
    let golden: Value = serde_json::from_slice(&std::fs::read(golden).unwrap()).unwrap();
    check_cases(&t, &golden, false);
}

fn check_cases(t: &HfTokenizer, golden: &Value, tiny: bool) {
    let cases = golden["cases"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 7);
    for case in &cases {
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
            .collect();
        if let Some(text) = case["text"].as_str() {
            let ids = t.tokenize(&PromptInput::Text(text)).unwrap();
            assert_eq!(ids, want, "text {text:?}");
            if tiny {
                assert_eq!(ids.first(), Some(&0), "completions get the BOS token");
            }
        } else {
            let owned = messages(case);
            let msgs = chat(&owned);
            assert_eq!(
                t.render_chat(&msgs).unwrap(),
                case["rendered"].as_str().unwrap(),
                "rendered {owned:?}"
            );
            assert_eq!(
                t.tokenize(&PromptInput::Chat(&msgs)).unwrap(),
                want,
                "chat {owned:?}"
            );
        }
    }
}

#[test]
fn from_config_loads_the_directory() {
    let t = from_config(&json!({"type": "huggingface", "path": tiny()})).unwrap();
    let sim = SimTokenizer
        .tokenize(&PromptInput::Text("hello world"))
        .unwrap();
    let hf = t.tokenize(&PromptInput::Text("hello world")).unwrap();
    assert_ne!(hf, sim);
    assert_eq!(hf.first(), Some(&0));
    let err = from_config(&json!({"type": "huggingface", "path": "/nonexistent/model"}))
        .err()
        .unwrap();
    assert!(matches!(err, TokenizeError::Load(_)), "{err}");
    assert!(
        err.to_string()
            .contains("/nonexistent/model/tokenizer.json"),
        "{err}"
    );
}

#[test]
fn broken_files_are_load_errors() {
    let dir = dir_with(&[("tokenizer_config.json", "{not json")]);
    let err = HfTokenizer::load(&dir).unwrap_err();
    assert!(matches!(err, TokenizeError::Load(_)), "{err}");
    std::fs::write(dir.join("tokenizer.json"), b"{\"model\": 3}").unwrap();
    std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    let err = HfTokenizer::load(&dir).unwrap_err();
    assert!(matches!(err, TokenizeError::Load(_)), "{err}");
    let dir = dir_with(&[("tokenizer_config.json", r#"{"chat_template": 7}"#)]);
    assert!(matches!(
        HfTokenizer::load(&dir),
        Err(TokenizeError::Load(_))
    ));
    let dir = dir_with(&[(
        "tokenizer_config.json",
        r#"{"chat_template": [{"name": "tool_use", "template": "x"}]}"#,
    )]);
    let err = HfTokenizer::load(&dir).unwrap_err();
    assert!(err.to_string().contains("default"), "{err}");
    let dir = dir_with(&[("tokenizer_config.json", r#"{"chat_template": "{% for %}"}"#)]);
    let err = HfTokenizer::load(&dir).unwrap_err();
    assert!(matches!(err, TokenizeError::Template(_)), "{err}");
}

#[test]
fn template_sources() {
    let user = [ChatMessage {
        role: "user",
        content: "hi",
    }];
    // No template: completions work, chat is refused.
    let t = HfTokenizer::load(&dir_with(&[])).unwrap();
    assert!(t.tokenize(&PromptInput::Text("hi")).is_ok());
    let err = t.tokenize(&PromptInput::Chat(&user)).unwrap_err();
    assert!(matches!(err, TokenizeError::Template(_)), "{err}");
    // A list of named templates: `default` is used; object-form special tokens.
    let t = HfTokenizer::load(&dir_with(&[(
        "tokenizer_config.json",
        r#"{"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}"}]}"#,
    )]))
    .unwrap();
    assert_eq!(t.render_chat(&user).unwrap(), "<s>user:hi</s>A:");
    // chat_template.jinja wins over the config's template.
    let t = HfTokenizer::load(&dir_with(&[
        ("tokenizer_config.json", r#"{"chat_template": "CONFIG"}"#),
        (
            "chat_template.jinja",
            "FILE {{ messages | length }} {{ messages[0].content.upper() }}",
        ),
    ]))
    .unwrap();
    assert_eq!(t.render_chat(&user).unwrap(), "FILE 1 HI");
}

#[test]
fn template_refusals_and_bounds() {
    let t = HfTokenizer::load(&tiny()).unwrap();
    let robot = [ChatMessage {
        role: "robot",
        content: "beep",
    }];
    let err = t.tokenize(&PromptInput::Chat(&robot)).unwrap_err();
    assert!(matches!(err, TokenizeError::Template(_)), "{err}");
    assert!(err.to_string().contains("unsupported role: robot"), "{err}");

    let spin = dir_with(&[(
        "tokenizer_config.json",
        r#"{"chat_template": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"}"#,
    )]);
    let err = HfTokenizer::load(&spin)
        .unwrap()
        .render_chat(&robot)
        .unwrap_err();
    assert!(err.to_string().contains("fuel"), "{err}");

    let big = "a".repeat(MAX_PROMPT_BYTES + 1);
    let err = t.tokenize(&PromptInput::Text(&big)).unwrap_err();
    assert!(matches!(err, TokenizeError::Encode(_)), "{err}");
    let msgs = [ChatMessage {
        role: "user",
        content: &big,
    }];
    assert!(matches!(
        t.tokenize(&PromptInput::Chat(&msgs)),
        Err(TokenizeError::Encode(_))
    ));
}

#[test]
fn strftime_formats_utc_dates() {
    assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 0), "1970-01-01 00:00:00");
    assert_eq!(strftime("%d %b %Y", 1_700_000_000), "14 Nov 2023");
    assert_eq!(
        strftime("%B %d, %Y %%%q", 951_782_400),
        "February 29, 2000 %%q"
    );
    assert_eq!(strftime("%H:%M:%S", 1_700_000_000), "22:13:20");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Any conversation of allowed roles renders and encodes; the tokens decode-free check:
    /// every message adds at least its role's marker tokens, so more messages never give
    /// fewer ids.
    #[test]
    fn any_conversation_tokenizes(
        msgs in proptest::collection::vec((0usize..4, "\\PC{0,60}"), 1..6),
    ) {
        let t = HfTokenizer::load(&tiny()).unwrap();
        let roles = ["system", "user", "assistant", "tool"];
        let msgs: Vec<ChatMessage<'_>> = msgs
            .iter()
            .map(|(r, c)| ChatMessage { role: roles[*r], content: c })
            .collect();
        let all = t.tokenize(&PromptInput::Chat(&msgs)).unwrap();
        let fewer = t.tokenize(&PromptInput::Chat(&msgs[..msgs.len() - 1])).unwrap();
        prop_assert!(all.len() > fewer.len());
        prop_assert_eq!(&all[..2], &[0, 2][..]);
    }
}
