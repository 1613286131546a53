//! The part of a pick that needs no shared state: parse the body, hash the prompt into
//! prefix blocks, read the session header, the clock and the random source. It runs before
//! the adapter's lock is taken; on a 128 KB body it is most of the picker's time, which is
//! why [`PreparedPick::from_handoff`] takes the router's parse and hashes instead when the
//! router left them (`crate::handoff`).

use scheduler_core::request::{self, Api, RequestError};
use scheduler_core::types::{BlockHash, Millis, Tokens};

use super::plan::PoolPlan;
use super::state::PickRequest;
use super::PickerHost;
use crate::handoff::Handoff;

/// A request made ready for [`super::PickerShared::pick`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedPick {
    target_model: String,
    block_hashes: Vec<BlockHash>,
    prompt_tokens: Tokens,
    max_output_tokens: Option<u64>,
    session: Option<String>,
    /// The time of the decision.
    pub now: Millis,
    /// The decision's random draw (tie breaks, weighted picks).
    pub random: u64,
}

impl PreparedPick {
    /// Parse `body` as `api`, keeping only the prompt bytes `plan` hashes, and hash them;
    /// reads the session header, the
    /// clock and the random source from `host`.
    pub fn new<H: PickerHost + ?Sized>(
        plan: &PoolPlan,
        api: Api,
        body: &[u8],
        host: &mut H,
    ) -> Result<PreparedPick, RequestError> {
        let parsed = request::parse_with_limit(api, body, plan.max_prompt_bytes())?;
        let block_hashes =
            plan.block_hashes(&parsed.model, parsed.cache_salt.as_deref(), &parsed.prompt);
        let session = plan
            .session_header()
            .and_then(|name| host.request_header(name));
        Ok(PreparedPick {
            target_model: parsed.model,
            block_hashes,
            prompt_tokens: parsed.prompt_tokens,
            max_output_tokens: parsed.max_output_tokens,
            session,
            now: host.now(),
            random: host.random_u64(),
        })
    }

    /// Take the router's `handoff` instead of parsing the body, if it fits `plan`
    /// ([`PoolPlan::handoff_blocks`]); reads the session header, the clock and the random
    /// source from `host`.
    pub fn from_handoff<H: PickerHost + ?Sized>(
        plan: &PoolPlan,
        handoff: Handoff,
        host: &mut H,
    ) -> Option<PreparedPick> {
        let keep = plan.handoff_blocks(&handoff)?;
        let mut block_hashes = handoff.block_hashes;
        block_hashes.truncate(keep);
        let session = plan
            .session_header()
            .and_then(|name| host.request_header(name));
        Some(PreparedPick {
            target_model: handoff.target_model,
            block_hashes,
            prompt_tokens: handoff.prompt_tokens,
            max_output_tokens: handoff.max_output_tokens,
            session,
            now: host.now(),
            random: host.random_u64(),
        })
    }

    /// The prompt's chained block hashes.
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }

    /// The view [`super::PickerShared::pick`] takes.
    pub fn request(&self) -> PickRequest<'_> {
        PickRequest {
            target_model: &self.target_model,
            block_hashes: &self.block_hashes,
            prompt_tokens: self.prompt_tokens,
            max_output_tokens: self.max_output_tokens,
            session: self.session.as_deref(),
        }
    }
}
