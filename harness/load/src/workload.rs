//! The multi-turn chat workload: conversations with their own long system prompts and a
//! history that grows every turn, plus the order in which turns are sent.
//!
//! All text is generated from the seed, so two runs with the same seed send the same bytes.
//! Words are three letters and a space (4 bytes), so `N` tokens of text are `4N` bytes under
//! the gateway's 4-bytes-per-token estimate.
//!
//! With [`Workload::adapters`], each conversation is for one LoRA adapter drawn from a Zipf
//! law over the list (the first the most popular), from the seed alone: every target of a
//! run gets the same adapter per conversation, whatever its text salt. The conversations of
//! one adapter share that adapter's system prompt (its instructions) ahead of their own.
//!
//! With [`Workload::prefix_groups`], the conversations are dealt into that many groups of
//! equal size (give or take one) in an order shuffled with the seed, as inference-perf
//! shuffles its prompts; a group's conversations share a system prompt of
//! [`Workload::group_prefix_tokens`] ahead of their own. With one turn and no prompt of
//! their own, that is inference-perf's shared-prefix shape (groups of prompts that differ
//! only in their question, arriving in no particular order).

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Shape of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Model name sent in every request.
    pub model: String,
    /// Number of conversations (C).
    pub conversations: u32,
    /// Turns per conversation (T).
    pub turns: u32,
    /// Tokens of each conversation's own system prompt.
    pub system_tokens: u32,
    /// Tokens of a preamble shared by every conversation, before its own system prompt.
    pub shared_prefix_tokens: u32,
    /// Tokens of each user message.
    pub user_tokens: u32,
    /// `max_tokens` of each request.
    pub max_tokens: u32,
    /// Send vLLM's `ignore_eos: true`, so every answer is exactly `max_tokens` long (as vLLM's
    /// own serving benchmark does); the history then grows by a known amount each turn.
    /// Servers other than vLLM and the simulator may reject the unknown field.
    pub ignore_eos: bool,
    /// Seed of all text and of the turn order.
    pub seed: u64,
    /// Ask for `stream_options.include_usage` (the usage-only chunk); without it the
    /// client counts the tokens it received by content chunks.
    pub include_usage: bool,
    /// Also ask for `continuous_usage_stats` (a running usage on every chunk), with
    /// `include_usage`.
    pub continuous_usage: bool,
    /// LoRA adapters the conversations are for (their `model`); empty: every conversation
    /// is for [`Workload::model`].
    pub adapters: Vec<String>,
    /// Exponent of the Zipf law drawing each conversation's adapter: adapter `k` (0-based)
    /// is drawn with a probability ∝ 1 / (k + 1)^s; 0 is uniform.
    pub adapter_zipf: f64,
    /// Tokens of the system prompt each adapter's conversations share, after the shared
    /// preamble and before each conversation's own system prompt.
    pub adapter_prefix_tokens: u32,
    /// Groups of conversations sharing a system prompt (0: none); see [`Workload::group_of`].
    pub prefix_groups: u32,
    /// Tokens of each group's shared system prompt, after the adapter's instructions and
    /// before each conversation's own system prompt.
    pub group_prefix_tokens: u32,
}

impl Default for Workload {
    /// The calibration workload: 64 conversations × 6 turns with 4000-token system prompts,
    /// 64-token questions and 600-token answers. The last turn's prompt is about 7.4k tokens
    /// and its answer brings the context to about 8k, within an 8192-token model. The answers
    /// make the history outweigh the first turn, which no cache can serve: with 128-token
    /// answers and 6 turns, no router could pass about 84% hits at this context length.
    fn default() -> Self {
        Self {
            model: "sim-model".to_string(),
            conversations: 64,
            turns: 6,
            system_tokens: 4000,
            shared_prefix_tokens: 0,
            user_tokens: 64,
            max_tokens: 600,
            ignore_eos: true,
            seed: 1,
            include_usage: true,
            continuous_usage: false,
            adapters: Vec::new(),
            adapter_zipf: 1.0,
            adapter_prefix_tokens: 0,
            prefix_groups: 0,
            group_prefix_tokens: 0,
        }
    }
}

/// `n` adapter names: `lora-00`, `lora-01`, …
pub fn numbered_adapters(n: u32) -> Vec<String> {
    (0..n).map(|k| format!("lora-{k:02}")).collect()
}

