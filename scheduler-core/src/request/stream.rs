//! A byte stream that stores at most a fixed number of leading bytes and counts the rest.
//!
//! The canonical prompt is only ever hashed up to `maxPrefixTokensToMatch` × 4 bytes, but its
//! full length is the prompt-token estimate. A [`Stream`] keeps both: [`Stream::bytes`] is
//! always a prefix of what was written (at most `limit` bytes), [`Stream::len`] the length of
//! everything written. Writers never need to know where the limit is; a request that expands
//! (floats, escapes, batches of token ids) costs its length in counting, not in memory.

use alloc::vec::Vec;

/// Leading bytes of a stream (at most `limit`), and its full length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stream {
    /// A prefix of the stream; shorter than `len` once the limit was reached.
    bytes: Vec<u8>,
    /// Bytes written in all, stored or not.
    len: usize,
    /// The most bytes stored.
    limit: usize,
}

impl Stream {
    /// An empty stream storing at most `limit` bytes, with room reserved for `capacity`.
    pub fn with_limit(limit: usize, capacity: usize) -> Self {
        Stream {
            bytes: Vec::with_capacity(capacity.min(limit)),
            len: 0,
            limit,
        }
    }

    /// A stream that already holds `bytes` (all stored) and may store `room` more.
    pub fn resume(bytes: Vec<u8>, room: usize) -> Self {
        let len = bytes.len();
        Stream {
            limit: len.saturating_add(room),
            bytes,
            len,
        }
    }

    /// An empty stream that stores everything.
    pub fn unbounded() -> Self {
        Stream::with_limit(usize::MAX, 0)
    }

    /// Bytes written in all (stored or counted).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stored prefix.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether every byte written is stored.
    pub fn is_complete(&self) -> bool {
        self.bytes.len() == self.len
    }

    /// The stored prefix, taken out of the stream.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// How many bytes written from logical position `pos` on would still be stored: a
    /// nested writer whose output lands at `pos` or later never needs to keep more.
    pub fn room_from(&self, pos: usize) -> usize {
        if pos > self.bytes.len() && !self.is_complete() {
            0
        } else {
            self.limit.saturating_sub(pos)
        }
    }

    /// Appends `b`: the part that fits is stored, all of it is counted.
    pub fn extend_from_slice(&mut self, b: &[u8]) {
        // Once a byte was dropped nothing after it may be stored, or the prefix would have a hole.
        if self.is_complete() {
            let take = self.limit.saturating_sub(self.bytes.len()).min(b.len());
            if let Some(head) = b.get(..take) {
                self.bytes.extend_from_slice(head);
            }
        }
        self.len = self.len.saturating_add(b.len());
    }

    /// Runs `write` on the stored bytes themselves, when the stream is complete and could
    /// store `bound` more bytes: the fast path's string decoder appends there without a
    /// limit check per run. Should `write` append more than `bound` after all, the stored
    /// bytes are cut back to the limit (they stay a prefix); `None` if the stream cannot.
    pub fn write_direct<R>(
        &mut self,
        bound: usize,
        write: impl FnOnce(&mut Vec<u8>) -> R,
    ) -> Option<R> {
        if !self.is_complete() || self.limit.saturating_sub(self.bytes.len()) < bound {
            return None;
        }
        let r = write(&mut self.bytes);
        self.len = self.bytes.len();
        self.bytes.truncate(self.limit);
        Some(r)
    }

    /// This stream with `head` (each in order) put before it: the stream appending all of
    /// them to an empty stream of this one's limit would give. When every part is complete,
    /// the head is inserted into this stream's own buffer, so the (long) prompt is moved
    /// once rather than copied into a second buffer of its size.
    pub fn prepend(self, head: &[&Stream]) -> Stream {
        if !self.is_complete() || head.iter().any(|h| !h.is_complete()) {
            let total = head.iter().fold(self.len, |n, h| n.saturating_add(h.len));
            let mut all = Stream::with_limit(self.limit, total);
            for h in head {
                all.append(h);
            }
            all.append(&self);
            return all;
        }
        let Stream {
            mut bytes,
            len,
            limit,
        } = self;
        let front: usize = head.iter().map(|h| h.bytes.len()).sum();
        // Only what will stay below the limit is moved.
        bytes.truncate(limit.saturating_sub(front));
        let tail = bytes.len();
        bytes.resize(tail.saturating_add(front), 0);
        bytes.copy_within(..tail, front);
        let mut at = 0;
        for h in head {
            let n = h.bytes.len();
            if let Some(dst) = bytes.get_mut(at..at + n) {
                dst.copy_from_slice(&h.bytes);
            }
            at += n;
        }
        let len = head.iter().fold(len, |n, h| n.saturating_add(h.len));
        bytes.truncate(limit);
        Stream { bytes, len, limit }
    }

