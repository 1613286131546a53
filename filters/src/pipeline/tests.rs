//! The driver against scripted stages over the fake host: order, body delivery, pause and
//! resume, replies, the response side and the end on every path.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use crate::fake::FakeHost;
use crate::host::RequestWaker;
use crate::reply::Reply;
use crate::FilterStatus;

type Log = Rc<RefCell<Vec<String>>>;

/// A stage that logs every call and answers as scripted.
struct Script {
    name: &'static str,
    log: Log,
    wants_body: bool,
    headers: FilterStatus,
    /// Answer to the complete body.
    body: FilterStatus,
    resume: FilterStatus,
}

impl Script {
    fn new(name: &'static str, log: &Log) -> Script {
        Script {
            name,
            log: Rc::clone(log),
            wants_body: false,
            headers: FilterStatus::Continue,
            body: FilterStatus::Continue,
            resume: FilterStatus::Continue,
        }
    }
    fn note(&self, what: String) {
        self.log.borrow_mut().push(format!("{}:{what}", self.name));
    }
    /// `status`, replying first when it is `Replied`.
    fn answer(&self, status: FilterStatus, host: &mut FakeHost) -> FilterStatus {
        match status {
            FilterStatus::Replied => reply(host, &Reply::internal("no")),
            other => other,
        }
    }
}

impl Stage<FakeHost> for Script {
    fn name(&self) -> &'static str {
        self.name
    }
    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut FakeHost,
        eos: bool,
    ) -> FilterStatus {
        self.note(format!("headers({eos})"));
        if self.wants_body {
            cx.need_request_body();
        }
        if self.headers == FilterStatus::Pause {
            // A pausing stage takes its waker first.
            let _ = host.request_waker();
        }
        self.answer(self.headers, host)
    }
    fn on_request_body(
        &self,
        _cx: &mut RequestContext,
        h: &mut FakeHost,
        b: BodyProgress,
    ) -> FilterStatus {
        self.note(format!("body({},{})", b.buffered_len, b.end_of_stream));
        if b.end_of_stream {
            self.answer(self.body, h)
        } else {
            FilterStatus::Continue
        }
    }
    fn on_resume(&self, _cx: &mut RequestContext, h: &mut FakeHost) -> FilterStatus {
        self.note("resume".into());
        self.answer(self.resume, h)
    }
    fn on_response_headers(&self, _cx: &mut RequestContext, _h: &mut FakeHost, eos: bool) {
        self.note(format!("response_headers({eos})"));
    }
    fn on_response_chunk(&self, _cx: &mut RequestContext, _h: &mut FakeHost, eos: bool) {
        self.note(format!("chunk({eos})"));
    }
    fn on_end(&self, _cx: &mut RequestContext, _h: &mut FakeHost, cause: EndCause) {
        self.note(format!("end({cause:?})"));
    }
}

fn pipeline(stages: Vec<Script>) -> Pipeline<FakeHost> {
    Pipeline::new(
        stages
            .into_iter()
            .map(|s| Box::new(s) as Box<dyn Stage<FakeHost>>)
            .collect(),
    )
}

fn taken(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.borrow_mut())
}

#[test]
fn a_stage_sees_the_request_only_after_the_one_before_is_done_with_the_body() {
    let log = Log::default();
    let mut a = Script::new("a", &log);
    a.wants_body = true;
    let p = pipeline(vec![a, Script::new("b", &log)]);
    let mut host = FakeHost::new();
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, false),
        FilterStatus::Pause
    );
    assert_eq!(taken(&log), ["a:headers(false)"]);
    assert_eq!(
        run.request_body(&p, &mut host, 10, false),
        FilterStatus::Pause
    );
    assert_eq!(taken(&log), ["a:body(10,false)"]);
    assert_eq!(
        run.request_body(&p, &mut host, 25, true),
        FilterStatus::Continue
    );
    assert_eq!(taken(&log), ["a:body(25,true)", "b:headers(false)"]);
    // The request side is done: later body events pass through untouched.
    assert_eq!(
        run.request_body(&p, &mut host, 30, true),
        FilterStatus::Continue
    );
    assert!(taken(&log).is_empty());
}

#[test]
fn a_request_without_a_body_still_ends_the_body_of_a_stage_that_asked() {
    let log = Log::default();
    let mut a = Script::new("a", &log);
    a.wants_body = true;
    let p = pipeline(vec![a]);
    let mut run = Run::new();
    let status = run.request_headers(&p, &mut FakeHost::new(), true);
    assert_eq!(status, FilterStatus::Continue);
    assert_eq!(taken(&log), ["a:headers(true)", "a:body(0,true)"]);
}

#[test]
fn a_paused_stage_resumes_only_when_woken_and_the_body_waits_buffered() {
    let log = Log::default();
    let mut a = Script::new("a", &log);
    a.headers = FilterStatus::Pause;
    let mut b = Script::new("b", &log);
    b.wants_body = true;
    let p = pipeline(vec![a, b]);
    let mut host = FakeHost::new();
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, false),
        FilterStatus::Pause
    );
    assert!(run.is_paused());
    assert_eq!(host.wakers_made, 1);
    // Body events while paused keep buffering and reach no stage.
    assert_eq!(
        run.request_body(&p, &mut host, 5, false),
        FilterStatus::Pause
    );
    assert_eq!(
        run.request_body(&p, &mut host, 9, true),
        FilterStatus::Pause
    );
    assert_eq!(taken(&log), ["a:headers(false)"]);
    // The wake resumes `a`; `b` then gets its headers and the whole buffered body at once.
    assert_eq!(run.wake(&p, &mut host), Some(FilterStatus::Continue));
    assert_eq!(
        taken(&log),
        ["a:resume", "b:headers(false)", "b:body(9,true)"]
    );
    // A late or spurious wake changes nothing.
    assert_eq!(run.wake(&p, &mut host), None);
    assert!(taken(&log).is_empty());
}

