//! The top-level `usage` of a non-streamed JSON body, read as the body streams past.
//!
//! A completion body can be hundreds of kilobytes, so it is never held: [`BodyScan`] keeps
//! only its position in the JSON grammar across chunks (nesting depth, inside a string or
//! not, after an escape or not, where it is within a top-level member) and copies exactly
//! one thing: the text of a top-level `usage` object while it passes, at most
//! [`MAX_USAGE_TEXT`] bytes, which is then read by [`super::json::usage_object`]. String
//! contents are skipped with `memchr2`, so the bulk of a body (the generated text) costs
//! little more than a memory scan.

use super::json::usage_object;
use super::Usage;
use alloc::vec::Vec;
use memchr::memchr2;

/// The most bytes of a usage object captured; real ones are a few hundred bytes.
pub const MAX_USAGE_TEXT: usize = 4096;

/// Where the scanner is within a member of the top-level object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Member {
    /// After `{` or `,`: a key comes next.
    Key,
    /// Inside a key string.
    InKey,
    /// After a key, before its `:`.
    Colon,
    /// After the `:`, before the value.
    Value,
    /// Inside the value (or past it, before `,` or `}`).
    InValue,
}

/// The state of one body's scan.
#[derive(Debug)]
pub(crate) struct BodyScan {
    /// Open brackets (0 before the body's first `{`, and again once it closed).
    depth: u32,
    in_string: bool,
    escape: bool,
    /// Whether the top-level value is an object (members are only tracked then).
    top_object: bool,
    member: Member,
    /// The first bytes of the current top-level key (enough to compare with `usage`).
    key: [u8; 8],
    key_len: usize,
    /// The current top-level key is exactly `usage`.
    key_is_usage: bool,
    /// The usage object's text while it streams past.
    capture: Vec<u8>,
    capturing: bool,
    /// The top-level value closed, or the body is not JSON (no more reading either way).
    complete: bool,
    /// The body did not start with an object or array: nothing in it is trusted.
    not_json: bool,
    /// The last top-level usage read.
    usage: Option<Usage>,
}

impl BodyScan {
    pub fn new() -> Self {
        BodyScan {
            depth: 0,
            in_string: false,
            escape: false,
            top_object: false,
            member: Member::Key,
            key: [0; 8],
            key_len: 0,
            key_is_usage: false,
            capture: Vec::new(),
            capturing: false,
            complete: false,
            not_json: false,
            usage: None,
        }
    }

    /// The body's top-level value closed.
    pub fn complete(&self) -> bool {
        self.complete && !self.not_json
    }

    /// The last top-level usage object read with at least one token count.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Scans the next bytes of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while i < chunk.len() && !self.complete {
            // Inside a string nobody needs: jump to its next quote or backslash.
            if self.in_string && !self.escape && !self.capturing && self.member != Member::InKey {
                match chunk.get(i..).and_then(|rest| memchr2(b'"', b'\\', rest)) {
                    Some(k) => i += k,
                    None => return,
                }
            }
            let Some(&b) = chunk.get(i) else {
                return;
            };
            self.byte(b);
            i += 1;
        }
    }

    fn byte(&mut self, b: u8) {
        if self.capturing {
            if self.capture.len() < MAX_USAGE_TEXT {
                self.capture.push(b);
            } else {
                // Too long to be a real usage object: drop it, keep scanning.
                self.capturing = false;
                self.capture.clear();
            }
        }
        let top = self.top_object && self.depth == 1;
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if b == b'\\' {
                self.escape = true;
            } else if b == b'"' {
                self.in_string = false;
                if top && self.member == Member::InKey {
                    self.member = Member::Colon;
                    self.key_is_usage = self.key_len == 5 && self.key.get(..5) == Some(b"usage");
                    return;
                }
            }
            if top && self.member == Member::InKey {
                if let Some(slot) = self.key.get_mut(self.key_len) {
                    *slot = b;
                }
                self.key_len = self.key_len.saturating_add(1);
            }
            return;
        }
        if self.depth == 0 && !matches!(b, b'{' | b'[' | b' ' | b'\t' | b'\n' | b'\r') {
            // Text before the value (an event stream sent as JSON, an HTML error page):
            // reading on from its first brace would take a part for the whole.
            self.not_json = true;
            self.complete = true;
            return;
        }
        match b {
            b'"' => {
                self.in_string = true;
                if top {
                    match self.member {
                        Member::Key => {
                            self.member = Member::InKey;
                            self.key_len = 0;
                        }
                        Member::Value => self.member = Member::InValue,
                        _ => {}
                    }
                }
            }
            b'{' | b'[' => {
                if self.depth == 0 {
                    self.top_object = b == b'{';
                    self.member = Member::Key;
                } else if top && self.member == Member::Value {
                    self.member = Member::InValue;
                    if self.key_is_usage && b == b'{' {
                        self.capturing = true;
                        self.capture.clear();
                        self.capture.push(b);
                    }
                }
                self.depth = self.depth.saturating_add(1);
            }
            b'}' | b']' => {
                if self.depth == 0 {
                    // A stray closer before the body's value: not JSON we can read.
                    return;
                }
                self.depth -= 1;
                if self.depth == 1 && self.capturing {
                    self.capturing = false;
                    if let Some(u) = usage_object(&self.capture, 0).and_then(|(c, _)| c.usage()) {
                        self.usage = Some(u);
                    }
                    self.capture.clear();
                } else if self.depth == 0 {
                    self.complete = true;
                }
            }
            b':' if top && self.member == Member::Colon => self.member = Member::Value,
            b',' if top => self.member = Member::Key,
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ if top && self.member == Member::Value => self.member = Member::InValue,
            _ => {}
        }
    }
}
