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
use super::engine::{RequestId, Usage};
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

/// Cancels the engine requests of one response that have not finished when dropped.
pub(crate) struct CancelGuard {
    pub(crate) engine: EngineHandle,
    /// Each choice's engine request and whether it finished.
    pub(crate) requests: Vec<(RequestId, bool)>,
}

impl CancelGuard {
    /// A guard over `ids`, none finished yet.
    pub(crate) fn new(engine: EngineHandle, ids: Vec<RequestId>) -> Self {
        Self {
            engine,
            requests: ids.into_iter().map(|id| (id, false)).collect(),
        }
    }

    /// Choice `k`'s request finished: nothing to cancel.
    pub(crate) fn finished(&mut self, k: usize) {
        if let Some(r) = self.requests.get_mut(k) {
            r.1 = true;
        }
    }

    /// Whether every request finished.
    pub(crate) fn all_finished(&self) -> bool {
        self.requests.iter().all(|r| r.1)
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        for (id, finished) in &self.requests {
            if !finished {
                self.engine.cancel(*id);
            }
        }
    }
}

/// One choice of a response: the sequence one engine request generates.
pub(crate) struct Choice {
    pub(crate) seed: u64,
    pub(crate) output_tokens: u32,
    pub(crate) finish_reason: &'static str,
    /// The tokens of its prompt.
    pub(crate) prompt_tokens: u32,
    /// The first choice of its prompt: the one whose prompt the usage counts (vLLM counts
    /// each prompt once, however many sequences it has).
    pub(crate) counts_prompt: bool,
}

/// What shapes the text of one response's choices and how its usage is reported.
pub(crate) struct Generation {
    pub(crate) meta: ResponseMeta,
    /// The choices, in their `index` order (for a batch: each prompt's `n` in turn).
    pub(crate) choices: Vec<Choice>,
    /// When the final usage reports cached tokens.
    pub(crate) details: PromptTokensDetails,
    /// Where the response's tokens are accounted.
    pub(crate) ledger: ServedLedger,
    /// The ledger key of this request.
    pub(crate) key: ServedKey,
}

impl Generation {
    fn finish_for(&self, k: usize, index: u32) -> Option<&'static str> {
        let c = self.choices.get(k)?;
        (index + 1 >= c.output_tokens).then_some(c.finish_reason)
    }

    /// The prompt tokens of the whole request: each prompt once.
    pub(crate) fn prompt_tokens(&self) -> u32 {
        self.choices
            .iter()
            .filter(|c| c.counts_prompt)
            .fold(0u32, |sum, c| sum.saturating_add(c.prompt_tokens))
    }

    /// The request's usage from its choices' engine usages: every prompt once (with its
    /// cached tokens), every choice's completion tokens.
    pub(crate) fn total_usage(&self, usages: &[Option<Usage>]) -> Usage {
        let mut total = Usage {
            prompt_tokens: 0,
            completion_tokens: 0,
            cached_tokens: 0,
        };
        for (c, u) in self.choices.iter().zip(usages) {
            let Some(u) = u else { continue };
            if c.counts_prompt {
                total.prompt_tokens = total.prompt_tokens.saturating_add(u.prompt_tokens);
                total.cached_tokens = total.cached_tokens.saturating_add(u.cached_tokens);
            }
            total.completion_tokens = total.completion_tokens.saturating_add(u.completion_tokens);
        }
        total
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

/// A live SSE stream. Each content chunk carries exactly one token of one choice; the
/// choices' engine requests run side by side and their tokens interleave as they come.
pub struct TokenStream {
    /// Each choice's engine events.
    rxs: Vec<mpsc::UnboundedReceiver<RequestEvent>>,
    guard: CancelGuard,
    gen: Generation,
    usage: StreamUsage,
    /// Chunks to send, each with the tokens it carries (0 or 1).
    pending: VecDeque<(Bytes, u32)>,
    done: bool,
    /// The chat role chunks went out (before the first content of any choice).
    roles_sent: bool,
    /// Each choice's engine usage, once it finished.
    finished: Vec<Option<Usage>>,
    /// Content chunks handed to the connection so far.
    sent_tokens: u32,
}

impl TokenStream {
    /// A stream over `rxs`' events (one receiver per choice of `gen`), shaped by `gen` and
    /// the request's stream options.
    pub(crate) fn new(
        rxs: Vec<mpsc::UnboundedReceiver<RequestEvent>>,
        guard: CancelGuard,
        gen: Generation,
        usage: StreamUsage,
    ) -> Self {
        let finished = vec![None; rxs.len()];
        Self {
            rxs,
            guard,
            gen,
            usage,
            pending: VecDeque::new(),
            done: false,
            roles_sent: false,
            finished,
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
            let mut events = Vec::new();
            let mut closed = false;
            for (k, rx) in self.rxs.iter_mut().enumerate() {
                if self.finished.get(k).is_some_and(Option::is_some) {
                    continue;
                }
                match rx.poll_recv(cx) {
                    Poll::Pending => {}
                    Poll::Ready(None) => closed = true,
                    Poll::Ready(Some(ev)) => events.push((k, ev)),
                }
            }
            if events.is_empty() && !closed {
                return Poll::Pending;
            }
            for (k, ev) in events {
                self.on_event(k, ev);
            }
            // An engine that stopped mid-way ends the stream where it is, as one request did.
            if closed && !self.done {
                self.done = true;
            }
        }
    }

    fn on_event(&mut self, k: usize, ev: RequestEvent) {
        let g = &self.gen;
        let continuous = self.usage.continuous;
        let Some(choice) = g.choices.get(k) else {
            return;
        };
        let index = k as u32;
        match ev {
            RequestEvent::Token { index: token, .. } => {
                if !self.roles_sent && g.meta.kind == ApiKind::Chat {
                    self.roles_sent = true;
                    for (i, c) in g.choices.iter().enumerate() {
                        let running = continuous.then_some((c.prompt_tokens, 0));
                        let chunk = g.meta.role_chunk(i as u32, running);
                        self.pending.push_back((sse(&chunk), 0));
                    }
                }
                let running = continuous.then_some((choice.prompt_tokens, token + 1));
                let text = text::token_text(choice.seed, token);
                let chunk = g
                    .meta
                    .content_chunk(index, text, g.finish_for(k, token), running);
                self.pending.push_back((sse(&chunk), 1));
            }
            RequestEvent::Finished(usage) => {
                self.guard.finished(k);
                if let Some(slot) = self.finished.get_mut(k) {
                    *slot = Some(usage);
                }
                if !self.guard.all_finished() {
                    return;
                }
                let total = g.total_usage(&self.finished);
                g.ledger
                    .completed(&g.key, total.prompt_tokens, total.completion_tokens);
                if self.usage.final_chunk {
                    let chunk = g.meta.usage_chunk(&total, g.details);
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
        if !self.guard.all_finished() {
            let g = &self.gen;
            g.ledger
                .cut_off(&g.key, g.prompt_tokens(), self.sent_tokens);
        }
    }
}
