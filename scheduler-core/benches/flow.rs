//! Flow-control queues at saturation: 10,000 requests queued across 3 bands × 100 flows,
//! for each fairness policy (FCFS within flows; the weighted one also with EDF):
//! - `enqueue_dispatch`: one arrival queued and one request dispatched per iteration, so the
//!   queue stays at 10,000 (throughput = dispatches/s; target ≥ 20,000/s);
//! - `cancel_enqueue`: a queued request cancelled (a client left) and a new one queued.
//!
//! Before the timed runs it prints the memory the queues hold for 10,000 queued requests,
//! counted by a counting global allocator: bytes per request beyond the item `T` itself,
//! with the share of the flow-name strings the host hands over with each arrival.
//!
//! Run: `cargo bench -p scheduler-core --bench flow` (`-- --quick` for a short run).

#[cfg(not(target_family = "wasm"))]
mod imp {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use criterion::{black_box, criterion_group, Criterion, Throughput};
    use scheduler_core::flow::{
        Arrival, BandConfig, FairnessPolicy, FlowControlConfig, FlowQueues, OrderingPolicy,
        QueueKey,
    };

    /// The system allocator, counting live bytes (all threads; the bench is single-threaded
    /// while it measures).
    pub struct Counting;

    static LIVE: AtomicUsize = AtomicUsize::new(0);

