//! Response bodies: a whole buffer, or a live SSE stream fed by the engine that formats each
//! token as it arrives and cancels the engine request if dropped early (client gone), so a
//! cut-off stream stops generating and the ledger records the tokens it had sent.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use super::driver::{EngineHandle, RequestEvent};
use super::engine::RequestId;
use super::prompt::ApiKind;
use super::responses::{sse, PromptTokensDetails, ResponseMeta, SSE_DONE};
use super::served::{ServedKey, ServedLedger};
use super::text;

/// The response body: a whole buffer or a live token stream.
pub enum SimBody {
    /// A complete body, sent once.
    Full(Option<Bytes>),
    /// A server-sent-events stream fed by the engine.
    Stream(Box<TokenStream>),
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            SimBody::Stream(s) => s.poll_next(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            SimBody::Full(None) => SizeHint::with_exact(0),
            SimBody::Stream(_) => SizeHint::default(),
        }
    }
}

/// Cancels the engine request when dropped before it finished.
pub(crate) struct CancelGuard {
    pub(crate) engine: EngineHandle,
    pub(crate) id: RequestId,
    pub(crate) finished: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.engine.cancel(self.id);
        }
    }
}

/// What shapes the text of one completion and how its usage is reported.
pub(crate) struct Generation {
    pub(crate) meta: ResponseMeta,
    pub(crate) seed: u64,
    pub(crate) output_tokens: u32,
    pub(crate) finish_reason: &'static str,
    pub(crate) prompt_tokens: u32,
    /// When the final usage reports cached tokens.
    pub(crate) details: PromptTokensDetails,
    /// Where the response's tokens are accounted.
    pub(crate) ledger: ServedLedger,
    /// The ledger key of this request.
    pub(crate) key: ServedKey,
}

impl Generation {
    fn finish_for(&self, index: u32) -> Option<&'static str> {
        (index + 1 >= self.output_tokens).then_some(self.finish_reason)
    }
}

/// Which usage a stream carries, as vLLM decides it from `stream_options`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamUsage {
    /// The usage-only chunk before `[DONE]` (`include_usage`).
    pub final_chunk: bool,
    /// A running `usage` on every chunk (`continuous_usage_stats`, honoured only with
    /// `include_usage`).
    pub continuous: bool,
}

impl StreamUsage {
    /// vLLM's rule; `no_usage` (an engine without usage reporting) sends none at all.
    pub fn new(include_usage: bool, continuous_usage_stats: bool, no_usage: bool) -> Self {
        let final_chunk = include_usage && !no_usage;
        Self {
            final_chunk,
            continuous: final_chunk && continuous_usage_stats,
        }
    }
}

/// A live SSE stream. Each content chunk carries exactly one token.
pub struct TokenStream {
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    guard: CancelGuard,
    gen: Generation,
    usage: StreamUsage,
    /// Chunks to send, each with the tokens it carries (0 or 1).
    pending: VecDeque<(Bytes, u32)>,
    done: bool,
    /// Content chunks handed to the connection so far.
    sent_tokens: u32,
}

impl TokenStream {
    /// A stream over `rx`'s events, shaped by `gen` and the request's stream options.
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<RequestEvent>,
        guard: CancelGuard,
        gen: Generation,
        usage: StreamUsage,
    ) -> Self {
        Self {
            rx,
            guard,
            gen,
            usage,
            pending: VecDeque::new(),
            done: false,
            sent_tokens: 0,
        }
    }
}

impl TokenStream {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some((b, tokens)) = self.pending.pop_front() {
                self.sent_tokens += tokens;
                return Poll::Ready(Some(b));
            }
            if self.done {
                return Poll::Ready(None);
            }
            match self.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.done = true,
                Poll::Ready(Some(ev)) => self.on_event(ev),
            }
        }
    }

    fn on_event(&mut self, ev: RequestEvent) {
        let g = &self.gen;
        let continuous = self.usage.continuous;
        match ev {
            RequestEvent::Token { index, .. } => {
                if index == 0 && g.meta.kind == ApiKind::Chat {
                    let running = continuous.then_some((g.prompt_tokens, 0));
                    self.pending
                        .push_back((sse(&g.meta.role_chunk(running)), 0));
                }
                let running = continuous.then_some((g.prompt_tokens, index + 1));
                let text = text::token_text(g.seed, index);
                let chunk = g.meta.content_chunk(text, g.finish_for(index), running);
                self.pending.push_back((sse(&chunk), 1));
            }
            RequestEvent::Finished(usage) => {
                self.guard.finished = true;
                g.ledger
                    .completed(&g.key, usage.prompt_tokens, usage.completion_tokens);
                if self.usage.final_chunk {
                    let chunk = g.meta.usage_chunk(&usage, g.details);
                    self.pending.push_back((sse(&chunk), 0));
                }
                self.pending.push_back((Bytes::from_static(SSE_DONE), 0));
                self.done = true;
            }
        }
    }
}

impl Drop for TokenStream {
    fn drop(&mut self) {
        if !self.guard.finished {
            let g = &self.gen;
            g.ledger.cut_off(&g.key, g.prompt_tokens, self.sent_tokens);
        }
    }
}
