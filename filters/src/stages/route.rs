//! The body router as a pipeline stage: [`crate::router::RouterRequest`] kept in the
//! request's context.
//!
//! Around the router's own steps the stage asks the host for the two things only a host can
//! do: buffer a body as large as the router's limit (else Envoy would answer its own
//! plain-text 413 first), and match the route again once the model headers are set (the
//! route on the router's headers is the one used).

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
}

impl RouteStage {
    /// A stage routing with `router`.
    pub fn new(router: Arc<Router>) -> RouteStage {
        RouteStage { router }
    }

    /// The compiled router.
    pub fn router(&self) -> &Router {
        &self.router
    }

    /// The step for the router's `status`; `Continue` re-matches the route.
    fn step<H: RouteRefresh + ?Sized>(
        cx: &mut RequestContext,
        host: &mut H,
        status: FilterStatus,
        waits_for_body: bool,
    ) -> Step {
        match status {
            FilterStatus::Continue => {
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
            .get_or_insert_with(|| {
                if stripped {
                    RouterRequest::after_trust_boundary()
                } else {
                    RouterRequest::new()
                }
            })
            .on_request_headers(&self.router, host, end_of_stream);
        RouteStage::step(cx, host, status, true)
    }

    fn on_request_body(&self, cx: &mut RequestContext, host: &mut H, body: BodyProgress) -> Step {
        let status = cx.get_or_insert_with(RouterRequest::new).on_request_body(
            &self.router,
            host,
            body.buffered_len,
            body.end_of_stream,
        );
        RouteStage::step(cx, host, status, false)
    }
}
