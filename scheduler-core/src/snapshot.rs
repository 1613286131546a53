//! The versioned binary metric snapshot: written by the scraper, decoded by the picker.
//!
//! CONTRACT STUB — owned by the metrics work. Agreed interface:
//!
//! ```ignore
//! pub struct Snapshot { pub taken_at: Millis, pub endpoints: Vec<EndpointSample> }
//! pub struct EndpointSample { pub address: String, pub scraped_at: Millis,
//!                             pub consecutive_failures: u32, pub metrics: Option<EndpointMetrics> }
//! pub fn encode(s: &Snapshot) -> Vec<u8>;
//! pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError>;
//! ```
