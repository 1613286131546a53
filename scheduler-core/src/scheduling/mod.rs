//! `EndpointPickerConfig`, the scheduling plugins, profiles and the decision record (DESIGN §6).
//!
//! CONTRACT STUB — owned by the scheduling work.