    // SAFETY: every call is forwarded unchanged to `System`, which upholds the `GlobalAlloc`
    // contract; the counter only observes sizes and never touches the memory.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same layout contract as our caller's.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: same layout contract as our caller's.
            let p = unsafe { System.alloc_zeroed(layout) };
            if !p.is_null() {
                LIVE.fetch_add(layout.size(), Ordering::Relaxed);
            }
            p
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` was allocated by `System` with `layout`.
            unsafe { System.dealloc(ptr, layout) };
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: `ptr` and `layout` come from `System` as above.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
                LIVE.fetch_add(new_size, Ordering::Relaxed);
            }
            p
        }
    }

    #[global_allocator]
    static ALLOC: Counting = Counting;

    const QUEUED: usize = 10_000;
    const BANDS: [i32; 3] = [100, 0, -10];
    const FLOWS: usize = 100;

    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    fn config(fairness: FairnessPolicy, ordering: OrderingPolicy) -> FlowControlConfig {
        FlowControlConfig {
            bands: BANDS
                .iter()
                .map(|&priority| BandConfig {
                    priority,
                    max_requests: u64::MAX,
                    max_bytes: u64::MAX,
                    fairness,
                    ordering,
                })
                .collect(),
            // A third of the flows weighted 3, as a weighted configuration would list them.
            weights: (0..FLOWS)
                .step_by(3)
                .map(|f| (format!("tenant-{f:03}"), 3))
                .collect(),
            ..FlowControlConfig::default()
        }
    }

    /// The flow names, as a host would receive them (`tenant-042`).
    fn names() -> Vec<String> {
        (0..FLOWS).map(|f| format!("tenant-{f:03}")).collect()
    }

    /// The `i`-th arrival of a random stream: any band, any flow, 1-4 KB bodies,
    /// 100-4,000 tokens of service, mostly the default TTL, some with their own.
    fn arrival(state: &mut u64, names: &[String], now_ms: u64, item: u64) -> Arrival<u64> {
        let r = next(state);
        Arrival {
            priority: BANDS[(r % 3) as usize],
            flow: names[((r >> 8) % FLOWS as u64) as usize].clone(),
            bytes: 1024 + (r >> 20) % 3072,
            service: 100 + (r >> 32) % 3900,
            ttl_ms: if r >> 60 == 0 { Some(30_000) } else { None },
            now_ms,
            item,
        }
    }

    fn filled(
        fairness: FairnessPolicy,
        ordering: OrderingPolicy,
        names: &[String],
    ) -> (FlowQueues<u64>, Vec<QueueKey>, u64) {
        let mut q = FlowQueues::new(&config(fairness, ordering));
        let mut state = 0x9e37_79b9_7f4a_7c15;
        let mut keys = Vec::with_capacity(QUEUED);
        for i in 0..QUEUED as u64 {
            if let Ok(k) = q.enqueue(arrival(&mut state, names, 0, i)) {
                keys.push(k);
            }
        }
        (q, keys, state)
    }

    fn report_memory(names: &[String]) {
        for (label, fairness, ordering) in [
            (
                "round-robin",
                FairnessPolicy::RoundRobin,
                OrderingPolicy::Fcfs,
            ),
            (
                "global-strict",
                FairnessPolicy::GlobalStrict,
                OrderingPolicy::Fcfs,
            ),
            ("weighted", FairnessPolicy::Weighted, OrderingPolicy::Fcfs),
            (
                "weighted+edf",
                FairnessPolicy::Weighted,
                OrderingPolicy::Edf,
            ),
        ] {
            let before = LIVE.load(Ordering::Relaxed);
            let (q, keys, _) = filled(fairness, ordering, names);
            let after = LIVE.load(Ordering::Relaxed);
            // What the arrivals' own flow-name strings hold (the host allocated them).
            let strings: usize = QUEUED * names[0].len();
            let keys_bytes = keys.capacity() * std::mem::size_of::<QueueKey>();
            let held = after - before - keys_bytes;
            let per = held as f64 / QUEUED as f64;
            let items = std::mem::size_of::<u64>() as f64;
            println!(
                "flow/memory/{label}: {} queued hold {held} bytes: {:.0} bytes per request \
                 beyond the item ({:.0} of them the flow-name string the arrival brought)",
                q.len(),
                per - items,
                strings as f64 / QUEUED as f64,
            );
            drop(q);
        }
    }

    fn flow(c: &mut Criterion) {
        let names = names();
        report_memory(&names);
        let mut g = c.benchmark_group("flow");
        g.throughput(Throughput::Elements(1));
        for (label, fairness, ordering) in [
            (
                "round_robin",
                FairnessPolicy::RoundRobin,
                OrderingPolicy::Fcfs,
            ),
            (
                "global_strict",
                FairnessPolicy::GlobalStrict,
                OrderingPolicy::Fcfs,
            ),
            ("weighted", FairnessPolicy::Weighted, OrderingPolicy::Fcfs),
            (
                "weighted_edf",
                FairnessPolicy::Weighted,
                OrderingPolicy::Edf,
            ),
        ] {
            let (mut q, _, mut state) = filled(fairness, ordering, &names);
            let mut now = 0u64;
            let mut item = QUEUED as u64;
            g.bench_function(format!("{label}/enqueue_dispatch_10k_queued"), |b| {
                b.iter(|| {
                    now += 1;
                    item += 1;
                    let _ = q.enqueue(arrival(&mut state, &names, now, item));
                    let d = q.dispatch(now);
                    // The weighted policy learns the real service at the request's end.
                    if let Some(d) = &d {
                        q.charge(d.band_priority, &d.flow, 10);
                    }
                    black_box(d)
                })
            });
            assert_eq!(q.len(), QUEUED, "the queue stays at 10,000");

            let (mut q, mut keys, mut state) = filled(fairness, ordering, &names);
            let mut turn = 0usize;
            g.bench_function(format!("{label}/cancel_enqueue_10k_queued"), |b| {
                b.iter(|| {
                    turn = (turn + 7919) % keys.len();
                    let gone = q.cancel(keys[turn], 1);
                    item += 1;
                    if let Ok(k) = q.enqueue(arrival(&mut state, &names, 1, item)) {
                        keys[turn] = k;
                    }
                    black_box(gone)
                })
            });
            assert_eq!(q.len(), QUEUED, "the queue stays at 10,000");
        }
        g.finish();
    }

    criterion_group!(benches, flow);
}

#[cfg(not(target_family = "wasm"))]
criterion::criterion_main!(imp::benches);

#[cfg(target_family = "wasm")]
fn main() {}