    /// Appends one byte.
    pub fn push(&mut self, b: u8) {
        self.extend_from_slice(&[b]);
    }

    /// Appends another stream: its stored prefix, then its counted rest.
    pub fn append(&mut self, other: &Stream) {
        self.extend_from_slice(&other.bytes);
        self.count(other.len - other.bytes.len());
    }

    /// Counts `n` bytes that were never stored (so nothing after them can be either).
    pub fn count(&mut self, n: usize) {
        self.len = self.len.saturating_add(n);
    }

    /// Cuts the stream back to its first `at` bytes (no-op if it is not longer).
    pub fn truncate(&mut self, at: usize) {
        if at < self.len {
            self.len = at;
            self.bytes.truncate(at);
        }
    }

    /// Empties the stream (the limit stays).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// The stored bytes from logical position `start` on (empty if none are stored).
    pub fn stored_from(&self, start: usize) -> &[u8] {
        self.bytes.get(start..).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::Stream;

    #[test]
    fn stores_up_to_the_limit_and_counts_the_rest() {
        let mut s = Stream::with_limit(5, 100);
        s.extend_from_slice(b"abc");
        s.extend_from_slice(b"defg");
        s.push(b'h');
        assert_eq!(
            (s.bytes(), s.len(), s.is_complete()),
            (&b"abcde"[..], 8, false)
        );
        s.truncate(4);
        assert_eq!(
            (s.bytes(), s.len(), s.is_complete()),
            (&b"abcd"[..], 4, true)
        );
        s.extend_from_slice(b"xy");
        assert_eq!(s.bytes(), b"abcdx");
    }

    #[test]
    fn appending_a_cut_stream_leaves_no_hole() {
        let mut inner = Stream::with_limit(2, 0);
        inner.extend_from_slice(b"1234");
        let mut outer = Stream::with_limit(10, 0);
        outer.append(&inner);
        outer.extend_from_slice(b"z");
        // "34" were never stored, so "z" may not follow "12" in the prefix.
        assert_eq!((outer.bytes(), outer.len()), (&b"12"[..], 5));
        assert_eq!(outer.room_from(outer.len()), 0);
    }

    #[test]
    fn prepending_gives_what_appending_in_order_gives() {
        let text = |n: usize, limit: usize| {
            let mut s = Stream::with_limit(limit, 0);
            s.extend_from_slice(&b"0123456789abcdefghij"[..n]);
            s
        };
        for limit in [0, 1, 3, 5, 8, 12, 20, 40, usize::MAX] {
            for (a, b, c) in [(0, 0, 0), (3, 0, 7), (0, 4, 7), (3, 4, 0), (5, 6, 20)] {
                for inner in [usize::MAX, 4] {
                    let (tools, system) = (text(a, inner), text(b, inner));
                    let prompt = text(c, limit);
                    let mut all = Stream::with_limit(limit, 0);
                    all.append(&tools);
                    all.append(&system);
                    all.append(&prompt);
                    assert_eq!(
                        prompt.prepend(&[&tools, &system]),
                        all,
                        "limit {limit} parts {a} {b} {c} inner {inner}"
                    );
                }
            }
        }
    }

    #[test]
    fn room_from_a_position() {
        let mut s = Stream::with_limit(8, 0);
        s.extend_from_slice(b"abc");
        assert_eq!(s.room_from(3), 5);
        assert_eq!(s.room_from(1), 7);
        assert_eq!(s.room_from(4), 4);
        s.extend_from_slice(b"0123456789");
        assert_eq!(s.room_from(9), 0);
        assert_eq!(Stream::unbounded().room_from(0), usize::MAX);
    }
}
