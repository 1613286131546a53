#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::fake::FakeCells as Cells;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn limits(concurrency: u64) -> Limits {
    Limits {
        rpm: Some(1000),
        tpm: Some(100_000),
        concurrency: Some(concurrency),
    }
}

fn stores() -> Vec<(&'static str, Box<dyn QuotaStore>)> {
    vec![
        ("memory", Box::new(MemoryQuotas::default())),
        (
            "cas",
            Box::new(CasQuotas::new(Arc::new(Cells::default()), "q.")),
        ),
    ]
}

#[test]
fn concurrency_admits_exactly_the_limit_and_frees_on_settle() {
    for (name, store) in stores() {
        let l = limits(2);
        assert!(store.admit("a/m", &l, 10, Millis(0)).is_ok(), "{name}");
        assert!(store.admit("a/m", &l, 10, Millis(0)).is_ok(), "{name}");
        let third = store.admit("a/m", &l, 10, Millis(0)).unwrap_err();
        assert_eq!(
            third.reason,
            scheduler_core::quota::QuotaReason::Concurrency,
            "{name}"
        );
        // Another bucket set is independent.
        assert!(store.admit("b/m", &l, 10, Millis(0)).is_ok(), "{name}");
        store.settle("a/m", &l, 10, 7, Millis(1));
        assert!(store.admit("a/m", &l, 10, Millis(1)).is_ok(), "{name}");
    }
}

#[test]
fn cas_store_retries_lost_races_and_loses_no_debit() {
    let cells = Arc::new(Cells::default());
    let store = CasQuotas::new(Arc::clone(&cells), "q.");
    let l = limits(3);
    store.ensure("a/m", &l, Millis(0));
    cells.conflicts.store(5, Ordering::SeqCst);
    assert!(store.admit("a/m", &l, 10, Millis(0)).is_ok());
    assert!(store.admit("a/m", &l, 10, Millis(0)).is_ok());
    assert!(store.admit("a/m", &l, 10, Millis(0)).is_ok());
    assert!(store.admit("a/m", &l, 10, Millis(0)).is_err());
}

#[test]
fn cas_store_is_exact_under_threads() {
    let cells = Arc::new(Cells::default());
    let store = Arc::new(CasQuotas::new(Arc::clone(&cells), "q."));
    let l = limits(1_000_000);
    store.ensure("a/m", &l, Millis(0));
    let admitted: usize = (0..4)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                (0..50)
                    .filter(|_| store.admit("a/m", &l, 1, Millis(0)).is_ok())
                    .count()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .sum();
    assert_eq!(admitted, 200);
    let (bytes, _) = cells.load("q.a/m").unwrap();
    let state = QuotaState::decode(&bytes).unwrap();
    let info = state.info(&l, Millis(0));
    assert_eq!(info.remaining_requests, 800);
    assert_eq!(info.remaining_tokens, 100_000 - 200);
}
