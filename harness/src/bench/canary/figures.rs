//! What one arm of the canary demo measured, from its requests: per version (the model
//! that answered) the cache-hit ratio and TTFT, per conversation whether it touched the
//! canary and how often it switched versions, and for a rollback what happened after it.

use std::collections::BTreeMap;

use super::drive::Sent;
use crate::load::summary::percentile;
use crate::load::RequestRecord;

/// Which requests the canary answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Canary {
    /// Those whose answer names this model (a rewrite inside one pool).
    Model(String),
    /// Those the replica at this `ip:port` served (the canary pool's replica).
    Replica(String),
}

impl Canary {
    /// Whether the canary answered `r`.
    pub fn answered(&self, r: &RequestRecord) -> bool {
        match self {
            Canary::Model(m) => r.model.as_deref() == Some(m.as_str()),
            Canary::Replica(a) => r.served_by.as_deref() == Some(a.as_str()),
        }
    }
}

/// Figures of the requests one version answered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Version {
    /// Requests answered.
    pub requests: usize,
    /// Σ prompt tokens.
    pub prompt_tokens: u64,
    /// Σ cached prompt tokens.
    pub cached_tokens: u64,
    /// TTFT p50 in seconds.
    pub ttft_p50_s: f64,
    /// Of turns 2 and later only (the turns a cache can serve): Σ cached ÷ Σ prompt.
    pub later_hit_ratio: f64,
    /// TTFT p50 of turns 2 and later, in seconds.
    pub later_ttft_p50_s: f64,
}

impl Version {
    /// Σ cached ÷ Σ prompt (0 without requests).
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.cached_tokens, self.prompt_tokens)
    }

    fn of<'a>(sent: impl Iterator<Item = &'a Sent> + Clone) -> Version {
        let ttft = |later: bool| {
            let mut t: Vec<f64> = sent
                .clone()
                .filter(|s| !later || s.record.turn > 0)
                .filter_map(|s| s.record.ttft_s)
                .collect();
            t.sort_by(f64::total_cmp);
            percentile(&t, 50.0)
        };
        let sum = |later: bool, f: fn(&Sent) -> u64| -> u64 {
            sent.clone()
                .filter(|s| !later || s.record.turn > 0)
                .map(f)
                .sum()
        };
        Version {
            requests: sent.clone().count(),
            prompt_tokens: sum(false, |s| s.record.prompt_tokens),
            cached_tokens: sum(false, |s| s.record.cached_tokens),
            ttft_p50_s: ttft(false),
            later_hit_ratio: ratio(
                sum(true, |s| s.record.cached_tokens),
                sum(true, |s| s.record.prompt_tokens),
            ),
            later_ttft_p50_s: ttft(true),
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// One arm's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Arm {
    /// Column label.
    pub label: String,
    /// Requests sent.
    pub requests: usize,
    /// Requests that failed (not a 200 with its stream read to the end).
    pub failed: usize,
    /// The stable version's requests.
    pub stable: Version,
    /// The canary's requests.
    pub canary: Version,
    /// Conversations.
    pub conversations: usize,
    /// Conversations with at least one turn on the canary.
    pub touched_canary: usize,
    /// Conversations with every turn on the canary.
    pub wholly_canary: usize,
    /// Conversations with turns on both versions.
    pub mixed: usize,
    /// Turn-to-turn changes of version, over every conversation.
    pub switches: usize,
    /// How the canary's answers were told apart.
    pub told_by: Canary,
}

impl Arm {
    /// The figures of `sent`; every answer not the canary's is the stable version's.
    pub fn of(label: &str, sent: &[Sent], canary: &Canary) -> Arm {
        let ok = || sent.iter().filter(|s| s.record.ok());
        let is_canary = |s: &Sent| canary.answered(&s.record);
        let mut by_conv: BTreeMap<u32, Vec<(u32, bool)>> = BTreeMap::new();
        for s in ok() {
            by_conv
                .entry(s.record.conversation)
                .or_default()
                .push((s.record.turn, is_canary(s)));
        }
        let mut switches = 0;
        let (mut touched, mut wholly, mut mixed) = (0, 0, 0);
        for turns in by_conv.values_mut() {
            turns.sort();
            let on: usize = turns.iter().filter(|t| t.1).count();
            touched += usize::from(on > 0);
            wholly += usize::from(on == turns.len());
            mixed += usize::from(on > 0 && on < turns.len());
            switches += turns.windows(2).filter(|w| w[0].1 != w[1].1).count();
        }
        Arm {
            label: label.to_owned(),
            requests: sent.len(),
            failed: sent.iter().filter(|s| !s.record.ok()).count(),
            stable: Version::of(ok().filter(|s| !is_canary(s))),
            canary: Version::of(ok().filter(|s| is_canary(s))),
            conversations: by_conv.len(),
            touched_canary: touched,
            wholly_canary: wholly,
            mixed,
            switches,
            told_by: canary.clone(),
        }
    }

    /// The canary's share of the answered requests.
    pub fn canary_request_share(&self) -> f64 {
        let n = self.stable.requests + self.canary.requests;
        ratio(self.canary.requests as u64, n as u64)
    }
}

/// What a rollback did to the requests around it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rollback {
    /// Seconds into the run when the client was pointed at the rolled-back gateway.
    pub at_s: f64,
    /// How long the old gateway took to finish the requests it had, in seconds.
    pub drain_s: f64,
    /// Requests started after the rollback.
    pub after: usize,
    /// Of those, answered by the canary (a correct rollback: none).
    pub after_on_canary: usize,
    /// Requests that failed over the whole run (a rollback without loss: none).
    pub failed: usize,
    /// Conversations that had been on the canary and sent a turn after the rollback.
    pub moved_conversations: usize,
    /// TTFT p50 of the first turn after the rollback of those conversations (their first
    /// turn on the stable version: nothing of them is cached there), in seconds.
    pub moved_first_ttft_p50_s: f64,
    /// TTFT p50 of every other turn started after the rollback, in seconds.
    pub others_after_ttft_p50_s: f64,
    /// Cache-hit ratio (Σ cached ÷ Σ prompt) of the requests started before the rollback.
    pub before_hit_ratio: f64,
    /// Cache-hit ratio of the requests started after it.
    pub after_hit_ratio: f64,
}

