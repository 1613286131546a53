//! The driver: runs a pipeline's stages for one request, in order, and tells the adapter
//! what to do with the stream after each host event.
//!
//! A [`Pipeline`] is the configured list of stages, shared by every request; a [`Run`] is
//! one request's progress through it (the [`RequestContext`], which stage the request is
//! at, whether it waits for the body or for a wake). Each `Run` method is one host event and
//! answers the [`FilterStatus`] the stages answer it: `Continue` (the request side is done:
//! let the stream go on), `Pause` (hold it: a stage waits for the body or for a wake; in a
//! body event, keep buffering) or `Replied` (a stage answered: stop the stream).
//!
//! The request side is a cursor over the stages. The stage at the cursor is in one of three
//! phases: its headers are due, it waits for the body (it asked with
//! [`RequestContext::need_request_body`]: each body event goes to it until the body is
//! complete), or it paused (only a wake moves it, through [`Stage::on_resume`]). Body bytes
//! that arrive while a stage is paused stay buffered and reach the next stage that asks for
//! them. A stage that answers ends the request side; the response side and the end still
//! reach every stage, so each can settle what it holds.

use crate::FilterStatus;

use super::context::RequestContext;
use super::stage::{BodyProgress, EndCause, Stage};

/// A configured list of stages for hosts of type `H`. `S` is the stage object type: the
/// default `dyn Stage<H>`, or `dyn Stage<H> + Send + Sync` for a pipeline shared by threads
/// ([`SyncPipeline`]).
pub struct Pipeline<H: ?Sized, S: ?Sized + Stage<H> = dyn Stage<H>> {
    stages: Vec<Box<S>>,
    _host: core::marker::PhantomData<fn(&mut H)>,
}

/// A pipeline whose stages every worker thread of a process shares.
pub type SyncPipeline<H> = Pipeline<H, dyn Stage<H> + Send + Sync>;

impl<H: ?Sized, S: ?Sized + Stage<H>> core::fmt::Debug for Pipeline<H, S> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list()
            .entries(self.stages.iter().map(|s| s.name()))
            .finish()
    }
}

impl<H: ?Sized, S: ?Sized + Stage<H>> Pipeline<H, S> {
    /// A pipeline running `stages` in this order on the request side.
    pub fn new(stages: Vec<Box<S>>) -> Self {
        Pipeline {
            stages,
            _host: core::marker::PhantomData,
        }
    }

    /// The stages' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.stages.iter().map(|s| s.name()).collect()
    }
}

/// Where the stage at the cursor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Its request headers are due.
    Headers,
    /// It waits for the body.
    Body,
    /// It paused in `from`; only a wake moves it.
    Paused { from: PausedIn },
}

/// The entry point a stage paused in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PausedIn {
    Headers,
    Body,
}

/// One request's run through a [`Pipeline`] (see the module doc).
#[derive(Debug)]
pub struct Run {
    cx: RequestContext,
    cursor: usize,
    phase: Phase,
    headers_end_of_stream: bool,
    body: BodyProgress,
    /// The last body event the stage at the cursor saw.
    delivered: Option<BodyProgress>,
    answered: bool,
    response_ended: bool,
    ended: bool,
}

impl Default for Run {
    fn default() -> Self {
        Run::new()
    }
}

impl Run {
    /// A request that has seen nothing yet.
    pub fn new() -> Run {
        Run {
            cx: RequestContext::new(),
            cursor: 0,
            phase: Phase::Headers,
            headers_end_of_stream: false,
            body: BodyProgress::default(),
            delivered: None,
            answered: false,
            response_ended: false,
            ended: false,
        }
    }

    /// The request's context.
    pub fn context(&self) -> &RequestContext {
        &self.cx
    }

    /// Whether a stage paused the request and waits for a wake.
    pub fn is_paused(&self) -> bool {
        matches!(self.phase, Phase::Paused { .. })
    }

    /// Whether [`Run::end`] already ran.
    pub fn has_ended(&self) -> bool {
        self.ended
    }

    /// Request headers arrived.
    pub fn request_headers<H, S>(
        &mut self,
        pipeline: &Pipeline<H, S>,
        host: &mut H,
        end_of_stream: bool,
    ) -> FilterStatus
    where
        H: ?Sized,
        S: Stage<H> + ?Sized,
    {
        self.headers_end_of_stream = end_of_stream;
        if end_of_stream {
            self.body.end_of_stream = true;
        }
        self.advance(pipeline, host)
    }

    /// Request body data arrived: `buffered_len` bytes in all so far. Adapters call this
    /// from the trailers event too, with `end_of_stream = true`.
    pub fn request_body<H, S>(
        &mut self,
        pipeline: &Pipeline<H, S>,
        host: &mut H,
        buffered_len: usize,
        end_of_stream: bool,
    ) -> FilterStatus
    where
        H: ?Sized,
        S: Stage<H> + ?Sized,
    {
        self.body = BodyProgress {
            buffered_len,
            end_of_stream: end_of_stream || self.body.end_of_stream,
        };
        self.advance(pipeline, host)
    }