#[test]
fn a_stage_may_pause_again_on_a_spurious_wake() {
    let log = Log::default();
    let mut a = Script::new("a", &log);
    a.headers = FilterStatus::Pause;
    a.resume = FilterStatus::Pause;
    let p = pipeline(vec![a]);
    let mut host = FakeHost::new();
    let mut run = Run::new();
    run.request_headers(&p, &mut host, true);
    assert_eq!(run.wake(&p, &mut host), Some(FilterStatus::Pause));
    assert!(run.is_paused());
    assert_eq!(run.wake(&p, &mut host), Some(FilterStatus::Pause));
    assert_eq!(taken(&log), ["a:headers(true)", "a:resume", "a:resume"]);
}

#[test]
fn a_pause_on_the_complete_body_resumes_into_the_next_stage() {
    let log = Log::default();
    let mut a = Script::new("a", &log);
    a.wants_body = true;
    a.body = FilterStatus::Pause;
    let p = pipeline(vec![a, Script::new("b", &log)]);
    let mut host = FakeHost::new();
    let mut run = Run::new();
    run.request_headers(&p, &mut host, false);
    assert_eq!(
        run.request_body(&p, &mut host, 4, true),
        FilterStatus::Pause
    );
    assert_eq!(run.wake(&p, &mut host), Some(FilterStatus::Continue));
    assert_eq!(
        taken(&log),
        [
            "a:headers(false)",
            "a:body(4,true)",
            "a:resume",
            "b:headers(false)"
        ]
    );
}

#[test]
fn a_reply_stops_the_request_side_and_every_stage_still_ends_once() {
    let log = Log::default();
    let mut a = Script::new("a", &log);
    a.headers = FilterStatus::Replied;
    let p = pipeline(vec![Script::new("x", &log), a, Script::new("b", &log)]);
    let mut host = FakeHost::new();
    let mut run = Run::new();
    assert_eq!(
        run.request_headers(&p, &mut host, false),
        FilterStatus::Replied
    );
    assert_eq!(host.replies.len(), 1, "the stage sent one reply");
    assert_eq!(
        run.request_body(&p, &mut host, 3, true),
        FilterStatus::Replied
    );
    assert_eq!(run.wake(&p, &mut host), None);
    run.end(&p, &mut host);
    run.end(&p, &mut host);
    assert!(run.has_ended());
    assert_eq!(
        taken(&log),
        [
            "x:headers(false)",
            "a:headers(false)",
            "b:end(LocalReply)",
            "a:end(LocalReply)",
            "x:end(LocalReply)"
        ]
    );
}

#[test]
fn the_response_side_runs_in_reverse_and_the_end_says_how_the_stream_ended() {
    let log = Log::default();
    let p = pipeline(vec![Script::new("a", &log), Script::new("b", &log)]);
    let mut host = FakeHost::new();
    let mut run = Run::new();
    run.request_headers(&p, &mut host, true);
    taken(&log);
    run.response_headers(&p, &mut host, false);
    run.response_chunk(&p, &mut host, false);
    run.response_chunk(&p, &mut host, true);
    run.end(&p, &mut host);
    assert_eq!(
        taken(&log),
        [
            "b:response_headers(false)",
            "a:response_headers(false)",
            "b:chunk(false)",
            "a:chunk(false)",
            "b:chunk(true)",
            "a:chunk(true)",
            "b:end(Completed)",
            "a:end(Completed)"
        ]
    );
    // A stream that ends before its response did was reset.
    let mut run = Run::new();
    run.request_headers(&p, &mut host, true);
    run.response_headers(&p, &mut host, false);
    taken(&log);
    run.end(&p, &mut host);
    assert_eq!(taken(&log), ["b:end(Reset)", "a:end(Reset)"]);
}

/// Counts its drops.
struct Held(Rc<RefCell<u32>>);

impl Drop for Held {
    fn drop(&mut self) {
        *self.0.borrow_mut() += 1;
    }
}

struct Holder(Rc<RefCell<u32>>);

impl Stage<FakeHost> for Holder {
    fn name(&self) -> &'static str {
        "holder"
    }
    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        _h: &mut FakeHost,
        _eos: bool,
    ) -> FilterStatus {
        cx.insert(Held(Rc::clone(&self.0)));
        FilterStatus::Pause
    }
}

#[test]
fn what_a_stage_keeps_in_the_context_is_dropped_with_the_run_on_any_path() {
    let drops = Rc::new(RefCell::new(0));
    let p: Pipeline<FakeHost> = Pipeline::new(vec![Box::new(Holder(Rc::clone(&drops)))]);
    let mut run = Run::new();
    run.request_headers(&p, &mut FakeHost::new(), true);
    assert!(run.context().get::<Held>().is_some());
    // Never ended, never resumed: dropping the run drops what it held.
    drop(run);
    assert_eq!(*drops.borrow(), 1);
}

#[test]
fn the_context_keys_entries_by_type() {
    let mut cx = RequestContext::new();
    assert_eq!(cx.get::<u32>(), None);
    *cx.get_or_insert_with(|| 1u32) += 1;
    assert_eq!(cx.insert("s"), None);
    assert_eq!(cx.get::<u32>(), Some(&2));
    assert_eq!(cx.insert(5u32), Some(2));
    assert_eq!(cx.remove::<&str>(), Some("s"));
    assert_eq!(cx.get_mut::<u32>().copied(), Some(5));
    assert_eq!(cx.remove::<&str>(), None);
}
