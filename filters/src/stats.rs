//! Stat names. A [`StatKey`] is a metric family name plus label values, flattened once (at
//! configuration time) into the dotted form Envoy stats use: `name.label1.value1.label2.value2`.
//! Label values are sanitised in the flat form (`.`, `:`, `/` and blanks become `_`) so an
//! `ip:port` stays one stat-name token; Envoy's Prometheus output turns the dots into
//! underscores. Hosts with labelled stats (dynamic modules' metric vectors) can use
//! [`StatKey::family`] and [`StatKey::label_values`] instead of splitting the flat name;
//! [`FAMILIES`] lists every family the filters emit, so a host can define them up front.

/// Counter, gauge or histogram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatKind {
    /// Monotonic counter ([`crate::host::Stats::counter_add`]).
    Counter,
    /// Gauge, set ([`crate::host::Stats::gauge_set`]) or moved by signed deltas
    /// ([`crate::host::Stats::gauge_add`]).
    Gauge,
    /// Histogram of recorded values ([`crate::host::Stats::histogram_record`]).
    Histogram,
}

/// One metric family: kind, name and label names in key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFamily {
    /// Counter or gauge.
    pub kind: StatKind,
    /// The family name, e.g. `infergate.picker.picks`.
    pub name: &'static str,
    /// Label names, in the order keys carry them.
    pub labels: &'static [&'static str],
}

