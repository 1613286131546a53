//! What a stage is: the entry points the driver calls. Each request-side entry point
//! answers a [`FilterStatus`], the one status type from a stage through the driver to the
//! adapter.

use crate::host::LocalReply;
use crate::reply::Reply;
use crate::FilterStatus;

use super::context::RequestContext;

/// Answer the request with `reply` and stop it: what a stage returns to reply locally.
pub fn reply<H: LocalReply + ?Sized>(host: &mut H, reply: &Reply) -> FilterStatus {
    host.send_local_reply(reply);
    FilterStatus::Replied
}

/// How much of the request body the host holds, as a body event reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BodyProgress {
    /// Bytes received so far (all of them buffered while any stage waits for the body).
    pub buffered_len: usize,
    /// Whether the body is complete.
    pub end_of_stream: bool,
}

/// Why a request's pipeline ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndCause {
    /// The response reached its end (whoever produced it: an upstream, or another filter).
    Completed,
    /// The stream ended before its response did (client gone, upstream reset, timeout).
    Reset,
    /// A stage of this pipeline answered the request locally.
    LocalReply,
}

/// One feature of the request pipeline. A stage is configuration shared by every request
/// (`&self`); what it knows about one request lives in the [`RequestContext`], under a type
/// of its own. `H` is the host type of the adapter that runs it; a stage asks for the
/// capabilities it uses as bounds on `H` in its `impl`, so a pipeline type-checks only on
/// hosts that offer what its stages need.
///
/// Request side, in pipeline order, each entry point at most once per request unless noted:
/// [`Stage::on_request_headers`], then (only if it asked with
/// [`RequestContext::need_request_body`]) [`Stage::on_request_body`] on every body event
/// until the body is complete, and [`Stage::on_resume`] after each
/// [`FilterStatus::Pause`]. A stage sees the request only after every stage before it is
/// done with it. Each answers `Continue` (done with this part of the request: the next
/// stage is due, or, for a stage that asked for the body, the next body event), `Pause`
/// (hold the request until the host wakes it: the stage took a [`crate::host::Waker`]
/// before answering), or `Replied` (the stage answered the request through [`reply`]: the
/// request side stops). Response side, in
/// reverse order (as Envoy runs encoder filters): [`Stage::on_response_headers`], then
/// [`Stage::on_response_chunk`] for each chunk as it passes (unbuffered), and finally
/// [`Stage::on_end`] exactly once for every stage, on every end path. Every method has a
/// pass-through default.
pub trait Stage<H: ?Sized> {
    /// The stage's name in configuration and logs.
    fn name(&self) -> &'static str;

    /// Request headers arrived (`end_of_stream`: the request has no body).
    fn on_request_headers(
        &self,
        _cx: &mut RequestContext,
        _host: &mut H,
        _end_of_stream: bool,
    ) -> FilterStatus {
        FilterStatus::Continue
    }

    /// The request body grew (`body.end_of_stream`: it is complete and readable through
    /// [`crate::host::RequestBody`]). Called only for a stage that asked for the body;
    /// `Continue` before the end means "keep buffering", at the end "done with it".
    fn on_request_body(
        &self,
        _cx: &mut RequestContext,
        _host: &mut H,
        _body: BodyProgress,
    ) -> FilterStatus {
        FilterStatus::Continue
    }

    /// The host woke the request this stage paused. Wakes may be spurious: a stage whose
    /// reason to wait is still there answers `Pause` again.
    fn on_resume(&self, _cx: &mut RequestContext, _host: &mut H) -> FilterStatus {
        FilterStatus::Continue
    }

    /// The host woke the request while no stage held it: another request signalled it
    /// (flow control evicting it). A stage that stops the request answers it through
    /// [`reply`] and returns `Replied`, or resets the stream once its response has started
    /// and returns `Continue` (the end follows); a stage the wake is not for returns
    /// `Continue`. Wakes may be spurious.
    fn on_signal(&self, _cx: &mut RequestContext, _host: &mut H) -> FilterStatus {
        FilterStatus::Continue
    }

    /// Response headers arrived (`end_of_stream`: the response has no body).
    fn on_response_headers(&self, _cx: &mut RequestContext, _host: &mut H, _end_of_stream: bool) {}

    /// One response chunk is passing (read or rewrite it through
    /// [`crate::host::ResponseChunk`]); `end_of_stream`: it is the last.
    fn on_response_chunk(&self, _cx: &mut RequestContext, _host: &mut H, _end_of_stream: bool) {}

    /// The request ended. Give back what the request holds here (in-flight leases).
    fn on_end(&self, _cx: &mut RequestContext, _host: &mut H, _cause: EndCause) {}
}
