//! The stages of the request pipeline ([`crate::pipeline`]), one file each:
//!
//! - [`route`]: the body router (parse the body, set the model headers, leave the handoff);
//! - [`pick`]: the endpoint picker (choose an endpoint of the model's pool, hold its
//!   in-flight lease until the request ends);
//! - [`auth`], [`quota`], [`usage`]: tenancy (who the request is, its quota, what it used;
//!   [`tenancy`] holds what they share and the end that settles and bills);
//! - [`priority`]: tells a tenant the priority band its request asked for;
//! - [`export`]: publishes an exported pool's load for the gateways of other clusters;
//! - [`testing`]: stages that exercise the host capabilities end to end (pause and resume,
//!   body replacement, chunk rewriting); adapters accept them only in their test builds.
//!
//! [`build`] assembles them: one function per filter role, which both adapters call.
//!
//! A stage runs its feature's decisions ([`crate::router`], [`crate::picker`], ...) at the
//! pipeline's events and keeps what it knows about one request in the request's context,
//! under a type of its own; the pipeline tracks where the request is (its headers due,
//! waiting for the body, paused) and answers the adapter the stage's
//! [`crate::FilterStatus`].

pub mod auth;
pub mod build;
pub mod export;
pub mod pick;
pub mod priority;
pub mod quota;
pub mod route;
pub mod tenancy;
pub mod testing;
pub mod usage;

pub use auth::AuthStage;
pub use build::{
    gateway_pipeline, picker_pipeline, router_pipeline, PickerRole, RouterRole, StageBox, StageHost,
};
pub use export::ExportStage;
pub use pick::{PickStage, PickerStore, RemoteAnswer, RemotePicks};
pub use quota::QuotaStage;
pub use route::RouteStage;
pub use tenancy::Tenancy;
pub use testing::TestStages;
pub use usage::UsageStage;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod tests_flow;
#[cfg(test)]
mod tests_tenancy;
