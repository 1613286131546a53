//! The product module as one Envoy worker runs it: a scraper VM and a worker VM (router and
//! picker plugins sharing one `vm_id`), the shipped example configurations, and a request
//! driven through both filters the way Envoy chains them.

use super::{product_module, testdata};
use infergate_wasm_host::{Action, HeaderMap, Host, HttpCallResponse, SharedData};

/// The base model of the example `llama-pool`.
pub const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// The members of `llama-pool` in `testdata/filters/picker.json`.
pub const LLAMA_POOL: [&str; 3] = ["127.0.0.1:18001", "127.0.0.1:18002", "127.0.0.1:18003"];

/// A scraper VM and one worker VM holding the router and the picker.
pub struct Gateway {
    /// The scraper singleton.
    pub scraper: Host,
    /// The worker VM (router and picker plugins).
    pub worker: Host,
    /// Root context of the router plugin.
    pub router: u32,
    /// Root context of the picker plugin.
    pub picker: u32,
}

/// What became of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answered locally with this status (by the router or the picker).
    Reply(u32),
    /// Forwarded upstream with these headers.
    Forwarded(HeaderMap),
    /// Neither: a filter holds the request.
    Held,
}

impl Outcome {
    /// The status of a local reply, if it was one.
    pub fn status(&self) -> Option<u32> {
        match self {
            Outcome::Reply(status) => Some(*status),
            _ => None,
        }
    }

    /// The destination the picker set, if forwarded.
    pub fn destination(&self) -> Option<Vec<String>> {
        match self {
            Outcome::Forwarded(up) => Some(up.get_all("x-gateway-destination-endpoint")),
            _ => None,
        }
    }
}

/// A metrics page of one vLLM replica.
pub fn vllm_page(kv: f64) -> String {
    format!(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{model_name=\"{LLAMA}\"}} 1.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"{LLAMA}\"}} 0.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{model_name=\"{LLAMA}\"}} {kv}\n"
    )
}

/// Answers every pending scrape with a healthy page; how many there were.
pub fn answer_scrapes(scraper: &Host) -> usize {
    let calls = scraper.pending_http_calls();
    for call in &calls {
        scraper
            .respond_http_call(call.token, HttpCallResponse::new(200, vllm_page(0.2)))
            .expect("answer a scrape");
    }
    calls.len()
}

/// A chat completion body.
pub fn chat(text: &str) -> String {
    format!(r#"{{"model":"{LLAMA}","messages":[{{"role":"user","content":"{text}"}}]}}"#)
}

/// The headers of a chat completion request, plus `extra` (byte values).
pub fn chat_headers(extra: &[(&str, &[u8])]) -> HeaderMap {
    let mut map = HeaderMap::from_pairs(&[
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ]);
    for (name, value) in extra {
        map.add(name, value);
    }
    map
}

impl Gateway {
    /// Scraper and worker with the example configurations, one scrape round answered.
    pub fn start() -> Gateway {
        let shared = SharedData::new();
        let scraper = Host::builder()
            .vm_id("infergate")
            .shared_data(&shared)
            .load(product_module())
            .expect("load the scraper VM");
        scraper
            .configure_plugin(
                "picker",
                super::picker_with_scraper(&testdata("filters/scraper.json")),
            )
            .expect("configure the scraper");
        scraper.advance_time_ms(50).expect("first tick");
        assert_eq!(answer_scrapes(&scraper), 4);
        let worker = Host::builder()
            .vm_id("infergate")
            .shared_data(&shared)
            .time_ms(scraper.now_ms())
            .load(product_module())
            .expect("load the worker VM");
        let router = worker
            .configure_plugin("router", testdata("filters/router.json"))
            .expect("configure the router");
        let picker = worker
            .configure_plugin("picker", testdata("filters/picker.json"))
            .expect("configure the picker");
        Gateway {
            scraper,
            worker,
            router,
            picker,
        }
    }

    /// One request through the router, then (if the router forwarded it) the picker, then a
    /// short response and the end of both streams.
    pub fn request(&self, headers: HeaderMap, body: &[u8]) -> anyhow::Result<Outcome> {
        let r = self.worker.new_http_stream_on(self.router)?;
        let mut action = r.request_header_map_in(headers, body.is_empty())?;
        if action == Action::Pause && !body.is_empty() && r.local_response().is_none() {
            action = r.request_body(body, true)?;
        }
        let forwarded = r.upstream_request_headers();
        let handoff = r.property(&["infergate_handoff"]);
        let outcome = match (r.local_response(), forwarded) {
            (Some(reply), _) => Outcome::Reply(reply.status),
            (None, Some(up)) if action == Action::Continue => self.pick(up, handoff, body)?,
            _ => Outcome::Held,
        };
        r.done()?;
        Ok(outcome)
    }

    /// The picker's part of a request the router forwarded.
    fn pick(
        &self,
        headers: HeaderMap,
        handoff: Option<Vec<u8>>,
        body: &[u8],
    ) -> anyhow::Result<Outcome> {
        let p = self.worker.new_http_stream_on(self.picker)?;
        if let Some(handoff) = handoff {
            p.set_property(&["infergate_handoff"], handoff)?;
        }
        let mut action = p.request_header_map_in(headers, body.is_empty())?;
        if action == Action::Pause && !body.is_empty() && p.local_response().is_none() {
            action = p.request_body(body, true)?;
        }
        // The picker paused for the state owner (the scraper VM): carry the pick to it and
        // the answer back, which resumes the stream.
        self.exchange_queue_messages()?;
        let resumed = p.upstream_request_headers().is_some();
        let outcome = match (p.local_response(), p.upstream_request_headers()) {
            (Some(reply), _) => Outcome::Reply(reply.status),
            (None, Some(up)) if action == Action::Continue || resumed => {
                p.response_headers(&[(":status", "200")], false)?;
                p.response_body(b"data: [DONE]\n\n", true)?;
                Outcome::Forwarded(up)
            }
            _ => Outcome::Held,
        };
        p.done()?;
        // The lease's release, to the owner.
        self.exchange_queue_messages()?;
        Ok(outcome)
    }

    /// Deliver shared-queue messages between the two VMs until none is left.
    pub fn exchange_queue_messages(&self) -> anyhow::Result<()> {
        for _ in 0..8 {
            if self.scraper.deliver_queues()? + self.worker.deliver_queues()? == 0 {
                return Ok(());
            }
        }
        anyhow::bail!("the VMs keep answering each other's queue messages")
    }

    /// A plain chat request is picked into the pool, and neither VM has trapped.
    pub fn assert_serving(&self) {
        let outcome = self
            .request(chat_headers(&[]), chat("are you still there?").as_bytes())
            .expect("a plain request");
        let dest = outcome.destination().unwrap_or_default();
        assert_eq!(dest.len(), 1, "one header value: {outcome:?}");
        // The pick, then its fallbacks: every one an endpoint of the pool.
        assert!(
            dest[0].split(',').all(|e| LLAMA_POOL.contains(&e)),
            "{dest:?}"
        );
        assert_eq!(self.worker.trapped(), None);
        assert_eq!(self.scraper.trapped(), None);
    }
}
