//! The stages of the request pipeline ([`crate::pipeline`]), one file each:
//!
//! - [`route`]: the body router (parse the body, set the model headers, leave the handoff);
//! - [`pick`]: the endpoint picker (choose an endpoint of the model's pool, hold its
//!   in-flight lease until the request ends);
//! - [`auth`], [`quota`], [`usage`]: tenancy (who the request is, its quota, what it used;
//!   [`tenancy`] holds what they share and the end that settles and bills);
//! - [`testing`]: stages that exercise the host capabilities end to end (pause and resume,
//!   body replacement, chunk rewriting); adapters accept them only in their test builds.
//!
//! A stage wraps the feature's per-request state machine ([`crate::router::RouterRequest`],
//! [`crate::picker::PickerRequest`]), keeps it in the request's context, and maps its
//! statuses onto [`crate::pipeline::Step`]s.

pub mod auth;
pub mod pick;
pub mod quota;
pub mod route;
pub mod tenancy;
pub mod testing;
pub mod usage;

pub use auth::AuthStage;
pub use pick::{PickStage, PickerStore, RemoteAnswer, RemotePicks};
pub use quota::QuotaStage;
pub use route::RouteStage;
pub use tenancy::Tenancy;
pub use usage::UsageStage;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_flow;
#[cfg(test)]
mod tests_tenancy;
