//! The saturation detectors as pure functions of the load and the latest snapshot.
