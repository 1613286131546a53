//! One test per feature of the exposition format.

use alloc::borrow::Cow;
use alloc::vec::Vec;

use crate::metrics::exposition::{lines, parse_line, Line, MetricKind, Sample};

#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn sample(line: &str) -> Sample<'_> {
    match parse_line(line) {
        Line::Sample(s) => s,
        other => panic!("expected a sample from {line:?}, got {other:?}"),
    }
}

fn labels<'a>(s: &Sample<'a>) -> Vec<(Cow<'a, str>, Cow<'a, str>)> {
    s.labels().collect()
}

#[test]
fn bare_sample_without_labels() {
    let s = sample("process_open_fds 187.0");
    assert_eq!(s.name, "process_open_fds");
    assert_eq!(s.value, 187.0);
    assert_eq!(s.timestamp, None);
    assert!(labels(&s).is_empty());
}

#[test]
fn colons_and_digits_in_names() {
    let s = sample("vllm:num_requests_waiting2 1");
    assert_eq!(s.name, "vllm:num_requests_waiting2");
}

#[test]
fn label_set_in_order() {
    let s = sample(r#"vllm:num_requests_running{model_name="m",engine="0"} 7.0"#);
    assert_eq!(s.name, "vllm:num_requests_running");
    assert_eq!(
        labels(&s),
        [
            ("model_name".into(), "m".into()),
            ("engine".into(), "0".into())
        ]
    );
    assert_eq!(s.label("engine").as_deref(), Some("0"));
    assert_eq!(s.label("missing"), None);
}

#[test]
fn escaped_label_values_are_unescaped() {
    let s = sample(r#"m{path="C:\\dir",quote="say \"hi\"",nl="a\nb"} 1"#);
    assert_eq!(s.label("path").as_deref(), Some(r"C:\dir"));
    assert_eq!(s.label("quote").as_deref(), Some(r#"say "hi""#));
    assert_eq!(s.label("nl").as_deref(), Some("a\nb"));
}

#[test]
fn braces_commas_and_equals_inside_values() {
    let s = sample(r#"m{a="x,y=}{z",b="2"} 3"#);
    assert_eq!(s.label("a").as_deref(), Some("x,y=}{z"));
    assert_eq!(s.label("b").as_deref(), Some("2"));
    assert_eq!(s.value, 3.0);
}

#[test]
fn unknown_escape_is_kept_literally() {
    let s = sample(r#"m{a="x\ty"} 1"#);
    assert_eq!(s.label("a").as_deref(), Some(r"x\ty"));
}

#[test]
fn unicode_in_label_values() {
    let s = sample("m{model=\"模型-ü\"} 2");
    assert_eq!(s.label("model").as_deref(), Some("模型-ü"));
}

#[test]
fn trailing_comma_blanks_and_empty_label_set() {
    let s = sample("m { a = \"1\" , b=\"2\", } 4");
    assert_eq!(labels(&s).len(), 2);
    assert_eq!(s.label("b").as_deref(), Some("2"));
    let s = sample("m{} 5");
    assert!(labels(&s).is_empty());
    assert_eq!(s.value, 5.0);
    let s = sample("m{}5");
    assert_eq!(s.value, 5.0);
}

#[test]
fn special_float_values() {
    assert!(sample("m NaN").value.is_nan());
    assert_eq!(sample("m +Inf").value, f64::INFINITY);
    assert_eq!(sample("m -Inf").value, f64::NEG_INFINITY);
    assert_eq!(sample("m Inf").value, f64::INFINITY);
    assert_eq!(sample("m 1.7563921034567e+09").value, 1_756_392_103.456_7);
    assert_eq!(sample("m 1.2734513152e+011").value, 127_345_131_520.0);
    assert_eq!(sample("m -0.5").value, -0.5);
    assert_eq!(sample("m .5").value, 0.5);
}

#[test]
fn optional_timestamp() {
    let s = sample("m{a=\"b\"} 3 1712345678901");
    assert_eq!(s.value, 3.0);
    assert_eq!(s.timestamp, Some(1_712_345_678_901.0));
    let s = sample("m 3 -5");
    assert_eq!(s.timestamp, Some(-5.0));
}

#[test]
fn openmetrics_exemplar_is_ignored() {
    let s = sample(r#"m_bucket{le="0.5"} 3 # {trace_id="abc"} 0.4 1712345678.9"#);
    assert_eq!(s.value, 3.0);
    assert_eq!(s.label("le").as_deref(), Some("0.5"));
}

#[test]
fn quoted_metric_and_label_names() {
    let s = sample(r#"{"my.metric", "label.name"="v", plain="p"} 9"#);
    assert_eq!(s.name, "my.metric");
    assert_eq!(
        labels(&s),
        [
            ("label.name".into(), "v".into()),
            ("plain".into(), "p".into())
        ]
    );
    // A quoted name after a bare one, or after a label, is malformed.
    assert_eq!(parse_line(r#"m{"other"} 1"#), Line::Invalid);
    assert_eq!(parse_line(r#"{a="b", "name"} 1"#), Line::Invalid);
}

#[test]
fn leading_blanks_tabs_and_crlf() {
    let s = sample("  \tm\t{a=\"1\"}\t 2 \r");
    assert_eq!(s.name, "m");
    assert_eq!(s.value, 2.0);
    let page = b"a 1\r\nb 2\r\n";
    let names: Vec<_> = lines(page)
        .filter_map(|l| match l {
            Line::Sample(s) => Some((s.name.into_owned(), s.value)),
            _ => None,
        })
        .collect();
    assert_eq!(names, [("a".into(), 1.0), ("b".into(), 2.0)]);
}

#[test]
fn help_type_and_comments() {
    assert_eq!(
        parse_line("# HELP vllm:x Number of \\n things."),
        Line::Help {
            name: "vllm:x",
            text: "Number of \\n things."
        }
    );
    assert_eq!(
        parse_line("# HELP vllm:x"),
        Line::Help {
            name: "vllm:x",
            text: ""
        }
    );
    assert_eq!(
        parse_line("# TYPE h histogram"),
        Line::Type {
            name: "h",
            kind: MetricKind::Histogram
        }
    );
    for (word, kind) in [
        ("counter", MetricKind::Counter),
        ("gauge", MetricKind::Gauge),
        ("summary", MetricKind::Summary),
        ("untyped", MetricKind::Untyped),
        ("unknown", MetricKind::Untyped),
        ("info", MetricKind::Other),
    ] {
        let line = alloc::format!("# TYPE m {word}");
        assert_eq!(parse_line(&line), Line::Type { name: "m", kind });
    }
    assert_eq!(parse_line("# just a comment"), Line::Comment);
    assert_eq!(parse_line("#HELP m x"), Line::Comment);
    assert_eq!(parse_line("# TYPE m"), Line::Comment);
    assert_eq!(parse_line("# TYPE m gauge extra"), Line::Comment);
    assert_eq!(parse_line("# EOF"), Line::Comment);
    assert_eq!(parse_line("   # indented comment"), Line::Comment);
}

#[test]
fn blank_lines() {
    assert_eq!(parse_line(""), Line::Blank);
    assert_eq!(parse_line(" \t "), Line::Blank);
    assert_eq!(parse_line("\r"), Line::Blank);
}

#[test]
fn histogram_and_summary_lines_are_plain_samples() {
    let s = sample(r#"ttft_bucket{model_name="m",le="+Inf"} 60.0"#);
    assert_eq!(s.name, "ttft_bucket");
    assert_eq!(s.label("le").as_deref(), Some("+Inf"));
    let s = sample(r#"rpc{quantile="0.99"} 0.12"#);
    assert_eq!(s.label("quantile").as_deref(), Some("0.99"));
}

#[test]
fn garbage_lines_are_invalid() {
    for line in [
        "m",
        "m ",
        "m abc",
        "m 1 2 3",
        "m 1 ts",
        "m-1 2",
        "1m 2",
        "m{a=\"1\" 2",
        "m{a=1} 2",
        "m{a=\"unterminated} 2",
        "m{=\"x\"} 2",
        "m{a} 2",
        "m{a=\"1\"}} 2",
        "m{a=\"1\"\"b\"=\"2\"} 3",
        "{} 1",
        "{\"\"} 1",
        "m 1_000",
        "m 0x10",
        "m{a=\"x\\\"} 1",
        "\u{0}",
        "}{",
    ] {
        assert_eq!(parse_line(line), Line::Invalid, "{line:?}");
    }
}

#[test]
fn invalid_utf8_line_is_invalid_but_neighbours_survive() {
    let page = b"a 1\n\xff\xfe 2\nb 3\n";
    let kinds: Vec<_> = lines(page)
        .map(|l| match l {
            Line::Sample(s) => s.name.into_owned(),
            Line::Invalid => "<invalid>".into(),
            _ => "<other>".into(),
        })
        .collect();
    assert_eq!(kinds, ["a", "<invalid>", "b", "<other>"]);
}