impl Rollback {
    /// The rollback's figures: `at_s` when the client switched, `drain_s` the old
    /// gateway's drain time.
    pub fn of(sent: &[Sent], canary: &Canary, at_s: f64, drain_s: f64) -> Rollback {
        let on_canary = |s: &Sent| canary.answered(&s.record);
        let mut was_canary: BTreeMap<u32, bool> = BTreeMap::new();
        for s in sent.iter().filter(|s| s.started_s < at_s && on_canary(s)) {
            was_canary.insert(s.record.conversation, true);
        }
        let mut after: Vec<&Sent> = sent.iter().filter(|s| s.started_s >= at_s).collect();
        after.sort_by(|a, b| a.started_s.total_cmp(&b.started_s));
        let mut moved_first = Vec::new();
        let mut others = Vec::new();
        let mut seen: BTreeMap<u32, ()> = BTreeMap::new();
        for s in &after {
            let conv = s.record.conversation;
            let Some(t) = s.record.ttft_s else { continue };
            if was_canary.contains_key(&conv) && seen.insert(conv, ()).is_none() {
                moved_first.push(t);
            } else {
                others.push(t);
            }
        }
        moved_first.sort_by(f64::total_cmp);
        others.sort_by(f64::total_cmp);
        let hits = |after: bool| {
            let (mut cached, mut prompt) = (0, 0);
            for s in sent
                .iter()
                .filter(|s| s.record.ok() && (s.started_s >= at_s) == after)
            {
                cached += s.record.cached_tokens;
                prompt += s.record.prompt_tokens;
            }
            ratio(cached, prompt)
        };
        Rollback {
            at_s,
            drain_s,
            after: after.len(),
            after_on_canary: after.iter().filter(|s| on_canary(s)).count(),
            failed: sent.iter().filter(|s| !s.record.ok()).count(),
            moved_conversations: moved_first.len(),
            moved_first_ttft_p50_s: percentile(&moved_first, 50.0),
            others_after_ttft_p50_s: percentile(&others, 50.0),
            before_hit_ratio: hits(false),
            after_hit_ratio: hits(true),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::load::RequestRecord;

    fn sent(conv: u32, turn: u32, model: &str, cached: u64, at: f64) -> Sent {
        Sent {
            record: RequestRecord {
                conversation: conv,
                turn,
                status: 200,
                ttft_s: Some(if cached > 0 { 0.01 } else { 0.2 }),
                prompt_tokens: 100,
                cached_tokens: cached,
                model: Some(model.into()),
                ..RequestRecord::default()
            },
            started_s: at,
        }
    }

    #[test]
    fn versions_conversations_and_switches_are_counted() {
        let s = vec![
            sent(0, 0, "a", 0, 0.0),
            sent(0, 1, "a", 90, 1.0),
            sent(1, 0, "a", 0, 0.0),
            sent(1, 1, "c", 0, 1.0),
            sent(1, 2, "a", 50, 2.0),
            sent(2, 0, "c", 0, 0.0),
            sent(2, 1, "c", 80, 1.0),
        ];
        let c = Canary::Model("c".into());
        let arm = Arm::of("x", &s, &c);
        assert_eq!((arm.requests, arm.failed, arm.conversations), (7, 0, 3));
        assert_eq!(
            (arm.touched_canary, arm.wholly_canary, arm.mixed),
            (2, 1, 1)
        );
        assert_eq!(arm.switches, 2);
        assert_eq!((arm.stable.requests, arm.canary.requests), (4, 3));
        assert!((arm.stable.hit_ratio() - 140.0 / 400.0).abs() < 1e-9);
        assert!((arm.canary.later_hit_ratio - 80.0 / 200.0).abs() < 1e-9);
        assert!((arm.canary_request_share() - 3.0 / 7.0).abs() < 1e-9);
        let r = Rollback::of(&s, &c, 0.5, 0.1);
        assert_eq!((r.after, r.after_on_canary, r.failed), (4, 2, 0));
        assert_eq!(
            r.moved_conversations, 1,
            "conversation 2 was on the canary before"
        );
        assert!((r.moved_first_ttft_p50_s - 0.01).abs() < 1e-9);
        assert!((r.before_hit_ratio - 0.0).abs() < 1e-9);
        assert!((r.after_hit_ratio - 220.0 / 400.0).abs() < 1e-9);
        let by_replica = Canary::Replica("127.0.0.1:4".into());
        let mut rec = RequestRecord {
            served_by: Some("127.0.0.1:4".into()),
            ..RequestRecord::default()
        };
        assert!(by_replica.answered(&rec) && !c.answered(&rec));
        rec.served_by = Some("127.0.0.1:3".into());
        assert!(!by_replica.answered(&rec));
    }
}