/// `tokens` × 4 bytes of lower-case pseudo-words, determined by `key`.
pub fn filler(key: u64, tokens: u32) -> String {
    let mut rng = SmallRng::seed_from_u64(key);
    let mut s = String::with_capacity(tokens as usize * 4);
    for _ in 0..tokens {
        for _ in 0..3 {
            s.push(char::from(b'a' + rng.gen_range(0..26u8)));
        }
        s.push(' ');
    }
    s
}

/// One conversation's history.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// Index in the workload.
    pub index: u32,
    /// Turns already completed or in flight.
    pub turns_sent: u32,
    /// Messages so far (system first), each already serialized as a JSON object, so a
    /// request body is built by concatenation however long the history grows.
    pub messages: Vec<String>,
}

impl Conversation {
    /// Appends a message to the history.
    pub fn push(&mut self, role: &str, content: &str) {
        self.messages
            .push(json!({"role": role, "content": content}).to_string());
    }
}

impl Workload {
    /// The index into [`Workload::adapters`] of conversation `conv`'s adapter (`None`
    /// without adapters): a Zipf draw from the seed and `conv` only.
    pub fn adapter_of(&self, conv: u32) -> Option<usize> {
        if self.adapters.is_empty() {
            return None;
        }
        let weights: Vec<f64> = (0..self.adapters.len())
            .map(|k| 1.0 / ((k + 1) as f64).powf(self.adapter_zipf.max(0.0)))
            .collect();
        let total: f64 = weights.iter().sum();
        let key = xxh3_64_with_seed(&conv.to_le_bytes(), self.seed ^ 0x10ca);
        let mut left = SmallRng::seed_from_u64(key).gen::<f64>() * total;
        for (k, w) in weights.iter().enumerate() {
            if left < *w {
                return Some(k);
            }
            left -= w;
        }
        Some(self.adapters.len() - 1)
    }

    /// The group of every conversation (empty without [`Workload::prefix_groups`]): group
    /// `i mod prefix_groups` for the `i`-th entry of a seeded shuffle of the conversations,
    /// so the groups are of equal size and a run sends them in no particular order.
    pub fn groups(&self) -> Vec<u32> {
        if self.prefix_groups == 0 {
            return Vec::new();
        }
        let mut order: Vec<u32> = (0..self.conversations).collect();
        order.shuffle(&mut SmallRng::seed_from_u64(self.seed ^ 0x6e0));
        let mut group = vec![0; order.len()];
        for (i, conv) in order.iter().enumerate() {
            if let Some(g) = group.get_mut(*conv as usize) {
                *g = i as u32 % self.prefix_groups;
            }
        }
        group
    }

    /// The `model` of conversation `conv`: its adapter, or [`Workload::model`].
    pub fn model_of(&self, conv: u32) -> &str {
        self.adapter_of(conv)
            .and_then(|k| self.adapters.get(k))
            .unwrap_or(&self.model)
    }

    /// The conversations, each with its system prompt; `salt` varies the text between runs.
    pub fn conversations(&self, salt: u64) -> Vec<Conversation> {
        let shared = filler(
            xxh3_64_with_seed(b"shared", self.seed ^ salt),
            self.shared_prefix_tokens,
        );
        let per_adapter: Vec<String> = (0..self.adapters.len() as u64)
            .map(|k| {
                let key = xxh3_64_with_seed(&k.to_le_bytes(), self.seed ^ salt ^ 0xada);
                filler(key, self.adapter_prefix_tokens)
            })
            .collect();
        let per_group: Vec<String> = (0..u64::from(self.prefix_groups))
            .map(|g| {
                let key = xxh3_64_with_seed(&g.to_le_bytes(), self.seed ^ salt ^ 0x6e0);
                filler(key, self.group_prefix_tokens)
            })
            .collect();
        let groups = self.groups();
        (0..self.conversations)
            .map(|i| {
                let key = xxh3_64_with_seed(&i.to_le_bytes(), self.seed ^ salt);
                let instructions = self
                    .adapter_of(i)
                    .and_then(|k| per_adapter.get(k))
                    .map(String::as_str)
                    .unwrap_or("");
                let group = groups
                    .get(i as usize)
                    .and_then(|g| per_group.get(*g as usize))
                    .map(String::as_str)
                    .unwrap_or("");
                let system = format!(
                    "{shared}{instructions}{group}{}",
                    filler(key, self.system_tokens)
                );
                let mut c = Conversation {
                    index: i,
                    turns_sent: 0,
                    messages: Vec::new(),
                };
                c.push("system", &system);
                c
            })
            .collect()
    }

