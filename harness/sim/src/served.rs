//! What one replica's HTTP responses delivered, per fairness id and model: the figures a
//! gateway that bills from the responses it forwards should arrive at.
//!
//! A completed request counts the usage it reported. A request whose client went away
//! counts the completion tokens whose chunks the stream handed to the connection (one
//! token per content chunk), and its prompt tokens if at least one such chunk left; a
//! non-streamed request cut off counts nothing but the cut. The key is the request's
//! `x-llm-d-inference-fairness-id` header (empty when absent; the gateway sets it to the
//! tenant's fairness id) and its `model` as sent.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Header whose value keys the ledger (the tenant's fairness id, set by the gateway).
pub const FAIRNESS_ID_HEADER: &str = "x-llm-d-inference-fairness-id";

/// Who a request was served for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ServedKey {
    /// `x-llm-d-inference-fairness-id`, or empty.
    pub fairness_id: String,
    /// The request's `model`.
    pub model: String,
}

/// Totals of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServedTotals {
    /// Prompt tokens of completed requests and of cut-off streams that sent a token.
    pub prompt_tokens: u64,
    /// Completion tokens delivered: reported usage of completed requests plus the content
    /// chunks of cut-off streams.
    pub completion_tokens: u64,
    /// Requests that generated every token.
    pub requests_completed: u64,
    /// Requests whose client went away before the end.
    pub requests_cut_off: u64,
    /// Of `completion_tokens`, those of cut-off streams.
    pub cut_off_completion_tokens: u64,
}

/// The ledger of one replica, shared by its responses.
#[derive(Debug, Clone, Default)]
pub struct ServedLedger {
    totals: Arc<Mutex<BTreeMap<ServedKey, ServedTotals>>>,
}

impl ServedLedger {
    fn update(&self, key: &ServedKey, f: impl FnOnce(&mut ServedTotals)) {
        if let Ok(mut t) = self.totals.lock() {
            f(t.entry(key.clone()).or_default());
        }
    }

    /// A request that finished with this usage.
    pub fn completed(&self, key: &ServedKey, prompt_tokens: u32, completion_tokens: u32) {
        self.update(key, |t| {
            t.prompt_tokens += u64::from(prompt_tokens);
            t.completion_tokens += u64::from(completion_tokens);
            t.requests_completed += 1;
        });
    }

    /// A request cut off after `sent_tokens` content chunks left.
    pub fn cut_off(&self, key: &ServedKey, prompt_tokens: u32, sent_tokens: u32) {
        self.update(key, |t| {
            if sent_tokens > 0 {
                t.prompt_tokens += u64::from(prompt_tokens);
            }
            t.completion_tokens += u64::from(sent_tokens);
            t.cut_off_completion_tokens += u64::from(sent_tokens);
            t.requests_cut_off += 1;
        });
    }

    /// Every key's totals, in key order.
    pub fn snapshot(&self) -> Vec<(ServedKey, ServedTotals)> {
        match self.totals.lock() {
            Ok(t) => t.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The sum over every key.
    pub fn total(&self) -> ServedTotals {
        let mut sum = ServedTotals::default();
        for (_, t) in self.snapshot() {
            sum.prompt_tokens += t.prompt_tokens;
            sum.completion_tokens += t.completion_tokens;
            sum.requests_completed += t.requests_completed;
            sum.requests_cut_off += t.requests_cut_off;
            sum.cut_off_completion_tokens += t.cut_off_completion_tokens;
        }
        sum
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn completed_and_cut_off_add_up_per_key() {
        let l = ServedLedger::default();
        let a = ServedKey {
            fairness_id: "a".into(),
            model: "m".into(),
        };
        let b = ServedKey {
            fairness_id: "b".into(),
            model: "m".into(),
        };
        l.completed(&a, 100, 10);
        l.cut_off(&a, 50, 3);
        l.cut_off(&b, 70, 0);
        let snap = l.snapshot();
        assert_eq!(snap.len(), 2);
        assert_eq!(
            snap[0].1,
            ServedTotals {
                prompt_tokens: 150,
                completion_tokens: 13,
                requests_completed: 1,
                requests_cut_off: 1,
                cut_off_completion_tokens: 3,
            }
        );
        assert_eq!(
            snap[1].1.prompt_tokens, 0,
            "nothing sent: the prompt is not counted"
        );
        assert_eq!(snap[1].1.requests_cut_off, 1);
        assert_eq!(l.total().requests_cut_off, 2);
    }
}
