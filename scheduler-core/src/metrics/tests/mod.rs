//! Tests of the metrics module: one per format feature, the extraction rules, the golden
//! pages of `testdata/metrics/` and property tests (never panic on arbitrary input).

mod bounds;
mod format;
mod golden;
mod props;
mod rules;
