//! Endpoint roles for prefill/decode disaggregation: which phase of a request an endpoint
//! may serve.
//!
//! A pool's configuration gives each endpoint a role (`prefill`, `decode` or `both`; an
//! endpoint without one is `both`), in the words of llm-d's `llm-d.ai/role` pod label. Under
//! `disagg-profile-handler` the decode profile only considers endpoints that can decode and
//! the prefill profile only those that can prefill; the `decode-filter` and
//! `prefill-filter` plugins say the same inside any profile.

use core::fmt;

use serde::{Deserialize, Serialize};

/// The label llm-d puts on a model-server pod to give its role (the same values as here).
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// What an endpoint serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Prefill only: it computes prompts whose decode runs elsewhere.
    Prefill,
    /// Decode only: it receives computed prompts (or computes short ones itself) and
    /// generates.
    Decode,
    /// Either phase, the default (an ordinary, aggregated replica).
    #[default]
    Both,
}

/// A phase a profile schedules for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Computing the prompt.
    Prefill,
    /// Generating (the endpoint the request is sent to).
    Decode,
}

impl Role {
    /// Parses a role as configured or labelled: `prefill`, `decode` or `both`
    /// (llm-d also writes `prefill-decode` for the latter; accepted).
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "prefill" => Some(Role::Prefill),
            "decode" => Some(Role::Decode),
            "both" | "prefill-decode" => Some(Role::Both),
            _ => None,
        }
    }

    /// Whether an endpoint of this role may serve `phase`.
    pub fn serves(self, phase: Phase) -> bool {
        !matches!(
            (self, phase),
            (Role::Prefill, Phase::Decode) | (Role::Decode, Phase::Prefill)
        )
    }

    /// The configured spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Both => "both",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Phase {
    /// `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}
