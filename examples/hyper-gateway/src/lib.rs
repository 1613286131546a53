//! The gateway embedded in a hyper reverse proxy: the third host of the filters crate, after
//! the proxy-wasm module and the Envoy dynamic module, written only against its public API.
//!
//! - [`Gateway::from_config`] reads the native flavour's `gateway` filter config (`{"router":
//!   ..., "picker": {..., "scraper": ...}}`) and builds the same pipeline Envoy runs
//!   (`filters::stages::gateway_pipeline`: the router's stages, then the picker's) over one
//!   picker state for the process.
//! - [`serve`] runs it: one thread per worker, each a current-thread tokio runtime (a
//!   pipeline [`Run`] keeps the stages' per-request data, which is not `Send`, so a request
//!   stays on its worker, as in Envoy), and one background thread for the scraper and flow
//!   control's timer.
//! - Per request ([`handle`]): headers and body into the run, a paused run waits for its
//!   waker, then the request goes to the first endpoint of the picker's
//!   `x-gateway-destination-endpoint` list that answers (the next on a connection failure,
//!   as Envoy's `override_host` does on a retry), and the response streams back through the
//!   response-side stages; the run ends when the response body is dropped, finished or not.
//!
//! [`host`] implements the host traits.

pub mod host;

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderName, HeaderValue, HOST};
use hyper::{HeaderMap, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use infergate_filters::consistency::{LoadedConfigs, PickerDeclaration};
use infergate_filters::headers::DESTINATION_ENDPOINT;
use infergate_filters::host::{CalloutOutcome, Clock, RequestHeaders};
use infergate_filters::picker::{PickerShared, SharedPicker};
use infergate_filters::pipeline::{Run, SyncPipeline};
use infergate_filters::quotas::{MemoryQuotas, QuotaStore};
use infergate_filters::reply::Reply;
use infergate_filters::router::BlockSizeSource;
use infergate_filters::scraper::Scraper;
use infergate_filters::stages::{gateway_pipeline, PickerRole, RouterRole, TestStages};
use infergate_filters::FilterStatus;
use serde_json::Value;
use tokio::sync::mpsc;

use host::{Answer, Host, Shared};

/// The response body: a local reply, or the upstream's through the response-side stages.
pub type ProxyBody = Either<Full<Bytes>, Filtered>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One configured gateway: its pipeline, its picker state and what its requests share.
pub struct Gateway {
    pipeline: SyncPipeline<Host>,
    picker: Arc<SharedPicker>,
    shared: Arc<Shared>,
    /// The scraper and its callouts' answers, until [`serve`] starts them.
    scraper: Option<(Scraper, mpsc::UnboundedReceiver<Answer>)>,
}

/// The block sizes of the picker's pools, for the router's handoff.
struct BlockSizes(LoadedConfigs);

impl BlockSizeSource for BlockSizes {
    fn block_size_tokens(&self, base_model: &str) -> Option<u32> {
        self.0.block_size_tokens(base_model)
    }
}

impl Gateway {
    /// The gateway of a `gateway` filter config.
    pub fn from_config(mut config: Value) -> Result<Gateway, String> {
        let mut part = |name: &str| -> Result<Value, String> {
            let mut part = config
                .get_mut(name)
                .map(Value::take)
                .ok_or(format!("no `{name}`"))?;
            if let Some(map) = part.as_object_mut() {
                map.remove("role");
            }
            Ok(part)
        };
        let (router, mut picker) = (part("router")?, part("picker")?);
        let scraper = picker.as_object_mut().and_then(|m| m.remove("scraper"));
        let scraper = Scraper::from_json(scraper.ok_or("the picker carries no `scraper`")?)?;
        let state = PickerShared::from_json(picker).map_err(|e| e.to_string())?;
        let picker = Arc::new(SharedPicker::new(state));
        // The checks Envoy makes between the loaded configs, and the router's block sizes.
        let mut loaded = LoadedConfigs::new();
        loaded.add_picker(PickerDeclaration::of(picker.plans()))?;
        loaded.add_scraper(scraper.endpoints())?;
        let sizes = Arc::new(BlockSizes(loaded));
        let router = RouterRole::from_json(
            router,
            TestStages::none(),
            |_| -> Arc<dyn QuotaStore> { MemoryQuotas::process() },
            sizes,
        )?;
        let role = PickerRole::new(Arc::clone(&picker), TestStages::none());
        let (answers, answered) = mpsc::unbounded_channel();
        Ok(Gateway {
            pipeline: gateway_pipeline(router, role),
            picker,
            shared: Arc::new(Shared::new(answers)),
            scraper: Some((scraper, answered)),
        })
    }

    /// Every counter and gauge written so far, by flattened name (`infergate.picker...`).
    pub fn stats(&self) -> std::collections::BTreeMap<String, i64> {
        self.shared.stats()
    }
}

/// The `gateway` filter config in `text`: that JSON itself, or the `infergate.gateway`
/// filter's config inside an Envoy bootstrap (`infergate render --target envoy --flavor
/// native`), YAML or JSON.
pub fn gateway_config(text: &str) -> Result<Value, String> {
    fn find(v: &Value) -> Option<Value> {
        match v {
            Value::Object(m)
                if m.get("name").and_then(Value::as_str) == Some("infergate.gateway") =>
            {
                serde_json::from_str(
                    m.get("typed_config")?
                        .get("filter_config")?
                        .get("value")?
                        .as_str()?,
                )
                .ok()
            }
            Value::Object(m) => m.values().find_map(find),
            Value::Array(a) => a.iter().find_map(find),
            _ => None,
        }
    }
    let doc: Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    if doc.get("router").is_some() {
        return Ok(doc);
    }
    find(&doc).ok_or_else(|| {
        "neither a gateway config nor a bootstrap with an `infergate.gateway` filter".into()
    })
}

/// Serves `gateway` on `listener` with `workers` threads, and starts its background thread.
pub fn serve(
    mut gateway: Gateway,
    listener: std::net::TcpListener,
    workers: usize,
) -> Result<Arc<Gateway>, BoxError> {
    listener.set_nonblocking(true)?;
    let scraper = gateway
        .scraper
        .take()
        .ok_or("the gateway is served already")?;
    let gateway = Arc::new(gateway);
    on_thread(
        "infergate-background".into(),
        background(Arc::clone(&gateway), scraper),
    )?;
    for i in 0..workers.max(1) {
        let (gw, listener) = (Arc::clone(&gateway), listener.try_clone()?);
        on_thread(format!("infergate-worker-{i}"), async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            loop {
                let (stream, _) = listener.accept().await?;
                let gw = Arc::clone(&gw);
                let service = hyper::service::service_fn(move |req| handle(Arc::clone(&gw), req));
                let conn = hyper::server::conn::http1::Builder::new();
                tokio::task::spawn_local(conn.serve_connection(TokioIo::new(stream), service));
            }
        })?;
    }
    Ok(gateway)
}

