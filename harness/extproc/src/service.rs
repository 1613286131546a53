//! The gRPC service `envoy.service.ext_proc.v3.ExternalProcessor/Process`: one
//! bidirectional stream per HTTP request, answered as an endpoint picker answers it.
//!
//! Envoy's filter is configured with request headers `SEND`, the request body in one of two
//! modes, and nothing of the response. The processor learns the body mode from the
//! `protocol_config` of the stream's first message:
//!
//! - **`FULL_DUPLEX_STREAMED`** (what llm-d's EPP requires): Envoy streams the body in
//!   chunks without waiting for any answer, and forwards upstream only what the processor
//!   streams back. The processor holds the header answer and every chunk until the body is
//!   complete (`end_of_stream`, or the trailers), decides, then answers the headers (the
//!   routing headers, and a route-cache clear so Envoy routes on them), streams the body
//!   back in chunks of at most [`CHUNK_BYTES`] (`StreamedBodyResponse`, the last one with
//!   `end_of_stream`), and answers the trailers if there were any.
//! - **`BUFFERED`** (and any other mode): Envoy waits for the header answer before it sends
//!   the body, so the headers are answered at once with no change; the whole body then
//!   comes in one message, whose answer carries the routing headers and the route-cache
//!   clear (header mutations on a body answer apply in this mode).
//!
//! A request without a body is routed on the headers' answer. A body the [`Router`]
//! refuses gets a local 400 (`ImmediateResponse`).

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingRequest, ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::route::{Route, Router, BASE_MODEL_HEADER, DESTINATION_HEADER};

/// The largest body chunk streamed back to Envoy (the size the API recommends at most).
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Answers in flight per stream before the stream's task waits for Envoy to read them.
const QUEUE: usize = 16;

/// The service: the routing decision shared by every stream.
#[derive(Clone, Debug)]
pub struct Processor {
    router: Arc<Router>,
}

impl Processor {
    /// A processor deciding with `router`.
    pub fn new(router: Router) -> Processor {
        Processor {
            router: Arc::new(router),
        }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = ReceiverStream<Result<ProcessingResponse, Status>>;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(QUEUE);
        let router = Arc::clone(&self.router);
        tokio::spawn(async move {
            let mut stream = StreamState::default();
            loop {
                let msg = match inbound.message().await {
                    Ok(Some(m)) => m,
                    // Envoy closed its side (the request is done) or reset the stream.
                    Ok(None) | Err(_) => return,
                };
                for answer in stream.on_message(&router, msg) {
                    if tx.send(Ok(answer)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// What one stream has seen so far.
#[derive(Debug, Default)]
pub struct StreamState {
    /// The body mode from the first message's `protocol_config`.
    full_duplex: bool,
    /// Full duplex: the body chunks held until the body is complete.
    body: Vec<u8>,
    /// Full duplex: the body (and the header answer) has been sent back.
    body_done: bool,
}

impl StreamState {
    /// The answers to one message from Envoy, in the order they must be sent.
    pub fn on_message(
        &mut self,
        router: &Router,
        msg: ProcessingRequest,
    ) -> Vec<ProcessingResponse> {
        if let Some(cfg) = &msg.protocol_config {
            self.full_duplex = cfg.request_body_mode == BodySendMode::FullDuplexStreamed as i32;
        }
        let Some(request) = msg.request else {
            return Vec::new();
        };
        match request {
            Msg::RequestHeaders(h) if h.end_of_stream => {
                // No body: route on what there is.
                vec![decided(router, &[], Answers::Headers)]
            }
            // Full duplex: the header answer waits for the whole body.
            Msg::RequestHeaders(_) if self.full_duplex => Vec::new(),
            Msg::RequestHeaders(_) => {
                vec![answer(Answer::RequestHeaders(HeadersResponse::default()))]
            }
            Msg::RequestBody(b) if self.full_duplex => {
                if self.body.is_empty() {
                    self.body = b.body;
                } else {
                    self.body.extend_from_slice(&b.body);
                }
                if b.end_of_stream {
                    self.finish_full_duplex(router, true)
                } else {
                    Vec::new()
                }
            }
            Msg::RequestBody(b) => vec![decided(router, &b.body, Answers::Body)],
            Msg::RequestTrailers(_) => {
                let mut out = if self.full_duplex && !self.body_done {
                    // Trailers end a body whose last chunk had no `end_of_stream`.
                    self.finish_full_duplex(router, false)
                } else {
                    Vec::new()
                };
                out.push(answer(Answer::RequestTrailers(TrailersResponse::default())));
                out
            }
            // Not configured to be sent; answered unchanged should a data plane send them.
            Msg::ResponseHeaders(_) => {
                vec![answer(Answer::ResponseHeaders(HeadersResponse::default()))]
            }
            Msg::ResponseBody(_) => vec![answer(Answer::ResponseBody(BodyResponse::default()))],
            Msg::ResponseTrailers(_) => {
                vec![answer(
                    Answer::ResponseTrailers(TrailersResponse::default()),
                )]
            }
        }
    }

    /// Full duplex, the body complete: the header answer (routing headers, route-cache
    /// clear), then the body streamed back; `end` marks its last chunk as the end of the
    /// request (false when trailers follow).
    fn finish_full_duplex(&mut self, router: &Router, end: bool) -> Vec<ProcessingResponse> {
        self.body_done = true;
        let body = std::mem::take(&mut self.body);
        let mut out = Vec::with_capacity(2 + body.len() / CHUNK_BYTES);
        let head = decided(router, &body, Answers::Headers);
        let refused = matches!(head.response, Some(Answer::ImmediateResponse(_)));
        out.push(head);
        if refused {
            return out;
        }
        for (i, chunk) in chunks(&body).enumerate() {
            let last = (i + 1) * CHUNK_BYTES >= body.len();
            out.push(streamed_chunk(chunk.to_vec(), last && end));
        }
        if body.is_empty() && end {
            out.push(streamed_chunk(Vec::new(), true));
        }
        out
    }
}

/// `body` in pieces of at most [`CHUNK_BYTES`] (none for an empty body).
pub fn chunks(body: &[u8]) -> std::slice::Chunks<'_, u8> {
    body.chunks(CHUNK_BYTES)
}

fn answer(response: Answer) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..ProcessingResponse::default()
    }
}

/// Which message a routing answer answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answers {
    Headers,
    Body,
}

/// The routing answer for `body`, to the headers or the body message, or a local 400.
fn decided(router: &Router, body: &[u8], to: Answers) -> ProcessingResponse {
    match router.route(body) {
        Ok(route) => {
            let response = Some(routing(&route));
            answer(match to {
                Answers::Headers => Answer::RequestHeaders(HeadersResponse { response }),
                Answers::Body => Answer::RequestBody(BodyResponse { response }),
            })
        }
        Err(e) => answer(Answer::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: StatusCode::BadRequest as i32,
            }),
            body: format!("the external processor refused the body: {e}").into_bytes(),
            details: "extproc_bad_body".into(),
            ..ImmediateResponse::default()
        })),
    }
}