    /// The user message of turn `turn` (0-based) of conversation `conv`.
    pub fn user_message(&self, salt: u64, conv: u32, turn: u32) -> String {
        let key = xxh3_64_with_seed(
            &[conv.to_le_bytes(), turn.to_le_bytes()].concat(),
            self.seed ^ salt ^ 0x5eed,
        );
        filler(key, self.user_tokens)
    }

    /// Send order: every conversation's first turn in order, then the later turns of all
    /// conversations shuffled with the seed (each entry means "the next turn of conv i").
    pub fn order(&self) -> Vec<u32> {
        let mut first: Vec<u32> = (0..self.conversations).collect();
        let mut later: Vec<u32> = (0..self.conversations)
            .flat_map(|c| std::iter::repeat_n(c, self.turns.saturating_sub(1) as usize))
            .collect();
        let mut rng = SmallRng::seed_from_u64(self.seed);
        later.shuffle(&mut rng);
        first.append(&mut later);
        if self.turns == 0 {
            first.clear();
        }
        first
    }

    /// The JSON request body of the next turn of `conv` (the user message is appended to it).
    pub fn next_body(&self, salt: u64, conv: &mut Conversation) -> String {
        let user = self.user_message(salt, conv.index, conv.turns_sent);
        conv.push("user", &user);
        conv.turns_sent += 1;
        let model = Value::String(self.model_of(conv.index).to_owned());
        let total: usize = conv.messages.iter().map(|m| m.len() + 1).sum();
        let mut body = String::with_capacity(total + 160);
        body.push_str("{\"model\":");
        body.push_str(&model.to_string());
        body.push_str(",\"messages\":[");
        for (i, m) in conv.messages.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(m);
        }
        body.push_str("],\"stream\":true,");
        match (self.include_usage, self.continuous_usage) {
            (true, false) => body.push_str("\"stream_options\":{\"include_usage\":true},"),
            (true, true) => body.push_str(
                "\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true},",
            ),
            (false, _) => {}
        }
        if self.ignore_eos {
            body.push_str("\"ignore_eos\":true,");
        }
        body.push_str(&format!("\"max_tokens\":{}}}", self.max_tokens));
        body
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn order_puts_first_turns_first_and_is_seeded() {
        let w = Workload {
            conversations: 5,
            turns: 3,
            ..Workload::default()
        };
        let o = w.order();
        assert_eq!(o.len(), 15);
        assert_eq!(&o[..5], &[0, 1, 2, 3, 4]);
        for c in 0..5 {
            assert_eq!(o[5..].iter().filter(|x| **x == c).count(), 2);
        }
        assert_eq!(o, w.order());
        let other = Workload {
            seed: 2,
            ..w.clone()
        }
        .order();
        assert_ne!(o, other);
    }

    #[test]
    fn adapters_are_drawn_by_zipf_from_the_seed_and_share_their_instructions() {
        let w = Workload {
            conversations: 2000,
            system_tokens: 10,
            adapters: numbered_adapters(4),
            adapter_prefix_tokens: 20,
            ..Workload::default()
        };
        let mut counts = [0u32; 4];
        for c in 0..w.conversations {
            counts[w.adapter_of(c).unwrap()] += 1;
        }
        // 1 : 1/2 : 1/3 : 1/4 of 2000 is 960, 480, 320, 240.
        for (k, want) in [960.0, 480.0, 320.0, 240.0].iter().enumerate() {
            let got = f64::from(counts[k]);
            assert!((got - want).abs() < 0.15 * want, "{counts:?}");
        }
        let uniform = Workload {
            adapter_zipf: 0.0,
            ..w.clone()
        };
        assert!(
            (0..2000)
                .map(|c| uniform.adapter_of(c).unwrap())
                .filter(|k| *k == 3)
                .count()
                > 400
        );
        let system = |c: &Conversation| -> String {
            let v: Value = serde_json::from_str(&c.messages[0]).unwrap();
            v["content"].as_str().unwrap().to_string()
        };
        let convs = w.conversations(7);
        let (a, b) = (0..50u32)
            .flat_map(|i| (0..50u32).map(move |j| (i, j)))
            .find(|(i, j)| i != j && w.adapter_of(*i) == w.adapter_of(*j))
            .unwrap();
        let (sa, sb) = (system(&convs[a as usize]), system(&convs[b as usize]));
        assert_eq!(sa.len(), 120);
        assert_eq!(sa[..80], sb[..80], "one adapter's instructions are shared");
        assert_ne!(
            sa[80..],
            sb[80..],
            "each conversation has its own prompt after them"
        );
        let other = (0..50u32)
            .find(|i| w.adapter_of(*i) != w.adapter_of(a))
            .unwrap();
        assert_ne!(sa[..80], system(&convs[other as usize])[..80]);
        // Same adapters for any salt; the body names the adapter.
        let salted = w.conversations(8);
        assert_ne!(system(&salted[a as usize]), sa);
        let mut c = convs[a as usize].clone();
        let body: Value = serde_json::from_str(&w.next_body(7, &mut c)).unwrap();
        assert_eq!(body["model"], w.adapters[w.adapter_of(a).unwrap()].as_str());
        assert_eq!(Workload::default().model_of(3), "sim-model");
    }

