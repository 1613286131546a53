//! The per-request context: one value per request that every stage of its pipeline sees.
//!
//! It holds each stage's data about the request under a type the stage owns (the router's
//! progress, the picker's pool plan, endpoint and in-flight lease; later the tenant, the
//! quota debit, the usage counted so far), so a new stage adds its data without the driver
//! or the adapters knowing the type. A stage that reads another stage's data names that
//! stage's type, so the dependency is visible in the code. One entry per type: two stages
//! that must not share data use two types.
//!
//! The context lives exactly as long as the request's pipeline run: whatever it holds is
//! dropped with it, on every end path (a lease that releases itself on drop cannot leak).

use core::any::{Any, TypeId};

/// Per-request data of the stages, keyed by type (see the module doc).
#[derive(Default)]
pub struct RequestContext {
    entries: Vec<(TypeId, Box<dyn Any>)>,
    body_wanted: bool,
}

impl core::fmt::Debug for RequestContext {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RequestContext")
            .field("entries", &self.entries.len())
            .field("body_wanted", &self.body_wanted)
            .finish()
    }
}

impl RequestContext {
    /// An empty context.
    pub fn new() -> RequestContext {
        RequestContext::default()
    }

    /// The entry of type `T`, if a stage stored one.
    pub fn get<T: 'static>(&self) -> Option<&T> {
        let id = TypeId::of::<T>();
        self.entries
            .iter()
            .find(|(k, _)| *k == id)
            .and_then(|(_, v)| v.downcast_ref())
    }

    /// The entry of type `T`, mutable.
    pub fn get_mut<T: 'static>(&mut self) -> Option<&mut T> {
        let id = TypeId::of::<T>();
        self.entries
            .iter_mut()
            .find(|(k, _)| *k == id)
            .and_then(|(_, v)| v.downcast_mut())
    }

    /// The entry of type `T`, stored first as `make()` if absent.
    pub fn get_or_insert_with<T: 'static>(&mut self, make: impl FnOnce() -> T) -> &mut T {
        let id = TypeId::of::<T>();
        let index = match self.entries.iter().position(|(k, _)| *k == id) {
            Some(index) => index,
            None => {
                self.entries.push((id, Box::new(make())));
                self.entries.len() - 1
            }
        };
        match self.entries[index].1.downcast_mut() {
            Some(value) => value,
            // Every entry is stored under its own value's type id.
            None => unreachable!("context entry stored under another type's id"),
        }
    }

    /// Store `value` as the entry of its type; the previous one, if any.
    pub fn insert<T: 'static>(&mut self, value: T) -> Option<T> {
        let previous = self.remove::<T>();
        self.entries.push((TypeId::of::<T>(), Box::new(value)));
        previous
    }

    /// Take the entry of type `T` out.
    pub fn remove<T: 'static>(&mut self) -> Option<T> {
        let id = TypeId::of::<T>();
        let index = self.entries.iter().position(|(k, _)| *k == id)?;
        let (_, value) = self.entries.swap_remove(index);
        value.downcast().ok().map(|b| *b)
    }

    /// From [`super::Stage::on_request_headers`]: hold the request and call this stage's
    /// [`super::Stage::on_request_body`] until the body is complete (later stages see the
    /// request only after that).
    pub fn need_request_body(&mut self) {
        self.body_wanted = true;
    }

    /// Whether the stage that just ran asked for the body; clears the request.
    pub(super) fn take_body_wanted(&mut self) -> bool {
        core::mem::take(&mut self.body_wanted)
    }
}
