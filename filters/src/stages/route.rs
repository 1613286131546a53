//! The body router as a pipeline stage: the request flow around the router's decisions
//! ([`crate::router::Router`]).
//!
//! At the request headers it strips client-sent gateway headers (unless an earlier stage,
//! the auth stage, did: [`ClientHeadersStripped`]), answers `/v1/models` itself, lets
//! non-inference paths pass, refuses a `content-length` over the limit, and asks for the
//! body. Once the body is complete, `Router::route` parses it and sets the routing
//! headers; the stage then leaves [`crate::router::RoutedRequest`] in the request's context for the stages
//! after it (quota, usage, billing) and matches the route again, or answers the router's
//! reply (its status left in the context as [`RouterReplied`]). The pipeline tracks the
//! wait for the body; the stage keeps only the request's [`Api`] meanwhile.
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

use scheduler_core::request::Api;

use crate::handoff::HANDOFF_KEY;
use crate::headers::{self, ClientHeadersStripped};
use crate::host::{
    BodyBufferLimit, LocalReply, Random, RequestBody, RequestHeaders, RouteRefresh, Stats,
    StreamState,
};
use crate::pipeline::{reply, BodyProgress, RequestContext, Stage};
use crate::reply::Reply;
use crate::router::models::{self, ModelsRequest};
use crate::router::Router;
use crate::FilterStatus;

/// The body router stage; shares the compiled [`Router`].
#[derive(Clone, Debug)]
pub struct RouteStage {
    router: Arc<Router>,
    /// Whether the pick stage runs later in this pipeline: the [`crate::handoff::Handoff`]
    /// then passes in the request's context, not through the stream's filter state.
    picker_follows: bool,
}

/// The status of the local reply the router answered a request with (in the context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterReplied(pub u16);

/// The API an inference request's body is parsed as, while the stage waits for the body.
struct AwaitedBody(Api);

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

    /// Answer `answer`, counted, its status kept for the stages that bill the request.
    fn refuse<H: LocalReply + Stats + ?Sized>(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        answer: Reply,
    ) -> FilterStatus {
        self.router.count_reply(host, answer.status);
        cx.insert(RouterReplied(answer.status));
        reply(host, &answer)
    }

    /// The request goes on: match the route again on the headers as they are now.
    fn go_on<H: RouteRefresh + ?Sized>(host: &mut H) -> FilterStatus {
        host.refresh_route();
        FilterStatus::Continue
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
        _end_of_stream: bool,
    ) -> FilterStatus {
        let limit = self.router.body_limit();
        // One byte past the router's limit, so the router decides, with its OpenAI-style 413.
        host.ensure_body_buffer(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1));
        if cx.get::<ClientHeadersStripped>().is_none() {
            headers::strip_reserved(host);
            cx.insert(ClientHeadersStripped);
        }
        let path = host.request_header(":path").unwrap_or_default();
        if let Some(request) = ModelsRequest::from_path(&path) {
            let method = host.request_header(":method").unwrap_or_default();
            let answer = models::answer(&request, &method, &self.router.served_names());
            if answer.status == 404 {
                return self.refuse(cx, host, answer);
            }
            self.router.count_models(host);
            return reply(host, &answer);
        }
        let Some(api) = Api::from_path(&path) else {
            self.router.count_passthrough(host);
            return RouteStage::go_on(host);
        };
        let announced = host
            .request_header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok());
        if announced.is_some_and(|len| len > u64::try_from(limit).unwrap_or(u64::MAX)) {
            return self.refuse(cx, host, Reply::too_large(limit));
        }
        // An inference path without a body gets the body's 400 like any other: the driver
        // delivers its (empty) end at once.
        cx.insert(AwaitedBody(api));
        cx.need_request_body();
        FilterStatus::Continue
    }

    fn on_request_body(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        body: BodyProgress,
    ) -> FilterStatus {
        let limit = self.router.body_limit();
        if body.buffered_len > limit {
            return self.refuse(cx, host, Reply::too_large(limit));
        }
        if !body.end_of_stream {
            return FilterStatus::Continue;
        }
        let Some(AwaitedBody(api)) = cx.remove::<AwaitedBody>() else {
            return FilterStatus::Continue;
        };
        let bytes = host.request_body(0, body.buffered_len).unwrap_or_default();
        let (routed, handoff) = match self.router.route(host, api, &bytes) {
            Ok(routed) => routed,
            Err(answer) => return self.refuse(cx, host, answer),
        };
        if self.picker_follows {
            cx.insert(handoff);
        } else if let Some(bytes) = handoff.encode() {
            // Best effort: without it the picker buffers and parses the body itself.
            let _ = host.set_stream_state(HANDOFF_KEY, &bytes);
        }
        cx.insert(routed);
        RouteStage::go_on(host)
    }
}