const fn counter(name: &'static str, labels: &'static [&'static str]) -> StatFamily {
    StatFamily {
        kind: StatKind::Counter,
        name,
        labels,
    }
}

const fn histogram(name: &'static str, labels: &'static [&'static str]) -> StatFamily {
    StatFamily {
        kind: StatKind::Histogram,
        name,
        labels,
    }
}

const fn gauge(name: &'static str, labels: &'static [&'static str]) -> StatFamily {
    StatFamily {
        kind: StatKind::Gauge,
        name,
        labels,
    }
}

/// Every metric family the router, the picker, the scraper and the tenancy stages emit.
pub const FAMILIES: &[StatFamily] = &[
    counter("infergate.router.requests", &["outcome"]),
    counter("infergate.router.rewrites", &["target"]),
    counter("infergate.picker.decisions", &["pool"]),
    counter("infergate.picker.picks", &["pool", "endpoint"]),
    counter("infergate.picker.rejects", &["pool", "reason"]),
    counter("infergate.picker.prefix_matched_blocks", &["pool"]),
    counter("infergate.picker.prefix_total_blocks", &["pool"]),
    counter("infergate.picker.fail_open_picks", &["pool"]),
    counter("infergate.picker.snapshot_errors", &[]),
    counter("infergate.picker.handoff", &["pool"]),
    counter("infergate.picker.served_by_fallback", &["pool"]),
    counter("infergate.picker.disaggregated_picks", &["pool"]),
    counter("infergate.picker.pool_by_base_model", &["pool"]),
    counter("infergate.picker.no_pool_rejects", &[]),
    gauge("infergate.picker.inflight_requests", &["pool"]),
    gauge("infergate.picker.inflight_requests", &["pool", "endpoint"]),
    gauge("infergate.picker.observed_ttft_us", &["pool", "endpoint"]),
    gauge("infergate.picker.observed_tpot_us", &["pool", "endpoint"]),
    gauge("infergate.picker.unscraped_endpoints", &["pool"]),
    counter("infergate.scraper.scrapes", &["endpoint", "result"]),
    counter("infergate.scraper.publishes", &[]),
    counter("infergate.scraper.publish_errors", &[]),
    counter("infergate.scraper.tick_failures", &[]),
    gauge("infergate.scraper.consecutive_failures", &["endpoint"]),
    counter("infergate.scraper.membership_updates", &["result"]),
    gauge("infergate.scraper.cluster_members", &["cluster"]),
    gauge("infergate.picker.pool_members", &["pool"]),
    counter("infergate.auth.requests", &["outcome"]),
    counter("infergate.quota.rejects", &["tenant", "model", "reason"]),
    counter(
        "infergate.usage.prompt_tokens",
        &["tenant", "model", "priority"],
    ),
    counter(
        "infergate.usage.completion_tokens",
        &["tenant", "model", "priority"],
    ),
    counter(
        "infergate.usage.cached_tokens",
        &["tenant", "model", "priority"],
    ),
    counter("infergate.usage.records", &[]),
    gauge("infergate.flow.queued", &["pool", "band", "flow"]),
    counter("infergate.flow.dispatches", &["pool", "band", "flow"]),
    counter(
        "infergate.flow.rejections",
        &["pool", "band", "flow", "reason"],
    ),
    histogram("infergate.flow.queue_time_ms", &["pool", "band"]),
    counter(
        "infergate.flow.evictions",
        &["pool", "band", "flow", "when"],
    ),
    counter("infergate.usage.record_errors", &[]),
];

/// A pre-built stat name (see the module doc for the flattening).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatKey {
    flat: String,
    family_len: usize,
    label_values: Vec<String>,
}

impl StatKey {
    /// Family `name` with `labels` appended as `.key.value` pairs.
    pub fn new(name: &str, labels: &[(&str, &str)]) -> StatKey {
        let mut flat = String::from(name);
        for (key, value) in labels {
            flat.push('.');
            flat.push_str(key);
            flat.push('.');
            flat.extend(value.chars().map(sanitize));
        }
        StatKey {
            flat,
            family_len: name.len(),
            label_values: labels.iter().map(|(_, v)| (*v).to_owned()).collect(),
        }
    }

    /// The flattened name.
    pub fn as_str(&self) -> &str {
        &self.flat
    }

    /// The family name (the part before the labels).
    pub fn family(&self) -> &str {
        self.flat.get(..self.family_len).unwrap_or(&self.flat)
    }

    /// The label values as given (not sanitised), in key order.
    pub fn label_values(&self) -> &[String] {
        &self.label_values
    }
}

fn sanitize(c: char) -> char {
    match c {
        '.' | ':' | ' ' | '/' => '_',
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_flattened_and_sanitised() {
        let k = StatKey::new(
            "infergate.picker.picks",
            &[("pool", "a"), ("endpoint", "10.0.0.1:8000")],
        );
        assert_eq!(
            k.as_str(),
            "infergate.picker.picks.pool.a.endpoint.10_0_0_1_8000"
        );
        assert_eq!(k.family(), "infergate.picker.picks");
        assert_eq!(k.label_values(), ["a", "10.0.0.1:8000"]);
    }

    #[test]
    fn every_emitted_key_belongs_to_a_declared_family() {
        use crate::fake::FakeHost;
        use crate::picker::PickerShared;
        use crate::pipeline::{Pipeline, Run};
        use crate::scraper::Scraper;
        use crate::stages::PickStage;

        // Exercise the picker (pick and reject paths) and the scraper; collect keys.
        let mut host = FakeHost::new()
            .request_header("x-gateway-base-model-name", "m")
            .post(
                "/v1/completions",
                br#"{"model":"m","prompt":"hello there"}"#,
            )
            .snapshot(1, b"garbage".to_vec());
        // FailClose rejects on the undecodable snapshot; FailOpen picks, and its response
        // is streamed to its end.
        for mode in ["FailClose", "FailOpen"] {
            let Ok(shared) = PickerShared::from_json(serde_json::json!({
                "pool": "p", "baseModel": "m", "endpoints": ["127.0.0.1:1"],
                "failureMode": mode
            })) else {
                continue;
            };
            let picker: Pipeline<FakeHost> = Pipeline::new(vec![Box::new(PickStage::new(shared))]);
            let mut run = Run::new();
            run.request_headers(&picker, &mut host, false);
            let len = host.body.len();
            run.request_body(&picker, &mut host, len, true);
            // A streamed response sets the measured-latency gauges at its end.
            host.response_headers
                .push(("content-type".to_owned(), "text/event-stream".to_owned()));
            run.response_headers(&picker, &mut host, false);
            run.response_chunk(&picker, &mut host, false);
            run.response_chunk(&picker, &mut host, true);
            run.end(&picker, &mut host);
        }
        let mut scraper = Scraper::new(crate::scraper::ScraperConfig {
            endpoints: vec!["127.0.0.1:1".to_owned()],
            interval_ms: 50,
            timeout_ms: 10,
            cluster: "c".to_owned(),
            path: "/metrics".to_owned(),
            max_metrics_page_bytes: 1024,
            ..crate::scraper::ScraperConfig::default()
        });
        host.fail_dispatch = true;
        scraper.on_tick(&mut host);
        let names: Vec<&String> = host.counters.keys().chain(host.gauges.keys()).collect();
        assert!(names.len() >= 5);
        for name in names {
            let known = FAMILIES.iter().any(|f| {
                name.strip_prefix(f.name).is_some_and(|rest| {
                    rest.split('.').filter(|s| !s.is_empty()).count() == 2 * f.labels.len()
                })
            });
            assert!(known, "{name} is not a declared family");
        }
    }
}
