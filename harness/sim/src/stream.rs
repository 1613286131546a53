//! Response bodies: a whole buffer, or a live SSE stream fed by the engine that formats each
//! token as it arrives and cancels the engine request if dropped early (client gone).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

use super::driver::{EngineHandle, RequestEvent};
use super::engine::{RequestId, Usage};
use super::prompt::ApiKind;
use super::responses::{sse, ResponseMeta, SSE_DONE};
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

/// What shapes the text of one completion.
pub(crate) struct Generation {
    pub(crate) meta: ResponseMeta,
    pub(crate) seed: u64,
    pub(crate) output_tokens: u32,
    pub(crate) finish_reason: &'static str,
    pub(crate) prompt_tokens: u32,
}

impl Generation {
    fn finish_for(&self, index: u32) -> Option<&'static str> {
        (index + 1 >= self.output_tokens).then_some(self.finish_reason)
    }
}

/// A live SSE stream.
pub struct TokenStream {
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    guard: CancelGuard,
    gen: Generation,
    include_usage: bool,
    continuous_usage: bool,
    pending: VecDeque<Bytes>,
    done: bool,
    /// Pre-rendered head and tail of a plain content chunk.
    template: (String, String),
}

impl TokenStream {
    /// A stream over `rx`'s events, shaped by `gen` and the request's stream options.
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<RequestEvent>,
        guard: CancelGuard,
        gen: Generation,
        include_usage: bool,
        continuous_usage: bool,
    ) -> Self {
        let template = gen.meta.content_template();
        Self {
            rx,
            guard,
            gen,
            include_usage,
            continuous_usage,
            pending: VecDeque::new(),
            done: false,
            template,
        }
    }
}

impl TokenStream {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if let Some(b) = self.pending.pop_front() {
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
        match ev {
            RequestEvent::Token {
                index,
                cached_tokens,
            } => {
                let running = Usage {
                    prompt_tokens: g.prompt_tokens,
                    completion_tokens: index + 1,
                    cached_tokens,
                };
                let usage = self.continuous_usage.then_some(&running);
                if index == 0 && g.meta.kind == ApiKind::Chat {
                    let zero = Usage {
                        completion_tokens: 0,
                        ..running
                    };
                    let u = self.continuous_usage.then_some(&zero);
                    self.pending.push_back(sse(&g.meta.role_chunk(u)));
                }
                let text = text::token_text(g.seed, index);
                let finish = g.finish_for(index);
                if finish.is_none() && usage.is_none() {
                    let (head, tail) = &self.template;
                    let mut b = String::with_capacity(head.len() + text.len() + tail.len());
                    b.push_str(head);
                    b.push_str(text);
                    b.push_str(tail);
                    self.pending.push_back(Bytes::from(b));
                } else {
                    let chunk = g.meta.content_chunk(text, finish, usage);
                    self.pending.push_back(sse(&chunk));
                }
            }
            RequestEvent::Finished(usage) => {
                self.guard.finished = true;
                if self.include_usage {
                    self.pending.push_back(sse(&g.meta.usage_chunk(&usage)));
                }
                self.pending.push_back(Bytes::from_static(SSE_DONE));
                self.done = true;
            }
        }
    }
}
