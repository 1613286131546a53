//! The part of a pick that needs no shared state: parse the body, hash the prompt into
//! prefix blocks, read the session header, the clock and the random source. It runs before
//! the adapter's lock is taken; on a 128 KB body it is most of the picker's time, which is
//! why [`PreparedPick::from_handoff`] takes the router's parse and hashes instead when the
//! router left them (`crate::handoff`).

use scheduler_core::request::{self, Api, RequestError};
use scheduler_core::types::{BlockHash, Millis, Tokens};

use super::admit::FlowFields;
use super::plan::PoolPlan;
use super::state::PickRequest;
use super::PickerHost;
use crate::codec::{put_string, put_u64s, Reader};
use crate::handoff::Handoff;
use crate::headers::{
    DESTINATION_SUBSET, FAIRNESS_ID, OBJECTIVE, PEER_HOP, SUBSET_METADATA_NAMESPACE,
};

/// The most entries a subset hint keeps (a pool has at most this many members anyway).
const MAX_SUBSET: usize = super::pool::MAX_FOLLOWED_ENDPOINTS;

/// The request's subset hint as `ip:port`s (sorted, each once): from the dynamic metadata
/// `envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset` (the gateway's own
/// config) if present, else the header of that name (a trusted stage's: the router removes
/// a client's copy). Each value is one `ip:port` or a comma-separated list; entries that
/// are no `ip:port` are left out here, and those that are no current member of the pool
/// at the pick (the pool's membership may change meanwhile). `None`: no hint.
fn subset_of<H: PickerHost + ?Sized>(host: &H) -> Option<Vec<String>> {
    let values = host
        .metadata_strings(SUBSET_METADATA_NAMESPACE, DESTINATION_SUBSET)
        .or_else(|| host.request_header(DESTINATION_SUBSET).map(|v| vec![v]))?;
    let mut subset: Vec<String> = values
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|entry| entry.parse::<std::net::SocketAddr>().is_ok())
        .take(MAX_SUBSET)
        .map(str::to_owned)
        .collect();
    subset.sort_unstable();
    subset.dedup();
    Some(subset)
}

/// The request's flow fields, read from its headers only when its pool has flow control.
fn flow_fields<H: PickerHost + ?Sized>(plan: &PoolPlan, host: &H, bytes: u64) -> FlowFields {
    let Some(flow) = plan.flow() else {
        return FlowFields::default();
    };
    let objective = host.request_header(OBJECTIVE);
    flow.fields(
        objective.as_deref(),
        host.request_header(FAIRNESS_ID),
        bytes,
    )
}

/// A request made ready for [`super::PickerShared::pick`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedPick {
    target_model: String,
    block_hashes: Vec<BlockHash>,
    prompt_tokens: Tokens,
    max_output_tokens: Option<u64>,
    /// How many sequences the engine may generate (at least 1).
    output_sequences: u32,
    session: Option<String>,
    flow: FlowFields,
    /// The subset hint's `ip:port`s (sorted, each once); `None`: no hint.
    subset: Option<Vec<String>>,
    /// The request came from a peer cluster's gateway ([`PEER_HOP`]): it is served here.
    from_peer: bool,
    /// The time of the decision.
    pub now: Millis,
    /// The decision's random draw (tie breaks, weighted picks).
    pub random: u64,
}