/// Runs `task` on a thread of its own, in a current-thread runtime that can spawn `!Send`
/// tasks.
fn on_thread<F>(name: String, task: F) -> std::io::Result<()>
where
    F: std::future::Future<Output = Result<(), BoxError>> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            if let Err(e) = tokio::task::LocalSet::new().block_on(&runtime, task) {
                eprintln!("{name}: {e}");
            }
        })?;
    Ok(())
}

/// The scraper's ticks and answers, and flow control's dispatch timer.
async fn background(
    gw: Arc<Gateway>,
    scraper: (Scraper, mpsc::UnboundedReceiver<Answer>),
) -> Result<(), BoxError> {
    let (mut scraper, mut answered) = scraper;
    let mut host = Host::new(Arc::clone(&gw.shared), Vec::new());
    let period = scraper.tick_period_ms();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(period));
    let mut flow = tokio::time::interval(std::time::Duration::from_millis(10));
    let state = gw.picker.state();
    loop {
        tokio::select! {
            _ = tick.tick() => scraper.on_tick(&mut host),
            Some((token, answer)) = answered.recv() => {
                let outcome = match answer {
                    Some((status, body)) => scraper.callout_outcome(status, body.len(), || body),
                    None => CalloutOutcome::Failed,
                };
                scraper.on_callout_done(&mut host, token, outcome);
            }
            _ = flow.tick(), if state.has_flow_control() => {
                state.refresh_snapshot(&*gw.shared);
                state.run_flow_control(host.now().0);
            }
        }
    }
}