    #[test]
    fn a_group_shares_its_prompt_and_groups_differ() {
        let w = Workload {
            conversations: 8,
            turns: 1,
            system_tokens: 0,
            prefix_groups: 4,
            group_prefix_tokens: 30,
            ..Workload::default()
        };
        let system = |c: &Conversation| -> String {
            let v: Value = serde_json::from_str(&c.messages[0]).unwrap();
            v["content"].as_str().unwrap().to_string()
        };
        let groups = w.groups();
        let mut sizes = [0; 4];
        for g in &groups {
            sizes[*g as usize] += 1;
        }
        assert_eq!(sizes, [2, 2, 2, 2], "{groups:?}");
        assert_eq!(groups, w.groups(), "seeded");
        assert_ne!(
            groups,
            [0, 1, 2, 3, 0, 1, 2, 3],
            "shuffled (this seed's order is not the plain one)"
        );
        let convs = w.conversations(3);
        let mate = (2..8).find(|i| groups[*i] == groups[1]).unwrap();
        let other = (0..8).find(|i| groups[*i] != groups[1]).unwrap();
        assert_eq!(system(&convs[1]).len(), 120);
        assert_eq!(system(&convs[1]), system(&convs[mate]), "one group");
        assert_ne!(system(&convs[1]), system(&convs[other]));
        assert_ne!(system(&convs[1]), system(&w.conversations(4)[1]), "salted");
        assert_ne!(
            w.user_message(3, 1, 0),
            w.user_message(3, mate as u32, 0),
            "each prompt of a group asks its own question"
        );
    }

    #[test]
    fn prompts_are_sized_and_distinct() {
        let w = Workload {
            conversations: 2,
            system_tokens: 100,
            ..Workload::default()
        };
        let convs = w.conversations(0);
        let content = |m: &str| -> String {
            let v: Value = serde_json::from_str(m).unwrap();
            v["content"].as_str().unwrap().to_string()
        };
        let s0 = content(&convs[0].messages[0]);
        assert_eq!(s0.len(), 400);
        assert_ne!(s0, content(&convs[1].messages[0]));
        assert_ne!(w.conversations(1)[0].messages, convs[0].messages);
        let mut c = convs[0].clone();
        let b: Value = serde_json::from_str(&w.next_body(0, &mut c)).unwrap();
        assert_eq!(b["messages"].as_array().unwrap().len(), 2);
        assert_eq!(b["messages"][0]["role"], "system");
        assert_eq!(b["messages"][1]["content"].as_str().unwrap().len(), 256);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["max_tokens"], 600);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["model"], "sim-model");
        c.push("assistant", "ok");
        let b: Value = serde_json::from_str(&w.next_body(0, &mut c)).unwrap();
        assert_eq!(b["messages"].as_array().unwrap().len(), 4);
        let quiet = Workload {
            include_usage: false,
            ..w.clone()
        };
        let b: Value = serde_json::from_str(&quiet.next_body(0, &mut c)).unwrap();
        assert!(b.get("stream_options").is_none());
        assert_eq!(b["stream"], true);
        let running = Workload {
            continuous_usage: true,
            ..w.clone()
        };
        let b: Value = serde_json::from_str(&running.next_body(0, &mut c)).unwrap();
        assert_eq!(
            b["stream_options"],
            json!({"include_usage": true, "continuous_usage_stats": true})
        );
    }
}
