//! The body router as a pipeline stage: [`crate::router::RouterRequest`] kept in the
//! request's context.
//!
//! Around the router's own steps the stage asks the host for the two things only a host can
//! do: buffer a body as large as the router's limit (else Envoy would answer its own
//! plain-text 413 first), and match the route again once the model headers are set (the
//! route on the router's headers is the one used).
//!
//! The router's [`crate::handoff::Handoff`] goes to the stream's filter state, for a picker
//! in a later filter; in a pipeline whose pick stage follows
//! ([`RouteStage::before_pick_stage`]) it stays in the request's context instead, where the
//! pick stage takes it.

use std::sync::Arc;

use crate::headers::ClientHeadersStripped;
use crate::host::{
    BodyBufferLimit, LocalReply, Random, RequestBody, RequestHeaders, RouteRefresh, Stats,
    StreamState,
};
use crate::pipeline::{BodyProgress, RequestContext, Stage, Step};
use crate::router::{Router, RouterRequest};
use crate::FilterStatus;

/// The body router stage; shares the compiled [`Router`].
#[derive(Clone, Debug)]
pub struct RouteStage {
    router: Arc<Router>,
    /// Whether the pick stage runs later in this pipeline: the [`crate::handoff::Handoff`] then passes in
    /// the request's context, not through the stream's filter state.
    picker_follows: bool,
}

impl RouteStage {
    /// A stage routing with `router`, handing off to a picker in a later filter.
    pub fn new(router: Arc<Router>) -> RouteStage {
        RouteStage {
            router,
            picker_follows: false,
        }
    }

    /// The same stage in a pipeline whose pick stage follows it: the handoff is left in
    /// the request's context, so it is neither encoded nor copied through Envoy.
    pub fn before_pick_stage(self) -> RouteStage {
        RouteStage {
            picker_follows: true,
            ..self
        }
    }

    /// The compiled router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// A new request's router state.
    fn new_request(&self, stripped: bool) -> RouterRequest {
        let request = if stripped {
            RouterRequest::after_trust_boundary()
        } else {
            RouterRequest::new()
        };
        if self.picker_follows {
            request.keeping_handoff()
        } else {
            request
        }
    }

    /// The step for the router's `status`; `Continue` re-matches the route and leaves a
    /// kept handoff in the context.
    fn step<H: RouteRefresh + ?Sized>(
        cx: &mut RequestContext,
        host: &mut H,
        status: FilterStatus,
        waits_for_body: bool,
    ) -> Step {
        match status {
            FilterStatus::Continue => {
                if let Some(handoff) = cx
                    .get_mut::<RouterRequest>()
                    .and_then(RouterRequest::take_handoff)
                {
                    cx.insert(handoff);
                }
                host.refresh_route();
                Step::Next
            }
            FilterStatus::Pause => {
                if waits_for_body {
                    cx.need_request_body();
                }
                Step::Next
            }
            FilterStatus::Replied => Step::Replied,
        }
    }
}

impl<H> Stage<H> for RouteStage
where
    H: RequestHeaders
        + RequestBody
        + LocalReply
        + Stats
        + StreamState
        + RouteRefresh
        + BodyBufferLimit
        + Random
        + ?Sized,
{
    fn name(&self) -> &'static str {
        "route"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        end_of_stream: bool,
    ) -> Step {
        let limit = u64::try_from(self.router.body_limit()).unwrap_or(u64::MAX);
        // One byte past the router's limit, so the router decides, with its OpenAI-style 413.
        host.ensure_body_buffer(limit.saturating_add(1));
        let stripped = cx.get::<ClientHeadersStripped>().is_some();
        let status = cx
            .get_or_insert_with(|| self.new_request(stripped))
            .on_request_headers(&self.router, host, end_of_stream);
        RouteStage::step(cx, host, status, true)
    }

    fn on_request_body(&self, cx: &mut RequestContext, host: &mut H, body: BodyProgress) -> Step {
        let status = cx
            .get_or_insert_with(|| self.new_request(false))
            .on_request_body(&self.router, host, body.buffered_len, body.end_of_stream);
        RouteStage::step(cx, host, status, false)
    }
}