/// A `GET` of `path` from `addr`: its status and body, `None` on any failure.
pub(crate) async fn get(addr: String, path: String) -> Option<(u16, Vec<u8>)> {
    let request = Request::get(path)
        .header(HOST, &addr)
        .body(Full::default())
        .ok()?;
    let response = send(&addr, request).await.ok()?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.ok()?;
    Some((status, body.to_bytes().to_vec()))
}

/// Sends `request` to `addr` on a new HTTP/1.1 connection.
async fn send(addr: &str, request: Request<Full<Bytes>>) -> Result<Response<Incoming>, BoxError> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender.send_request(request).await?)
}

/// Headers no proxy forwards (hop by hop), or that it sets itself.
const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "host",
    "content-length",
];

/// The headers of `map` as the host traits see them.
fn pairs(map: &HeaderMap) -> impl Iterator<Item = (String, String)> + '_ {
    let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    map.iter()
        .map(move |(k, v)| (k.as_str().to_owned(), text(v)))
}

/// Copies the forwarded ones of `headers` into `map`.
fn forward(headers: &[(String, String)], map: &mut HeaderMap) {
    for (k, v) in headers.iter().filter(|(k, _)| !k.starts_with(':')) {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
            if !NOT_FORWARDED.contains(&k.as_str()) {
                map.append(k, v);
            }
        }
    }
}

/// An OpenAI error this proxy answers itself.
fn error(status: u16, message: &str) -> Reply {
    let kind = if status < 500 {
        "invalid_request_error"
    } else {
        "server_error"
    };
    Reply::openai_error(status, kind, message, None, None)
}

/// One request's run through the pipeline, on its host; ends the run when dropped.
pub struct Exchange {
    gw: Arc<Gateway>,
    run: Run,
    host: Host,
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.run.end(&self.gw.pipeline, &mut self.host);
    }
}

