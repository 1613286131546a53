//! The precise prefix index's feed in the native flavour: one KV-event subscriber thread
//! ([`crate::kv_events`]) per picker state whose pools declare
//! `precise-prefix-cache-producer`, delivering every engine's events into that pool's
//! [`PreciseShared`].
//!
//! The sink holds the state weakly: once its last config is gone it lists no target, the
//! subscriber closes every connection, and the next state created stops the idle thread.
//! Every second the subscriber asks for the targets: the sink maps the process's newest
//! metric snapshot (so a pool that follows its cluster lists its current members) and
//! returns each member's events address. A message's topic (`kv@<pod>@<model>`) names the
//! model its blocks were computed for; a topic that does not parse counts as the pool's
//! base model.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use infergate_filters::picker::SharedPicker;
use infergate_filters::precise::PreciseShared;
use scheduler_core::kv_events::parse_topic;

use crate::flow_timer::ProcessSnapshot;
use crate::kv_events::{self, Handle, KvSink, KvTarget};

/// One followed endpoint: its index and its pool's base model.
struct Feed {
    index: Arc<PreciseShared>,
    base_model: String,
}

/// Delivers one picker state's KV events (see the module doc).
struct Sink {
    state: Weak<SharedPicker>,
    /// The targets last listed, by (pool, endpoint).
    feeds: Mutex<HashMap<(String, String), Feed>>,
}

impl Sink {
    fn feed<R>(&self, target: &KvTarget, f: impl FnOnce(&Feed) -> R) -> Option<R> {
        let feeds = self.feeds.lock().unwrap_or_else(PoisonError::into_inner);
        feeds
            .get(&(target.pool.clone(), target.endpoint.clone()))
            .map(f)
    }
}

impl KvSink for Sink {
    fn targets(&self) -> Vec<KvTarget> {
        let Some(state) = self.state.upgrade() else {
            self.feeds
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            return Vec::new();
        };
        let shared = state.state();
        shared.refresh_snapshot(&ProcessSnapshot);
        let listed = shared.precise_targets();
        let mut feeds = self.feeds.lock().unwrap_or_else(PoisonError::into_inner);
        feeds.clear();
        let mut out = Vec::with_capacity(listed.len());
        for t in listed {
            feeds.insert(
                (t.pool.clone(), t.endpoint.clone()),
                Feed {
                    index: t.index,
                    base_model: t.base_model,
                },
            );
            out.push(KvTarget {
                pool: t.pool,
                endpoint: t.endpoint,
                events: t.events,
            });
        }
        out
    }

    fn deliver(&self, target: &KvTarget, topic: &[u8], _seq: u64, payload: &[u8]) {
        // Decoding and applying happen here, on the subscriber's thread, with the index's
        // lock held per slice of events; the feed map's lock only finds the index.
        let Some((index, base_model)) =
            self.feed(target, |f| (Arc::clone(&f.index), f.base_model.clone()))
        else {
            return;
        };
        let model = parse_topic(topic).map_or(base_model.as_str(), |t| t.model);
        if let Err(e) = index.deliver(&target.endpoint, model, payload) {
            crate::log::warn(&format!(
                "infergate: precise prefix index: pool `{}` endpoint {}: a KV event message \
                 did not decode ({e:?}); the endpoint's blocks are forgotten until its next \
                 events",
                target.pool, target.endpoint
            ));
        }
    }

    fn stale(&self, target: &KvTarget) {
        if let Some(index) = self.feed(target, |f| Arc::clone(&f.index)) {
            index.mark_stale(&target.endpoint);
        }
    }
}

/// The subscriber threads started, each with the state it serves.
static THREADS: Mutex<Vec<(Weak<SharedPicker>, Handle)>> = Mutex::new(Vec::new());

/// Start the KV-event subscriber of `state` if any of its pools has a precise index; stop
/// the threads of states that are gone.
pub fn start(state: &Arc<SharedPicker>) {
    let mut threads = THREADS.lock().unwrap_or_else(PoisonError::into_inner);
    // Dropping a handle stops and joins its thread (it is idle: its state is gone).
    threads.retain(|(weak, _)| weak.strong_count() > 0);
    if !state.state().has_precise() {
        return;
    }
    let sink = Arc::new(Sink {
        state: Arc::downgrade(state),
        feeds: Mutex::new(HashMap::new()),
    });
    match kv_events::spawn(sink) {
        Ok(handle) => threads.push((Arc::downgrade(state), handle)),
        Err(e) => crate::log::error(&format!(
            "infergate: precise prefix index: no KV-event thread ({e}): its pools match \
             nothing but their own picks' speculative entries"
        )),
    }
}
