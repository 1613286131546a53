//! Small newtypes shared by every module of the core, so signatures say what they hold.

use serde::{Deserialize, Serialize};

/// A chained 64-bit hash of one prompt block (see [`crate::prefix`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct BlockHash(pub u64);

/// A number of tokens (estimated or reported).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Tokens(pub u64);

/// Milliseconds on the host's clock. The core never reads a clock: callers pass `now`.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    /// Time elapsed from `earlier` to `self`, zero if the clock went backwards.
    pub fn since(self, earlier: Millis) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// What this proxy has sent to one endpoint and not yet seen finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct InFlight {
    /// Requests in flight.
    pub requests: u32,
    /// Estimated tokens (prompt + expected output) of those requests.
    pub tokens: Tokens,
    /// Those of the requests whose response has not started yet: prefills in progress (or
    /// waiting in the engine's queue).
    #[serde(default)]
    pub prefilling: u32,
}