/// Serves one request.
pub async fn handle(
    gw: Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (parts, mut body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let authority = parts.headers.get(HOST).and_then(|h| h.to_str().ok());
    let mut headers = vec![
        (":method".into(), parts.method.to_string()),
        (":path".into(), path.into()),
        (":authority".into(), authority.unwrap_or_default().into()),
    ];
    headers.extend(pairs(&parts.headers));
    let host = Host::new(Arc::clone(&gw.shared), headers);
    let mut ex = Exchange {
        gw: Arc::clone(&gw),
        run: Run::new(),
        host,
    };
    // The request side: headers, each body chunk, and the wakes of a paused stage.
    let mut done = body.is_end_stream();
    ex.host.body_complete = done;
    let mut status = ex.run.request_headers(&gw.pipeline, &mut ex.host, done);
    while !done && status != FilterStatus::Replied {
        let Ok(frame) = body.frame().await.transpose() else {
            return Ok(ex.reply(error(400, "the request body broke off")));
        };
        done = frame.is_none() || body.is_end_stream();
        if let Some(Ok(data)) = frame.map(Frame::into_data) {
            ex.host.body.extend_from_slice(&data);
        }
        ex.host.body_complete = done;
        let len = ex.host.body.len();
        status = ex.run.request_body(&gw.pipeline, &mut ex.host, len, done);
    }
    while ex.run.is_paused() {
        ex.host.woken.notified().await;
        status = ex.run.wake(&gw.pipeline, &mut ex.host).unwrap_or(status);
    }
    if status == FilterStatus::Replied {
        let reply = ex.host.reply.take();
        return Ok(ex.reply(reply.unwrap_or_else(|| Reply::internal("no reply"))));
    }
    // Upstream: the picker's list in order, the next on a connection failure.
    let Some(list) = ex.host.request_header(DESTINATION_ENDPOINT) else {
        return Ok(ex.reply(error(404, "no route: not an inference request")));
    };
    let body = Bytes::from(std::mem::take(&mut ex.host.body));
    for addr in list.split(',') {
        let mut request = Request::new(Full::new(body.clone()));
        (*request.method_mut(), *request.uri_mut()) = (parts.method.clone(), parts.uri.clone());
        forward(&ex.host.request, request.headers_mut());
        let Ok(authority) = HeaderValue::try_from(addr) else {
            break;
        };
        request.headers_mut().insert(HOST, authority);
        if let Ok(response) = send(addr, request).await {
            ex.host.served = Some(addr.to_owned());
            return Ok(ex.respond(response));
        }
    }
    Ok(ex.reply(error(503, "no endpoint answered")))
}

impl Exchange {
    /// Answers `reply`; the response-side stages see its headers.
    fn reply(mut self, reply: Reply) -> Response<ProxyBody> {
        self.host.response = reply.headers.clone();
        self.host
            .response
            .push((":status".into(), reply.status.to_string()));
        self.run
            .response_headers(&self.gw.pipeline, &mut self.host, false);
        let body = Either::Left(Full::new(Bytes::from(reply.body)));
        self.response(reply.status, body)
    }

    /// A response with `body` and the headers the stages leave in the host.
    fn response(&self, status: u16, body: ProxyBody) -> Response<ProxyBody> {
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        forward(&self.host.response, response.headers_mut());
        response
    }

    /// The upstream's response, its headers through the response-side stages now and its
    /// body chunk by chunk as it streams.
    fn respond(mut self, response: Response<Incoming>) -> Response<ProxyBody> {
        let (parts, body) = response.into_parts();
        self.host.response = vec![(":status".into(), parts.status.as_u16().to_string())];
        self.host.response.extend(pairs(&parts.headers));
        let ended = body.is_end_stream();
        self.run
            .response_headers(&self.gw.pipeline, &mut self.host, ended);
        let mut response = self.response(parts.status.as_u16(), Either::Left(Full::default()));
        *response.body_mut() = Either::Right(Filtered {
            body,
            ex: self,
            ended,
        });
        response
    }
}

/// The upstream's body, each chunk through the response-side stages.
pub struct Filtered {
    body: Incoming,
    ex: Exchange,
    ended: bool,
}

impl Filtered {
    /// Runs `data` through the stages (`end`: it is the last); what they let pass.
    fn chunk(&mut self, data: Bytes, end: bool) -> Bytes {
        let ex = &mut self.ex;
        ex.host.chunk = Some(data.into());
        ex.run.response_chunk(&ex.gw.pipeline, &mut ex.host, end);
        self.ended |= end;
        ex.host.chunk.take().map(Bytes::from).unwrap_or_default()
    }
}

impl Body for Filtered {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = std::task::ready!(std::pin::Pin::new(&mut this.body).poll_frame(cx));
        std::task::Poll::Ready(match polled {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    let end = this.body.is_end_stream();
                    Some(Ok(Frame::data(this.chunk(data, end))))
                }
                Err(trailers) => {
                    this.ended = true;
                    this.ex.run.response_trailers();
                    Some(Ok(trailers))
                }
            },
            None if !this.ended => Some(Ok(Frame::data(this.chunk(Bytes::new(), true)))),
            other => other,
        })
    }
}
