//! The request pipeline: every feature of the gateway is a [`Stage`] of one per-request
//! pipeline, and each adapter hosts "a pipeline of these stages" without knowing any of
//! them.
//!
//! - A [`Stage`] has request-side entry points (headers; the body, if it asks for it; resume
//!   after a pause) that answer a [`crate::FilterStatus`] (`Continue`, `Pause`, `Replied`),
//!   and response-side ones (headers, each chunk as it passes, the end with its
//!   [`EndCause`]).
//! - One [`RequestContext`] per request holds every stage's data about it, each under a
//!   type of its own, so adding a stage touches neither the driver nor the adapters.
//! - The driver ([`Pipeline`] + [`Run`]) runs the configured stages in order, holds the
//!   request while one waits for the body or for a wake, resumes the one that paused when
//!   the host wakes it, and guarantees each stage one `on_end` on every end path. An adapter
//!   turns host events into `Run` calls and the same [`crate::FilterStatus`] it gets back
//!   into its host's statuses; it holds a `Run` for as long as the host's stream lives, so the
//!   context (and any lease in it) is dropped with the stream.
//!
//! The stages themselves live in [`crate::stages`], and its builder
//! ([`crate::stages::build`]) assembles each filter's pipeline.

mod context;
mod driver;
mod stage;

pub use context::RequestContext;
pub use driver::{Pipeline, Run, SyncPipeline};
pub use stage::{reply, BodyProgress, EndCause, Stage};

#[cfg(test)]
mod tests;
