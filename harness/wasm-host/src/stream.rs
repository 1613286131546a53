//! [`HttpStream`]: one HTTP request/response through the module, driven step by step.
//!
//! The test delivers what Envoy would (request headers, body chunks, trailers, then the
//! response) and inspects what would leave the proxy. The forwarding model follows Envoy's:
//! a direction's headers go on when a callback returns `Continue` (or the module calls
//! `proxy_continue_stream`); a body chunk that meets `Pause` stays buffered, and the next
//! chunk's callback sees the whole buffer (`body_size` grows); `Continue` forwards it.
//! Header writes after the headers were forwarded are recorded as late writes: Envoy would
//! ignore them for routing.

use crate::abi::Action;
use crate::headers::HeaderMap;
use crate::host::Host;
use crate::runtime::release;
use crate::state::{Direction, LocalResponse, StreamState};
use anyhow::{anyhow, Result};
use std::collections::BTreeMap;

/// Which direction a callback belongs to.
#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}

/// One HTTP stream context of a [`Host`].
pub struct HttpStream {
    host: Host,
    id: u32,
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl HttpStream {
    pub(crate) fn new(host: Host, id: u32) -> Self {
        Self { host, id }
    }

    /// The stream's context id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Delivers the request headers (`proxy_on_request_headers`).
    pub fn request_headers(&self, headers: &[(&str, &str)], end_of_stream: bool) -> Result<Action> {
        self.headers(Side::Request, HeaderMap::from_pairs(headers), end_of_stream)
    }

    /// Delivers request headers given as a map, so values can be any bytes
    /// (`proxy_on_request_headers`).
    pub fn request_header_map_in(&self, headers: HeaderMap, end_of_stream: bool) -> Result<Action> {
        self.headers(Side::Request, headers, end_of_stream)
    }

    /// Delivers a request body chunk (`proxy_on_request_body`).
    pub fn request_body(&self, chunk: &[u8], end_of_stream: bool) -> Result<Action> {
        self.body(Side::Request, chunk, end_of_stream)
    }

    /// Delivers request trailers (`proxy_on_request_trailers`).
    pub fn request_trailers(&self, trailers: &[(&str, &str)]) -> Result<Action> {
        self.trailers(Side::Request, HeaderMap::from_pairs(trailers))
    }

    /// Delivers the response headers (`proxy_on_response_headers`).
    pub fn response_headers(
        &self,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<Action> {
        self.headers(
            Side::Response,
            HeaderMap::from_pairs(headers),
            end_of_stream,
        )
    }

    /// Delivers a response body chunk (`proxy_on_response_body`).
    pub fn response_body(&self, chunk: &[u8], end_of_stream: bool) -> Result<Action> {
        self.body(Side::Response, chunk, end_of_stream)
    }

    /// Delivers response trailers (`proxy_on_response_trailers`).
    pub fn response_trailers(&self, trailers: &[(&str, &str)]) -> Result<Action> {
        self.trailers(Side::Response, HeaderMap::from_pairs(trailers))
    }

    /// Ends the stream (complete or reset): `proxy_on_done`, then `proxy_on_log` and
    /// `proxy_on_delete` if the module agreed. Returns whether the context was deleted; if
    /// not, it is deleted when the module calls `proxy_done`.
    pub fn done(&self) -> Result<bool> {
        let id = self.id;
        let mut rt = self.host.rt()?;
        if rt.store.data().streams.get(&id).is_some_and(|s| s.deleted) {
            return Ok(true);
        }
        let completed = match rt.exports.done.clone() {
            Some(f) => rt.call("proxy_on_done", id, |s| f.call(s, id))? != 0,
            None => true,
        };
        let deleted = rt.store.data().streams.get(&id).is_some_and(|s| s.deleted);
        if completed && !deleted {
            rt.finish(id)?;
        } else if !completed {
            if let Some(stream) = rt.store.data_mut().streams.get_mut(&id) {
                stream.awaiting_done = true;
            }
        }
        Ok(completed || deleted)
    }

    fn headers(&self, side: Side, map: HeaderMap, end_of_stream: bool) -> Result<Action> {
        let id = self.id;
        let n = count(map.len());
        let mut rt = self.host.rt()?;
        let f = {
            let direction = direction_of(&mut rt.store.data_mut().streams, id, side)?;
            direction.headers = Some(map);
            direction.end_of_stream = end_of_stream;
            match side {
                Side::Request => rt.exports.request_headers.clone(),
                Side::Response => rt.exports.response_headers.clone(),
            }
        };
        let action = match f {
            Some(f) => Action::from_code(rt.call(callback_name(side, "headers"), id, |s| {
                f.call(s, (id, n, u32::from(end_of_stream)))
            })?),
            None => Action::Continue,
        };
        self.apply(&mut rt.store.data_mut().streams, side, action);
        Ok(action)
    }

    fn body(&self, side: Side, chunk: &[u8], end_of_stream: bool) -> Result<Action> {
        let id = self.id;
        let mut rt = self.host.rt()?;
        let (f, size) = {
            let direction = direction_of(&mut rt.store.data_mut().streams, id, side)?;
            direction.buffered.extend_from_slice(chunk);
            direction.end_of_stream = end_of_stream;
            let size = count(direction.buffered.len());
            let f = match side {
                Side::Request => rt.exports.request_body.clone(),
                Side::Response => rt.exports.response_body.clone(),
            };
            (f, size)
        };
        let action = match f {
            Some(f) => Action::from_code(rt.call(callback_name(side, "body"), id, |s| {
                f.call(s, (id, size, u32::from(end_of_stream)))
            })?),
            None => Action::Continue,
        };
        self.apply(&mut rt.store.data_mut().streams, side, action);
        Ok(action)
    }

    fn trailers(&self, side: Side, map: HeaderMap) -> Result<Action> {
        let id = self.id;
        let n = count(map.len());
        let mut rt = self.host.rt()?;
        let f = {
            let direction = direction_of(&mut rt.store.data_mut().streams, id, side)?;
            direction.trailers = Some(map);
            direction.end_of_stream = true;
            match side {
                Side::Request => rt.exports.request_trailers.clone(),
                Side::Response => rt.exports.response_trailers.clone(),
            }
        };
        let action = match f {
            Some(f) => Action::from_code(
                rt.call(callback_name(side, "trailers"), id, |s| f.call(s, (id, n)))?,
            ),
            None => Action::Continue,
        };
        self.apply(&mut rt.store.data_mut().streams, side, action);
        Ok(action)
    }

    /// `Continue` forwards the direction, unless the module answered locally.
    fn apply(
        &self,
        streams: &mut std::collections::BTreeMap<u32, StreamState>,
        side: Side,
        action: Action,
    ) {
        let Some(stream) = streams.get_mut(&self.id) else {
            return;
        };
        if action != Action::Continue || stream.local_response.is_some() {
            return;
        }
        match side {
            Side::Request => release(&mut stream.request),
            Side::Response => release(&mut stream.response),
        }
    }

    /// Everything the host knows about this stream.
    pub fn state(&self) -> StreamState {
        self.host.stream_state(self.id).unwrap_or_default()
    }

    /// The request headers as the module left them.
    pub fn request_header_map(&self) -> HeaderMap {
        self.state().request.headers.unwrap_or_default()
    }

    /// One request header as the module left it.
    pub fn request_header(&self, key: &str) -> Option<String> {
        self.request_header_map().get(key)
    }

    /// The request headers as forwarded upstream (`None` while held by the module).
    pub fn upstream_request_headers(&self) -> Option<HeaderMap> {
        self.state().request.forwarded_headers
    }

    /// The request body forwarded upstream so far.
    pub fn upstream_request_body(&self) -> Vec<u8> {
        self.state().request.forwarded
    }

    /// The response headers as the module left them.
    pub fn response_header_map(&self) -> HeaderMap {
        self.state().response.headers.unwrap_or_default()
    }

    /// The response headers as forwarded downstream (`None` while held by the module).
    pub fn downstream_response_headers(&self) -> Option<HeaderMap> {
        self.state().response.forwarded_headers
    }

    /// The response body forwarded downstream so far.
    pub fn downstream_response_body(&self) -> Vec<u8> {
        self.state().response.forwarded
    }

    /// The local reply the module sent, if any.
    pub fn local_response(&self) -> Option<LocalResponse> {
        self.state().local_response
    }

    /// Request header keys written after the request headers were forwarded.
    pub fn late_request_header_writes(&self) -> Vec<String> {
        self.state().request.late_header_writes
    }

    /// A property set on this stream (by the module or the test).
    pub fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let key: Vec<String> = path.iter().map(|p| p.to_string()).collect();
        self.state().properties.get(&key).cloned()
    }

    /// Sets a stream property the module can read (e.g. `source.address`).
    pub fn set_property(&self, path: &[&str], value: impl Into<Vec<u8>>) -> Result<()> {
        let key: Vec<String> = path.iter().map(|p| p.to_string()).collect();
        let mut rt = self.host.rt()?;
        let stream = rt
            .store
            .data_mut()
            .streams
            .get_mut(&self.id)
            .ok_or_else(|| anyhow!("stream {} is gone", self.id))?;
        stream.properties.insert(key, value.into());
        Ok(())
    }
}

fn callback_name(side: Side, what: &str) -> &'static str {
    match (side, what) {
        (Side::Request, "headers") => "proxy_on_request_headers",
        (Side::Request, "body") => "proxy_on_request_body",
        (Side::Request, _) => "proxy_on_request_trailers",
        (Side::Response, "headers") => "proxy_on_response_headers",
        (Side::Response, "body") => "proxy_on_response_body",
        (Side::Response, _) => "proxy_on_response_trailers",
    }
}

/// The `side` direction of the live stream `id`.
fn direction_of(
    streams: &mut BTreeMap<u32, StreamState>,
    id: u32,
    side: Side,
) -> Result<&mut Direction> {
    let stream = streams
        .get_mut(&id)
        .ok_or_else(|| anyhow!("stream {id} is gone"))?;
    Ok(match side {
        Side::Request => &mut stream.request,
        Side::Response => &mut stream.response,
    })
}
