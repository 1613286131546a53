//! The scheduler over the real [`PrefixIndex`]: requests recorded for an endpoint steer the
//! next request sharing their prefix there.

use alloc::vec::Vec;

use super::super::RequestView;
use super::{cand, m, sched};
use crate::prefix::request_hashes;
use crate::types::{Millis, Tokens};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn recorded_prefix_wins_over_lighter_load() {
    let s = sched(
        r#"{"plugins": [{"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 16}},
        {"type": "prefix-cache-scorer"}, {"type": "queue-scorer"}],
        "schedulingProfiles": [{"name": "p", "plugins": [{"pluginRef": "prefix-cache-scorer", "weight": 3}, {"pluginRef": "queue-scorer"}]}]}"#,
    );
    let cfg = s.prefix_config();
    let mut index = s.new_prefix_index();
    let system: Vec<u8> = (0..64 * 10).map(|i| b'a' + (i % 26) as u8).collect();
    let mut earlier = system.clone();
    earlier.extend_from_slice(&[b'x'; 64 * 2]);
    index.record("warm", &request_hashes("m", None, &earlier, &cfg));
    let mut next = system;
    next.extend_from_slice(&[b'y'; 64 * 2]);
    let h = request_hashes("m", None, &next, &cfg);
    assert_eq!(h.len(), 12);
    let (busy, idle) = (m(4, 0, 0.5), m(0, 0, 0.5));
    let c = [cand("idle", Some(&idle)), cand("warm", Some(&busy))];
    let r = RequestView {
        target_model: "m",
        base_model: "m",
        block_hashes: &h,
        prompt_tokens: Tokens(h.len() as u64 * 16),
        last_endpoint_for_session: None,
    };
    let d = s.schedule(&r, &c, &index, 42, Millis(0));
    assert_eq!(d.prefix_matched(1), 10);
    assert_eq!(d.prefix_matched(0), 0);
    // warm: 3 × 10/12 + 0 = 2.5; idle: 0 + 1 = 1.
    assert_eq!(d.picked_address(), Some("warm"));
    // A different model shares no blocks.
    let other = request_hashes("other", None, &next, &cfg);
    let r = RequestView {
        block_hashes: &other,
        ..r
    };
    let d = s.schedule(&r, &c, &index, 42, Millis(0));
    assert_eq!(d.prefix_matched(1), 0);
    assert_eq!(d.picked_address(), Some("idle"));
}
