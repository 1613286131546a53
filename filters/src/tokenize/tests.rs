//! Tests of the tokenizer config and the simulator's token model, cross-checked against the
//! simulator's own prompt parser and block hashes.

use proptest::prelude::*;
use serde_json::json;

use super::*;

/// The reference model, written the slow obvious way: the byte stream, zero-padded, read
/// 4 bytes at a time.
fn reference(stream: &[u8]) -> Vec<u32> {
    let mut padded = stream.to_vec();
    while !padded.len().is_multiple_of(4) {
        padded.push(0);
    }
    padded
        .chunks(4)
        .map(|c| {
            u32::from(c[0]) | u32::from(c[1]) << 8 | u32::from(c[2]) << 16 | u32::from(c[3]) << 24
        })
        .collect()
}

fn chat_stream(messages: &[ChatMessage<'_>]) -> Vec<u8> {
    let mut s = Vec::new();
    for m in messages {
        s.extend_from_slice(format!("<|{}|>\n{}\n", m.role, m.content).as_bytes());
    }
    s.extend_from_slice(b"<|assistant|>\n");
    s
}

#[test]
fn golden_chat_tokens() {
    let msgs = [
        ChatMessage {
            role: "system",
            content: "ab",
        },
        ChatMessage {
            role: "user",
            content: "cdefg",
        },
    ];
    let t = SimTokenizer.tokenize(&PromptInput::Chat(&msgs)).unwrap();
    // "<|system|>\nab\n<|user|>\ncdefg\n<|assistant|>\n": 43 bytes, 11 tokens (the last one zero-padded).
    assert_eq!(t.len(), 11);
    assert_eq!(t[0], u32::from_le_bytes(*b"<|sy"));
    assert_eq!(t[0], 0x7973_7c3c);
    assert_eq!(t[2], u32::from_le_bytes(*b"|>\na"));
    assert_eq!(t[10], u32::from_le_bytes(*b"|>\n\0"));
    assert_eq!(t, reference(&chat_stream(&msgs)));
    assert_eq!(sim::prompt_len(&PromptInput::Chat(&msgs)), 43);
}

#[test]
fn golden_text_tokens_pad_the_tail() {
    let t = SimTokenizer.tokenize(&PromptInput::Text("abcdef")).unwrap();
    assert_eq!(
        t,
        vec![u32::from_le_bytes(*b"abcd"), u32::from_le_bytes(*b"ef\0\0")]
    );
    assert!(SimTokenizer
        .tokenize(&PromptInput::Text(""))
        .unwrap()
        .is_empty());
}

#[test]
fn config_kinds() {
    assert!(from_config(&Value::Null).is_ok());
    assert!(from_config(&json!({})).is_ok());
    assert!(from_config(&json!({"type": "sim"})).is_ok());
    let t = from_config(&json!({"type": "sim"})).unwrap();
    assert_eq!(
        t.tokenize(&PromptInput::Text("abcd")).unwrap(),
        vec![u32::from_le_bytes(*b"abcd")]
    );
    for (bad, needle) in [
        (json!("sim"), "must be an object"),
        (json!({"type": 3}), "must be a string"),
        (json!({"type": "tiktoken"}), "unknown `tokenizer.type`"),
        (
            json!({"type": "sim", "path": "/x"}),
            "unknown key `tokenizer.path`",
        ),
        (json!({"type": "huggingface"}), "`tokenizer.path`"),
        (
            json!({"type": "huggingface", "path": ""}),
            "`tokenizer.path`",
        ),
        (
            json!({"type": "huggingface", "pth": "/x"}),
            "unknown key `tokenizer.pth`",
        ),
    ] {
        let err = from_config(&bad).err().unwrap().to_string();
        assert!(err.contains(needle), "{bad}: {err}");
    }
}

#[cfg(not(feature = "hf-tokenizer"))]
#[test]
fn huggingface_refused_without_the_feature() {
    let err = from_config(&json!({"type": "huggingface", "path": "/models/x"}))
        .err()
        .unwrap();
    assert!(matches!(err, TokenizeError::Config(_)));
    assert!(err.to_string().contains("hf-tokenizer"), "{err}");
}

proptest! {
    #[test]
    fn pieces_chunk_like_the_whole(
        msgs in proptest::collection::vec(("[a-z]{0,9}", "\\PC{0,40}"), 0..6),
        text in "\\PC{0,80}",
    ) {
        let msgs: Vec<ChatMessage<'_>> = msgs
            .iter()
            .map(|(r, c)| ChatMessage { role: r, content: c })
            .collect();
        let chat = PromptInput::Chat(&msgs);
        prop_assert_eq!(SimTokenizer.tokenize(&chat).unwrap(), reference(&chat_stream(&msgs)));
        prop_assert_eq!(sim::prompt_len(&chat), chat_stream(&msgs).len());
        prop_assert_eq!(
            SimTokenizer.tokenize(&PromptInput::Text(&text)).unwrap(),
            reference(text.as_bytes())
        );
    }
}

/// Against the simulator itself: its parser's byte stream and its block hashes.
#[cfg(not(target_family = "wasm"))]
mod against_the_simulator {
    use infergate_sim::prompt::{block_hashes, model_seed, parse, ApiKind};
    use xxhash_rust::xxh3::xxh3_64_with_seed;

    use super::*;

    const BLOCK: usize = 16;

    /// Chained hashes of the full 16-token blocks of `tokens`, over their LE bytes, as the
    /// simulator chains its byte blocks.
    fn token_blocks(seed: u64, tokens: &[u32]) -> Vec<u64> {
        let mut prev = seed;
        tokens
            .chunks_exact(BLOCK)
            .map(|b| {
                let bytes: Vec<u8> = b.iter().flat_map(|t| t.to_le_bytes()).collect();
                prev = xxh3_64_with_seed(&bytes, prev);
                prev
            })
            .collect()
    }

    /// Our blocks are the simulator's: the same hashes for every block it hashes; at most one
    /// more, only when the stream's last 1–3 bytes were padded into a full block.
    fn check(kind: ApiKind, body: &serde_json::Value, ours: &[u32]) -> Result<(), TestCaseError> {
        let parsed =
            parse(kind, body.to_string().as_bytes()).map_err(|e| TestCaseError::fail(e.message))?;
        let seed = model_seed(&parsed.model, None);
        let theirs: Vec<u64> = block_hashes(seed, &parsed.prompt, BLOCK as u32)
            .into_iter()
            .map(|h| h.0)
            .collect();
        let mine = token_blocks(seed, ours);
        prop_assert_eq!(&mine[..theirs.len().min(mine.len())], &theirs[..]);
        let len = parsed.prompt.len();
        if mine.len() != theirs.len() {
            prop_assert_eq!(mine.len(), theirs.len() + 1);
            prop_assert!((61..64).contains(&(len % 64)), "len {}", len);
        }
        prop_assert_eq!(ours.len(), len.div_ceil(4));
        prop_assert_eq!(
            ours.len() as u32,
            parsed.prompt_tokens.max(ours.len() as u32)
        );
        let bytes: Vec<u8> = ours.iter().flat_map(|t| t.to_le_bytes()).collect();
        prop_assert_eq!(&bytes[..len], &parsed.prompt[..]);
        prop_assert!(bytes[len..].iter().all(|b| *b == 0));
        Ok(())
    }

    #[test]
    fn a_long_chat_has_the_simulators_blocks() {
        let system = "You are a careful assistant. ".repeat(20);
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What is the capital of France?"},
        ]});
        let msgs = [
            ChatMessage {
                role: "system",
                content: &system,
            },
            ChatMessage {
                role: "user",
                content: "What is the capital of France?",
            },
        ];
        let ours = SimTokenizer.tokenize(&PromptInput::Chat(&msgs)).unwrap();
        assert!(ours.len() >= 10 * BLOCK);
        check(ApiKind::Chat, &body, &ours).unwrap();
    }

    proptest! {
        #[test]
        fn chat_blocks_match(
            msgs in proptest::collection::vec(
                (prop_oneof![Just("system"), Just("user"), Just("assistant")], "\\PC{0,150}"),
                1..6,
            ),
        ) {
            let body = json!({"model": "m", "messages": msgs
                .iter()
                .map(|(r, c)| json!({"role": r, "content": c}))
                .collect::<Vec<_>>()});
            let msgs: Vec<ChatMessage<'_>> = msgs
                .iter()
                .map(|(r, c)| ChatMessage { role: r, content: c })
                .collect();
            let ours = SimTokenizer.tokenize(&PromptInput::Chat(&msgs)).unwrap();
            check(ApiKind::Chat, &body, &ours)?;
        }

        #[test]
        fn completion_blocks_match(prompt in "\\PC{1,400}") {
            let body = json!({"model": "m", "prompt": prompt});
            let ours = SimTokenizer.tokenize(&PromptInput::Text(&prompt)).unwrap();
            check(ApiKind::Completions, &body, &ours)?;
        }
    }
}
