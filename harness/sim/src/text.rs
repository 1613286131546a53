//! Deterministic output text: the same prompt and model always produce the same tokens.
//!
//! Each token is a three-letter word and a space — four bytes, matching the 4-bytes-per-token
//! estimate, so a client that echoes the answer into the next turn grows its prompt by about
//! as many tokens as were generated.

use xxhash_rust::xxh3::{xxh3_128_with_seed, xxh3_64_with_seed};

/// The seed of a completion: a hash of the prompt bytes under the model's seed.
pub fn output_seed(model_seed: u64, prompt: &[u8]) -> u64 {
    xxh3_64_with_seed(prompt, model_seed)
}

/// The seed of choice `j` of a prompt whose completion seed is `seed`: the first choice
/// keeps it (a request with one choice reads as before), each other one draws its own text.
pub fn sequence_seed(seed: u64, j: u32) -> u64 {
    if j == 0 {
        seed
    } else {
        xxh3_64_with_seed(&j.to_le_bytes(), seed)
    }
}

/// A 128-bit hash of the prompt under the model's seed, for deterministic response ids.
pub fn response_id_hash(model_seed: u64, prompt: &[u8]) -> u128 {
    xxh3_128_with_seed(prompt, model_seed)
}

/// The text of token `index` of the completion with `seed`.
pub fn token_text(seed: u64, index: u32) -> &'static str {
    let h = xxh3_64_with_seed(&index.to_le_bytes(), seed);
    SPACED
        .get((h % SPACED.len() as u64) as usize)
        .copied()
        .unwrap_or("the ")
}

/// The first `tokens` tokens of the completion with `seed`, as one text.
pub fn completion(seed: u64, tokens: u32) -> String {
    (0..tokens).map(|i| token_text(seed, i)).collect()
}

const SPACED: &[&str] = &[
    "the ", "and ", "for ", "you ", "are ", "not ", "but ", "can ", "all ", "one ", "out ", "get ",
    "has ", "new ", "now ", "old ", "see ", "two ", "way ", "who ", "did ", "its ", "let ", "put ",
    "say ", "too ", "use ", "day ", "end ", "far ", "few ", "got ", "her ", "how ", "job ", "key ",
    "law ", "low ", "map ", "may ", "own ", "per ", "run ", "set ", "sun ", "top ", "try ", "yes ",
];

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_four_byte_tokens() {
        let s = output_seed(1, b"prompt");
        let a: String = (0..50).map(|i| token_text(s, i)).collect();
        let b: String = (0..50).map(|i| token_text(s, i)).collect();
        assert_eq!(a, b);
        assert_eq!(a.len(), 200);
        let c: String = (0..50)
            .map(|i| token_text(output_seed(1, b"other"), i))
            .collect();
        assert_ne!(a, c);
    }
}