/// Whether the request came from a peer cluster's gateway; read only for a pool with
/// peers, the one place it changes the pick (a header read per request otherwise).
fn from_peer<H: PickerHost + ?Sized>(plan: &PoolPlan, host: &H) -> bool {
    plan.peers().is_some() && host.request_header(PEER_HOP).is_some()
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
        let block_hashes = match plan.precise() {
            Some(p) => p.keys(api, &parsed.model, body),
            None => plan.block_hashes(&parsed.model, parsed.cache_salt.as_deref(), &parsed.prompt),
        };
        let session = plan
            .session_header()
            .and_then(|name| host.request_header(name));
        let flow = flow_fields(plan, host, body.len() as u64);
        Ok(PreparedPick {
            target_model: parsed.model,
            block_hashes,
            prompt_tokens: parsed.prompt_tokens,
            max_output_tokens: parsed.max_output_tokens,
            output_sequences: parsed.output_sequences.max(1),
            session,
            flow,
            subset: subset_of(host),
            from_peer: from_peer(plan, host),
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
        // The body was not read here: its size is what the router held.
        let bytes = host
            .request_header("content-length")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let flow = flow_fields(plan, host, bytes);
        Some(PreparedPick {
            target_model: handoff.target_model,
            block_hashes,
            prompt_tokens: handoff.prompt_tokens,
            max_output_tokens: handoff.max_output_tokens,
            output_sequences: handoff.output_sequences.max(1),
            session,
            flow,
            subset: subset_of(host),
            from_peer: from_peer(plan, host),
            now: host.now(),
            random: host.random_u64(),
        })
    }

    /// Append the binary encoding (all integers little-endian): `u64` now ‖ `u64` random ‖
    /// `u64` prompt tokens ‖ `u8` flags (bit 0: output cap, bit 1: session, bit 2:
    /// subset, bit 3: from a peer) ‖ `u64` output
    /// cap ‖ `u32` output sequences (at least 1) ‖ `u16` len ‖ target model ‖ `u16` len ‖ session ‖ `u32` count ‖ count × `u64`
    /// block hash ‖ `u32` priority (two's complement) ‖ `u16` len ‖ fairness id ‖ `u64`
    /// body bytes ‖ `u16` count ‖ count × (`u16` len ‖ subset `ip:port`). `None` if a name
    /// is longer than `u16::MAX` bytes or the subset has more than `u16::MAX` entries.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) -> Option<()> {
        out.extend_from_slice(&self.now.0.to_le_bytes());
        out.extend_from_slice(&self.random.to_le_bytes());
        out.extend_from_slice(&self.prompt_tokens.0.to_le_bytes());
        let flags = u8::from(self.max_output_tokens.is_some())
            | u8::from(self.session.is_some()) << 1
            | u8::from(self.subset.is_some()) << 2
            | u8::from(self.from_peer) << 3;
        out.push(flags);
        out.extend_from_slice(&self.max_output_tokens.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.output_sequences.max(1).to_le_bytes());
        put_string(out, &self.target_model)?;
        put_string(out, self.session.as_deref().unwrap_or(""))?;
        put_u64s(out, self.block_hashes.iter().map(|h| h.0))?;
        out.extend_from_slice(&self.flow.priority.to_le_bytes());
        put_string(out, &self.flow.fairness_id)?;
        out.extend_from_slice(&self.flow.bytes.to_le_bytes());
        let subset = self.subset.as_deref().unwrap_or(&[]);
        let count = u16::try_from(subset.len()).ok()?;
        out.extend_from_slice(&count.to_le_bytes());
        for entry in subset {
            put_string(out, entry)?;
        }
        Some(())
    }

    /// Read what [`PreparedPick::encode_into`] wrote; `None` for anything else.
    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Option<PreparedPick> {
        let now = Millis(r.u64()?);
        let random = r.u64()?;
        let prompt_tokens = Tokens(r.u64()?);
        let flags = r.u8()?;
        if flags & !0b1111 != 0 {
            return None;
        }
        let max_output = r.u64()?;
        let output_sequences = r.u32()?;
        if output_sequences == 0 {
            return None;
        }
        let target_model = r.string()?;
        let session = r.string()?;
        // What the encoder writes for an absent value, and nothing else.
        if (flags & 1 == 0 && max_output != 0) || (flags & 2 == 0 && !session.is_empty()) {
            return None;
        }
        let block_hashes = r.u64s()?.into_iter().map(BlockHash).collect();
        let priority = i32::from_le_bytes(r.u32()?.to_le_bytes());
        let fairness_id = r.string()?;
        let bytes = r.u64()?;
        let count = r.u16()?;
        let mut subset: Vec<String> = Vec::new();
        for _ in 0..count {
            // Each entry takes at least its length prefix: a count past the bytes left
            // fails at the first entry that is not there, before any more is kept.
            subset.push(r.string()?);
        }
        // What the encoder writes: no entries without the flag, strictly sorted ones with it.
        if (flags & 4 == 0 && !subset.is_empty()) || subset.windows(2).any(|w| w[0] >= w[1]) {
            return None;
        }
        Some(PreparedPick {
            flow: FlowFields {
                priority,
                fairness_id,
                bytes,
            },
            target_model,
            block_hashes,
            prompt_tokens,
            max_output_tokens: (flags & 1 != 0).then_some(max_output),
            output_sequences,
            session: (flags & 2 != 0).then_some(session),
            subset: (flags & 4 != 0).then_some(subset),
            from_peer: flags & 8 != 0,
            now,
            random,
        })
    }

    /// The request's flow fields (defaults when its pool has no flow control).
    pub fn flow(&self) -> &FlowFields {
        &self.flow
    }

    /// The prompt's chained block hashes.
    pub fn block_hashes(&self) -> &[BlockHash] {
        &self.block_hashes
    }

    /// The session id, if the pool has a session header and the request carries it.
    pub fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// The subset hint's `ip:port`s; `None`: no hint. `Some` of an empty list, or of none
    /// that is a current member: the request is answered 503.
    pub fn subset(&self) -> Option<&[String]> {
        self.subset.as_deref()
    }

    /// Whether the request came from a peer cluster's gateway (it is served here).
    pub fn from_peer(&self) -> bool {
        self.from_peer
    }

    /// What the request keeps after its pick, to correct the state if another endpoint
    /// serves it: its block hashes and session (taken, the pick no longer needs them).
    pub fn take_served_memo(&mut self) -> (Vec<BlockHash>, Option<String>) {
        (core::mem::take(&mut self.block_hashes), self.session.take())
    }

    /// The view [`super::PickerShared::pick`] takes.
    pub fn request(&self) -> PickRequest<'_> {
        PickRequest {
            target_model: &self.target_model,
            block_hashes: &self.block_hashes,
            prompt_tokens: self.prompt_tokens,
            max_output_tokens: self.max_output_tokens,
            output_sequences: self.output_sequences,
            session: self.session.as_deref(),
        }
    }
}
