//! The simulator's token model (`harness/sim`): a token is 4 bytes of the prompt byte stream.
//!
//! The byte stream is the simulator's (its `prompt` module):
//! - completions: the prompt string's bytes;
//! - chat: for each message `<|` + role + `|>\n` + content + `\n`, then the generation
//!   prompt `<|assistant|>\n`.
//!
//! The stream is cut into 4-byte chunks; a token id is the chunk read as a little-endian
//! `u32`; a trailing partial chunk is zero-padded. So `n` tokens cover exactly `4 n` bytes
//! and a block of `block_size` tokens is the simulator's block of `4 × block_size` bytes.
//! (The simulator counts ⌈bytes ÷ 4⌉ prompt tokens too; the one padded token can only
//! differ from the engine's, whose sequence continues with the completion, in the last
//! block, which the engine hashes only once its completion fills it.)

use super::{PromptInput, TokenizeError, Tokenizer};

/// The bytes the simulator appends to a chat conversation: the assistant's turn opening.
pub const GENERATION_PROMPT: &[u8] = b"<|assistant|>\n";

/// Bytes per simulator token.
pub const BYTES_PER_TOKEN: usize = 4;

/// The simulator's token model. Stateless.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimTokenizer;

impl Tokenizer for SimTokenizer {
    fn tokenize(&self, prompt: &PromptInput<'_>) -> Result<Vec<u32>, TokenizeError> {
        let mut out = Chunker::with_bytes(prompt_len(prompt));
        match prompt {
            PromptInput::Text(text) => out.push(text.as_bytes()),
            PromptInput::Chat(messages) => {
                for m in messages.iter() {
                    out.push(b"<|");
                    out.push(m.role.as_bytes());
                    out.push(b"|>\n");
                    out.push(m.content.as_bytes());
                    out.push(b"\n");
                }
                out.push(GENERATION_PROMPT);
            }
        }
        Ok(out.finish())
    }
}

/// The length of the simulator's byte stream for `prompt`.
pub fn prompt_len(prompt: &PromptInput<'_>) -> usize {
    match prompt {
        PromptInput::Text(text) => text.len(),
        PromptInput::Chat(messages) => messages
            .iter()
            .map(|m| m.role.len() + m.content.len() + 6)
            .sum::<usize>()
            .saturating_add(GENERATION_PROMPT.len()),
    }
}

/// Cuts a byte stream given in pieces into 4-byte little-endian tokens.
struct Chunker {
    tokens: Vec<u32>,
    /// The bytes of the current partial chunk (`pending_len` of them are valid).
    pending: [u8; BYTES_PER_TOKEN],
    pending_len: usize,
}

impl Chunker {
    fn with_bytes(bytes: usize) -> Self {
        Chunker {
            tokens: Vec::with_capacity(bytes.div_ceil(BYTES_PER_TOKEN)),
            pending: [0; BYTES_PER_TOKEN],
            pending_len: 0,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        if self.pending_len > 0 {
            let take = (BYTES_PER_TOKEN - self.pending_len).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            if let Some(dst) = self
                .pending
                .get_mut(self.pending_len..self.pending_len + take)
            {
                dst.copy_from_slice(head);
            }
            self.pending_len += take;
            bytes = rest;
            if self.pending_len < BYTES_PER_TOKEN {
                return;
            }
            self.tokens.push(u32::from_le_bytes(self.pending));
            self.pending_len = 0;
        }
        let mut chunks = bytes.chunks_exact(BYTES_PER_TOKEN);
        for c in chunks.by_ref() {
            let mut word = [0u8; BYTES_PER_TOKEN];
            word.copy_from_slice(c);
            self.tokens.push(u32::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if let Some(dst) = self.pending.get_mut(..rest.len()) {
            dst.copy_from_slice(rest);
        }
        self.pending_len = rest.len();
    }

    fn finish(mut self) -> Vec<u32> {
        if self.pending_len > 0 {
            let mut word = [0u8; BYTES_PER_TOKEN];
            if let (Some(dst), Some(src)) = (
                word.get_mut(..self.pending_len),
                self.pending.get(..self.pending_len),
            ) {
                dst.copy_from_slice(src);
            }
            self.tokens.push(u32::from_le_bytes(word));
        }
        self.tokens
    }
}