    /// The host woke the request. A paused stage resumes, and the answer is what to do now
    /// (`Continue`: the adapter must restart the stream it held). A request no stage holds
    /// is signalled instead ([`Stage::on_signal`], every stage in order, until one answers):
    /// `Some(Replied)` if one answered it, else `None`. `None` also for a wake after the
    /// end or the answer (late or spurious): the adapter then leaves the stream as it is.
    pub fn wake<H, S>(&mut self, pipeline: &Pipeline<H, S>, host: &mut H) -> Option<FilterStatus>
    where
        H: ?Sized,
        S: Stage<H> + ?Sized,
    {
        if self.answered || self.ended {
            return None;
        }
        let Phase::Paused { from } = self.phase else {
            for stage in &pipeline.stages {
                if stage.on_signal(&mut self.cx, host) == FilterStatus::Replied {
                    self.answered = true;
                    return Some(FilterStatus::Replied);
                }
            }
            return None;
        };
        let stage = pipeline.stages.get(self.cursor)?;
        let status = match stage.on_resume(&mut self.cx, host) {
            FilterStatus::Continue => {
                match from {
                    PausedIn::Headers => self.after_headers(),
                    PausedIn::Body => {
                        self.after_body(self.delivered.is_some_and(|d| d.end_of_stream))
                    }
                }
                self.advance(pipeline, host)
            }
            other => self.settle(other, from),
        };
        Some(status)
    }

    /// Response headers arrived.
    pub fn response_headers<H, S>(
        &mut self,
        pipeline: &Pipeline<H, S>,
        host: &mut H,
        end_of_stream: bool,
    ) where
        H: ?Sized,
        S: Stage<H> + ?Sized,
    {
        self.response_ended |= end_of_stream;
        for stage in pipeline.stages.iter().rev() {
            stage.on_response_headers(&mut self.cx, host, end_of_stream);
        }
    }

    /// One response chunk is passing.
    pub fn response_chunk<H, S>(
        &mut self,
        pipeline: &Pipeline<H, S>,
        host: &mut H,
        end_of_stream: bool,
    ) where
        H: ?Sized,
        S: Stage<H> + ?Sized,
    {
        self.response_ended |= end_of_stream;
        for stage in pipeline.stages.iter().rev() {
            stage.on_response_chunk(&mut self.cx, host, end_of_stream);
        }
    }

    /// Response trailers arrived: the response is complete.
    pub fn response_trailers(&mut self) {
        self.response_ended = true;
    }

    /// The stream ended: every stage's [`Stage::on_end`] runs once, in reverse order, with
    /// the cause this run observed. Later calls do nothing.
    pub fn end<H, S>(&mut self, pipeline: &Pipeline<H, S>, host: &mut H)
    where
        H: ?Sized,
        S: Stage<H> + ?Sized,
    {
        if self.ended {
            return;
        }
        self.ended = true;
        let cause = if self.answered {
            EndCause::LocalReply
        } else if self.response_ended {
            EndCause::Completed
        } else {
            EndCause::Reset
        };
        for stage in pipeline.stages.iter().rev() {
            stage.on_end(&mut self.cx, host, cause);
        }
    }

    /// Moves the cursor as far as the request allows.
    fn advance<H, S>(&mut self, pipeline: &Pipeline<H, S>, host: &mut H) -> FilterStatus
    where
        H: ?Sized,
        S: Stage<H> + ?Sized,
    {
        loop {
            if self.answered {
                return FilterStatus::Replied;
            }
            let Some(stage) = pipeline.stages.get(self.cursor) else {
                return FilterStatus::Continue;
            };
            match self.phase {
                Phase::Paused { .. } => return FilterStatus::Pause,
                Phase::Headers => {
                    match stage.on_request_headers(&mut self.cx, host, self.headers_end_of_stream) {
                        FilterStatus::Continue => self.after_headers(),
                        other => return self.settle(other, PausedIn::Headers),
                    }
                }
                Phase::Body => {
                    let body = self.body;
                    let nothing_new = self.delivered == Some(body)
                        || (body.buffered_len == 0 && !body.end_of_stream);
                    if nothing_new {
                        return FilterStatus::Pause;
                    }
                    self.delivered = Some(body);
                    match stage.on_request_body(&mut self.cx, host, body) {
                        FilterStatus::Continue => self.after_body(body.end_of_stream),
                        other => return self.settle(other, PausedIn::Body),
                    }
                }
            }
        }
    }

    /// The stage at the cursor is done with the headers: it waits for the body if it asked,
    /// else the next stage is due.
    fn after_headers(&mut self) {
        if self.cx.take_body_wanted() {
            // Whatever arrived already (or the end, for a request without a body) is
            // delivered at once by `advance`.
            self.phase = Phase::Body;
        } else {
            self.next_stage();
        }
    }

    /// The stage at the cursor answered `Continue` to a body event (`complete`: the one it saw
    /// was the end): the next stage is due, or it waits for more.
    fn after_body(&mut self, complete: bool) {
        if complete {
            self.next_stage();
        } else {
            self.phase = Phase::Body;
        }
    }

    fn next_stage(&mut self) {
        self.cursor += 1;
        self.phase = Phase::Headers;
        self.delivered = None;
    }

    /// A stage's `Pause` or `Replied`: record it, and answer it to the adapter.
    fn settle(&mut self, status: FilterStatus, from: PausedIn) -> FilterStatus {
        match status {
            FilterStatus::Continue => {}
            FilterStatus::Pause => self.phase = Phase::Paused { from },
            FilterStatus::Replied => self.answered = true,
        }
        status
    }
}
