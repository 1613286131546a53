//! The KV cache's change log: what a subscriber to the engine's KV events needs to mirror
//! which blocks the prefix cache can serve.
//!
//! The log is off by default (an engine nobody listens to keeps nothing). Once enabled,
//! [`super::BlockPool`] records a block leaving the cache (eviction at allocation) and the
//! cache being reset; the engine records blocks entering it, with their token ids, as their
//! tokens are computed. Consecutive records of the same kind are merged when the result
//! means the same: removals always, stores when the second continues the first's chain
//! (its parent is the first's last block) under the same adapter. The caller drains the
//! log after each batch of engine work and publishes it as one message.

use super::BlockHash;

/// One change of the prefix cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Blocks became findable by hash: `hashes` is a chain, `parent` the block before its
    /// first (none for a sequence's first block), `token_ids` the tokens of every block in
    /// order (`block_size` per block).
    Stored {
        /// The blocks' hashes, in chain order.
        hashes: Vec<BlockHash>,
        /// The hash of the block before the first one, if any.
        parent: Option<BlockHash>,
        /// The blocks' tokens, concatenated.
        token_ids: Vec<u32>,
        /// The adapter the blocks were computed under, if any.
        lora: Option<String>,
    },
    /// Blocks were evicted (no longer findable by hash).
    Removed {
        /// The evicted blocks' hashes.
        hashes: Vec<BlockHash>,
    },
    /// Every cached block was forgotten at once (a prefix-cache reset).
    Cleared,
}

/// The pending changes, when logging is enabled.
#[derive(Debug, Default)]
pub(crate) struct CacheLog {
    enabled: bool,
    events: Vec<CacheEvent>,
}

impl CacheLog {
    pub(crate) fn set_enabled(&mut self, enabled: bool) {
        self.enabled = enabled;
        if !enabled {
            self.events.clear();
        }
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled
    }

    pub(crate) fn removed(&mut self, hash: BlockHash) {
        if !self.enabled {
            return;
        }
        if let Some(CacheEvent::Removed { hashes }) = self.events.last_mut() {
            hashes.push(hash);
            return;
        }
        self.events.push(CacheEvent::Removed { hashes: vec![hash] });
    }

    pub(crate) fn stored(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tokens: impl Iterator<Item = u32>,
        lora: Option<&str>,
    ) {
        if !self.enabled {
            return;
        }
        if let Some(CacheEvent::Stored {
            hashes,
            token_ids,
            lora: last_lora,
            ..
        }) = self.events.last_mut()
        {
            if parent.is_some() && hashes.last().copied() == parent && last_lora.as_deref() == lora
            {
                hashes.push(hash);
                token_ids.extend(tokens);
                return;
            }
        }
        self.events.push(CacheEvent::Stored {
            hashes: vec![hash],
            parent,
            token_ids: tokens.collect(),
            lora: lora.map(str::to_string),
        });
    }

    pub(crate) fn cleared(&mut self) {
        if self.enabled {
            self.events.push(CacheEvent::Cleared);
        }
    }

    pub(crate) fn drain_into(&mut self, out: &mut Vec<CacheEvent>) {
        out.append(&mut self.events);
    }
}

/// The token ids of a simulator byte stream: 4-byte little-endian chunks, a trailing
/// partial chunk zero-padded (the simulator's token model).
pub fn token_ids(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes.chunks(4).map(|c| {
        let mut word = [0u8; 4];
        for (dst, src) in word.iter_mut().zip(c) {
            *dst = *src;
        }
        u32::from_le_bytes(word)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_are_le_words_zero_padded() {
        let ids: Vec<u32> = token_ids(b"abcdef").collect();
        assert_eq!(ids, vec![u32::from_le_bytes(*b"abcd"), 0x6665]);
        assert_eq!(token_ids(b"").count(), 0);
    }

    #[test]
    fn merges_chains_and_removals_only() {
        let mut log = CacheLog::default();
        log.stored(BlockHash(1), None, [1].into_iter(), None);
        assert_eq!(log.events.len(), 0, "disabled: nothing kept");
        log.set_enabled(true);
        log.stored(BlockHash(1), None, [1].into_iter(), None);
        log.stored(BlockHash(2), Some(BlockHash(1)), [2].into_iter(), None);
        log.stored(BlockHash(9), Some(BlockHash(5)), [9].into_iter(), None);
        log.stored(
            BlockHash(10),
            Some(BlockHash(9)),
            [10].into_iter(),
            Some("a"),
        );
        log.removed(BlockHash(1));
        log.removed(BlockHash(2));
        log.cleared();
        let mut out = Vec::new();
        log.drain_into(&mut out);
        assert_eq!(
            out,
            vec![
                CacheEvent::Stored {
                    hashes: vec![BlockHash(1), BlockHash(2)],
                    parent: None,
                    token_ids: vec![1, 2],
                    lora: None
                },
                CacheEvent::Stored {
                    hashes: vec![BlockHash(9)],
                    parent: Some(BlockHash(5)),
                    token_ids: vec![9],
                    lora: None
                },
                CacheEvent::Stored {
                    hashes: vec![BlockHash(10)],
                    parent: Some(BlockHash(9)),
                    token_ids: vec![10],
                    lora: Some("a".into())
                },
                CacheEvent::Removed {
                    hashes: vec![BlockHash(1), BlockHash(2)]
                },
                CacheEvent::Cleared,
            ]
        );
        assert!(log.events.is_empty());
    }
}
