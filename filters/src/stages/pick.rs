//! The endpoint picker as a pipeline stage: [`crate::picker::PickerRequest`] kept in the
//! request's context, its in-flight lease given back at the request's end.
//!
//! Where the picker state lives is the adapter's choice, expressed as a [`PickerStore`]:
//! the native flavour's one state per Envoy process is an `Arc<SharedPicker>`; another
//! host implements the trait for its own store.

use std::sync::Arc;

use crate::picker::{PickerAccess, PickerHost, PickerRequest, SharedPicker};
use crate::pipeline::{BodyProgress, EndCause, RequestContext, Stage, Step};
use crate::reply::Reply;
use crate::FilterStatus;

/// Where a [`PickStage`] reaches the picker state.
pub trait PickerStore {
    /// The accessor one call uses.
    type Access<'a>: PickerAccess
    where
        Self: 'a;

    /// Access for one call; `None` if the state is busy (a re-entrant call on one thread).
    fn access(&self) -> Option<Self::Access<'_>>;
}

impl PickerStore for Arc<SharedPicker> {
    type Access<'a> = &'a SharedPicker;

    fn access(&self) -> Option<&SharedPicker> {
        Some(self)
    }
}

/// The picker stage over the state in `P`.
#[derive(Clone, Debug)]
pub struct PickStage<P> {
    store: P,
}

impl<P> PickStage<P> {
    /// A stage picking from `store`.
    pub fn new(store: P) -> PickStage<P> {
        PickStage { store }
    }

    /// The state it picks from.
    pub fn store(&self) -> &P {
        &self.store
    }
}

fn busy() -> Step {
    Step::Reply(Reply::internal("picker state busy (re-entrant call)"))
}

fn step(cx: &mut RequestContext, status: FilterStatus, waits_for_body: bool) -> Step {
    match status {
        FilterStatus::Continue => Step::Next,
        FilterStatus::Pause => {
            if waits_for_body {
                cx.need_request_body();
            }
            Step::Next
        }
        FilterStatus::Replied => Step::Replied,
    }
}

impl<H: PickerHost + ?Sized, P: PickerStore> Stage<H> for PickStage<P> {
    fn name(&self) -> &'static str {
        "pick"
    }

    fn on_request_headers(
        &self,
        cx: &mut RequestContext,
        host: &mut H,
        end_of_stream: bool,
    ) -> Step {
        let Some(access) = self.store.access() else {
            return busy();
        };
        let status = cx
            .get_or_insert_with(PickerRequest::new)
            .on_request_headers(access, host, end_of_stream);
        step(cx, status, true)
    }

    fn on_request_body(&self, cx: &mut RequestContext, host: &mut H, body: BodyProgress) -> Step {
        let Some(access) = self.store.access() else {
            return busy();
        };
        let status = cx.get_or_insert_with(PickerRequest::new).on_request_body(
            access,
            host,
            body.buffered_len,
            body.end_of_stream,
        );
        step(cx, status, false)
    }

    fn on_end(&self, cx: &mut RequestContext, host: &mut H, _cause: EndCause) {
        let Some(request) = cx.get_mut::<PickerRequest>() else {
            return;
        };
        if !request.holds_lease() {
            return;
        }
        if let Some(access) = self.store.access() {
            request.on_end_counted(access, host);
        }
    }
}