/// The routing headers of `route`, and the route-cache clear that makes Envoy route on them.
fn routing(route: &Route<'_>) -> CommonResponse {
    CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers: vec![
                set_header(DESTINATION_HEADER, route.endpoint),
                set_header(BASE_MODEL_HEADER, &route.base_model),
            ],
            remove_headers: Vec::new(),
        }),
        clear_route_cache: true,
        ..CommonResponse::default()
    }
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.into(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..HeaderValueOption::default()
    }
}

fn streamed_chunk(body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    answer(Answer::RequestBody(BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..StreamedBodyResponse::default()
                })),
            }),
            ..CommonResponse::default()
        }),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::route::Mode;
    use envoy_types::pb::envoy::service::ext_proc::v3::{
        HttpBody, HttpHeaders, ProtocolConfiguration,
    };
    use proptest::prelude::*;

    fn router() -> Router {
        Router::new(Mode::Null, vec!["10.0.0.1:8000".into()], "sim-model".into()).unwrap()
    }

    fn first(mode: BodySendMode, end_of_stream: bool) -> ProcessingRequest {
        ProcessingRequest {
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: mode as i32,
                ..ProtocolConfiguration::default()
            }),
            request: Some(Msg::RequestHeaders(HttpHeaders {
                end_of_stream,
                ..HttpHeaders::default()
            })),
            ..ProcessingRequest::default()
        }
    }

    fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
        ProcessingRequest {
            request: Some(Msg::RequestBody(HttpBody {
                body: bytes.to_vec(),
                end_of_stream,
                ..HttpBody::default()
            })),
            ..ProcessingRequest::default()
        }
    }

    /// The routing headers and the route-cache flag of an answer's `CommonResponse`.
    fn routing_of(c: &CommonResponse) -> (Vec<(String, String)>, bool) {
        let set = c
            .header_mutation
            .as_ref()
            .map(|m| {
                m.set_headers
                    .iter()
                    .map(|h| {
                        let h = h.header.as_ref().unwrap();
                        (
                            h.key.clone(),
                            String::from_utf8(h.raw_value.clone()).unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        (set, c.clear_route_cache)
    }

    fn routed() -> (Vec<(String, String)>, bool) {
        (
            vec![
                (DESTINATION_HEADER.into(), "10.0.0.1:8000".into()),
                (BASE_MODEL_HEADER.into(), "sim-model".into()),
            ],
            true,
        )
    }

    /// The body chunks streamed back, and whether the last one ended the stream.
    fn streamed(answers: &[ProcessingResponse]) -> (Vec<u8>, Vec<bool>) {
        let mut bytes = Vec::new();
        let mut ends = Vec::new();
        for a in answers {
            let Some(Answer::RequestBody(b)) = &a.response else {
                panic!("not a body answer: {a:?}");
            };
            let m = b.response.as_ref().and_then(|c| c.body_mutation.as_ref());
            let Some(Mutation::StreamedResponse(s)) = m.and_then(|m| m.mutation.as_ref()) else {
                panic!("not a streamed body: {a:?}");
            };
            bytes.extend_from_slice(&s.body);
            ends.push(s.end_of_stream);
        }
        (bytes, ends)
    }

    #[test]
    fn full_duplex_holds_everything_until_the_body_ends_then_routes_and_streams_it_back() {
        let r = router();
        let mut s = StreamState::default();
        assert!(s
            .on_message(&r, first(BodySendMode::FullDuplexStreamed, false))
            .is_empty());
        let whole: Vec<u8> = (0..150_000u32).map(|i| (i % 251) as u8).collect();
        assert!(s.on_message(&r, body(&whole[..70_000], false)).is_empty());
        let out = s.on_message(&r, body(&whole[70_000..], true));
        let Some(Answer::RequestHeaders(h)) = &out[0].response else {
            panic!("the header answer comes first: {out:?}");
        };
        assert_eq!(routing_of(h.response.as_ref().unwrap()), routed());
        let (bytes, ends) = streamed(&out[1..]);
        assert_eq!(bytes, whole, "the body goes upstream unchanged");
        assert_eq!(ends, [false, false, true], "three chunks of at most 64 KiB");
    }

    #[test]
    fn full_duplex_with_trailers_ends_the_body_on_them() {
        let r = router();
        let mut s = StreamState::default();
        s.on_message(&r, first(BodySendMode::FullDuplexStreamed, false));
        assert!(s.on_message(&r, body(b"{}", false)).is_empty());
        let trailers = ProcessingRequest {
            request: Some(Msg::RequestTrailers(Default::default())),
            ..ProcessingRequest::default()
        };
        let out = s.on_message(&r, trailers);
        assert!(matches!(out[0].response, Some(Answer::RequestHeaders(_))));
        assert_eq!(streamed(&out[1..2]), (b"{}".to_vec(), vec![false]));
        assert!(matches!(out[2].response, Some(Answer::RequestTrailers(_))));
    }

    #[test]
    fn buffered_answers_the_headers_at_once_and_routes_on_the_body() {
        let r = router();
        let mut s = StreamState::default();
        let out = s.on_message(&r, first(BodySendMode::Buffered, false));
        let Some(Answer::RequestHeaders(h)) = &out[0].response else {
            panic!("{out:?}");
        };
        assert!(h.response.is_none(), "no change to the headers yet");
        let out = s.on_message(&r, body(b"{\"model\":\"x\"}", true));
        let Some(Answer::RequestBody(b)) = &out[0].response else {
            panic!("{out:?}");
        };
        let c = b.response.as_ref().unwrap();
        assert_eq!(routing_of(c), routed());
        assert!(
            c.body_mutation.is_none(),
            "the buffered body goes on as it is"
        );
    }

    #[test]
    fn a_request_without_body_is_routed_on_its_headers_and_a_bad_body_refused() {
        let r = router();
        for mode in [BodySendMode::Buffered, BodySendMode::FullDuplexStreamed] {
            let out = StreamState::default().on_message(&r, first(mode, true));
            let Some(Answer::RequestHeaders(h)) = &out[0].response else {
                panic!("{out:?}");
            };
            assert_eq!(routing_of(h.response.as_ref().unwrap()), routed());
        }
        let parse = Router::new(Mode::Parse, vec!["10.0.0.1:1".into()], "m".into()).unwrap();
        let mut s = StreamState::default();
        s.on_message(&parse, first(BodySendMode::FullDuplexStreamed, false));
        let out = s.on_message(&parse, body(b"not json", true));
        assert_eq!(out.len(), 1, "nothing streams after a refusal");
        let Some(Answer::ImmediateResponse(i)) = &out[0].response else {
            panic!("{out:?}");
        };
        assert_eq!(i.status.unwrap().code, StatusCode::BadRequest as i32);
    }

    proptest! {
        #[test]
        fn any_split_of_a_body_streams_back_whole(len in 0usize..200_000, cut in 0usize..200_000) {
            let r = router();
            let whole: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
            let cut = cut.min(len);
            let mut s = StreamState::default();
            s.on_message(&r, first(BodySendMode::FullDuplexStreamed, false));
            prop_assert!(s.on_message(&r, body(&whole[..cut], false)).is_empty());
            let out = s.on_message(&r, body(&whole[cut..], true));
            prop_assert!(matches!(out[0].response, Some(Answer::RequestHeaders(_))));
            let (bytes, ends) = streamed(&out[1..]);
            prop_assert_eq!(bytes, whole);
            prop_assert_eq!(ends.iter().filter(|e| **e).count(), 1);
            prop_assert_eq!(ends.last(), Some(&true));
            let small = |a: &ProcessingResponse| match &a.response {
                Some(Answer::RequestBody(b)) => matches!(
                    b.response
                        .as_ref()
                        .and_then(|c| c.body_mutation.as_ref())
                        .and_then(|m| m.mutation.as_ref()),
                    Some(Mutation::StreamedResponse(s)) if s.body.len() <= CHUNK_BYTES
                ),
                _ => false,
            };
            prop_assert!(out[1..].iter().all(small));
        }
    }
}
