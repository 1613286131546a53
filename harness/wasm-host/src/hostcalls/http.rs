//! Header maps, stream control, local replies and outbound HTTP (and refused gRPC) calls.
//!
//! Availability mirrors Envoy: reading a map that is not available now yields an empty map
//! from `get_header_map_pairs` but `BadArgument` from the single-value and write calls.

use crate::abi::{MapType, Status, StreamType};
use crate::headers::HeaderMap;
use crate::memory::{
    injected_bytes, injected_status, read, read_string, return_bytes, status, write_u32, CallResult,
};
use crate::state::{Direction, HostState, HttpCall, LocalResponse};
use wasmtime::{Caller, Linker};

type C<'a> = Caller<'a, HostState>;

pub(super) fn add(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_header_map_pairs", get_pairs)?;
    linker.func_wrap("env", "proxy_set_header_map_pairs", set_pairs)?;
    linker.func_wrap("env", "proxy_get_header_map_size", get_size)?;
    linker.func_wrap("env", "proxy_get_header_map_value", get_value)?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |c: C<'_>, m: u32, kp: u32, kl: u32, vp: u32, vl: u32| {
            let add = |map: &mut HeaderMap, k: &str, v: &[u8]| map.add(k, v);
            edit(
                c,
                "proxy_add_header_map_value",
                m,
                kp,
                kl,
                Some((vp, vl)),
                add,
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |c: C<'_>, m: u32, kp: u32, kl: u32, vp: u32, vl: u32| {
            let replace = |map: &mut HeaderMap, k: &str, v: &[u8]| map.replace(k, v);
            edit(
                c,
                "proxy_replace_header_map_value",
                m,
                kp,
                kl,
                Some((vp, vl)),
                replace,
            )
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |c: C<'_>, m: u32, kp: u32, kl: u32| {
            let remove = |map: &mut HeaderMap, k: &str, _: &[u8]| map.remove(k);
            edit(c, "proxy_remove_header_map_value", m, kp, kl, None, remove)
        },
    )?;
    linker.func_wrap("env", "proxy_send_local_response", send_local_response)?;
    linker.func_wrap("env", "proxy_continue_stream", |mut c: C<'_>, kind: u32| {
        if let Some(code) = injected_status(&c, "proxy_continue_stream") {
            return code;
        }
        stream_control(&mut c, kind, |d| d.continue_requested = true)
    })?;
    linker.func_wrap("env", "proxy_close_stream", |mut c: C<'_>, kind: u32| {
        stream_control(&mut c, kind, |d| d.closed = true)
    })?;
    linker.func_wrap("env", "proxy_http_call", http_call)?;
    linker.func_wrap("env", "proxy_get_status", get_status)?;
    add_grpc(linker)
}

/// gRPC is not used by the project; calls fail the way a host without the cluster would.
fn add_grpc(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_grpc_call",
        |mut c: C<'_>,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32,
         _: u32| {
            c.data_mut().log(
                crate::abi::LogLevel::Warn,
                "host: gRPC calls are not supported".into(),
            );
            Status::InternalFailure.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_stream",
        |mut c: C<'_>, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32, _: u32| {
            c.data_mut().log(
                crate::abi::LogLevel::Warn,
                "host: gRPC streams are not supported".into(),
            );
            Status::InternalFailure.code()
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_grpc_send",
        |_: C<'_>, _: u32, _: u32, _: u32, _: u32| Status::NotFound.code(),
    )?;
    linker.func_wrap("env", "proxy_grpc_cancel", |_: C<'_>, _: u32| {
        Status::NotFound.code()
    })?;
    linker.func_wrap("env", "proxy_grpc_close", |_: C<'_>, _: u32| {
        Status::NotFound.code()
    })?;
    Ok(())
}

/// The map the module may read now (`None`: not available in this context).
fn const_map(state: &HostState, kind: MapType) -> Option<HeaderMap> {
    let stream = state.streams.get(&state.effective_context);
    match kind {
        MapType::HttpRequestHeaders => stream.and_then(|s| s.request.headers.clone()),
        MapType::HttpRequestTrailers => stream.and_then(|s| s.request.trailers.clone()),
        MapType::HttpResponseHeaders => stream.and_then(|s| s.response.headers.clone()),
        MapType::HttpResponseTrailers => stream.and_then(|s| s.response.trailers.clone()),
        MapType::HttpCallResponseHeaders => state.call_response.as_ref().map(|r| r.headers.clone()),
        MapType::HttpCallResponseTrailers => {
            state.call_response.as_ref().map(|r| r.trailers.clone())
        }
        MapType::GrpcReceiveInitialMetadata | MapType::GrpcReceiveTrailingMetadata => None,
    }
}

/// The map the module may write now, with its direction (to record late writes).
fn mutable_map(state: &mut HostState, kind: MapType) -> Option<(&mut HeaderMap, bool)> {
    let stream = state.effective_stream()?;
    let (direction, trailers): (&mut Direction, bool) = match kind {
        MapType::HttpRequestHeaders => (&mut stream.request, false),
        MapType::HttpRequestTrailers => (&mut stream.request, true),
        MapType::HttpResponseHeaders => (&mut stream.response, false),
        MapType::HttpResponseTrailers => (&mut stream.response, true),
        _ => return None,
    };
    if trailers {
        return direction.trailers.as_mut().map(|m| (m, false));
    }
    let already_forwarded = direction.forwarded_headers.is_some();
    direction.headers.as_mut().map(|m| (m, already_forwarded))
}

fn get_pairs(mut c: C<'_>, kind: u32, ptr_ptr: u32, size_ptr: u32) -> CallResult {
    if let Some(code) = injected_bytes(&mut c, "proxy_get_header_map_pairs", ptr_ptr, size_ptr)? {
        return Ok(code);
    }
    let Some(kind) = MapType::from_code(kind) else {
        return Ok(Status::BadArgument.code());
    };
    let map = const_map(c.data(), kind).unwrap_or_default();
    Ok(status(return_bytes(
        &mut c,
        &map.serialize(),
        ptr_ptr,
        size_ptr,
    )?))
}

fn get_size(mut c: C<'_>, kind: u32, size_ptr: u32) -> u32 {
    let Some(kind) = MapType::from_code(kind) else {
        return Status::BadArgument.code();
    };
    match const_map(c.data(), kind) {
        Some(map) => {
            let size = u32::try_from(map.serialize().len()).unwrap_or(u32::MAX);
            status(write_u32(&mut c, size_ptr, size))
        }
        None => Status::BadArgument.code(),
    }
}

fn set_pairs(mut c: C<'_>, kind: u32, ptr: u32, len: u32) -> u32 {
    let Some(kind) = MapType::from_code(kind) else {
        return Status::BadArgument.code();
    };
    let raw = match read(&mut c, ptr, len) {
        Ok(raw) => raw,
        Err(s) => return s.code(),
    };
    let Some(new_map) = HeaderMap::deserialize(&raw) else {
        return Status::ParseFailure.code();
    };
    let keys: Vec<String> = new_map.raw_pairs().iter().map(|(k, _)| k.clone()).collect();
    let late = match mutable_map(c.data_mut(), kind) {
        Some((map, late)) => {
            *map = new_map;
            late
        }
        None => return Status::BadArgument.code(),
    };
    if late {
        record_late(c.data_mut(), kind, keys);
    }
    Status::Ok.code()
}

fn get_value(
    mut c: C<'_>,
    kind: u32,
    key_ptr: u32,
    key_len: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> CallResult {
    if let Some(code) = injected_bytes(&mut c, "proxy_get_header_map_value", ptr_ptr, size_ptr)? {
        return Ok(code);
    }
    let Some(kind) = MapType::from_code(kind) else {
        return Ok(Status::BadArgument.code());
    };
    let key = match read_string(&mut c, key_ptr, key_len) {
        Ok(key) => key,
        Err(s) => return Ok(s.code()),
    };
    let Some(map) = const_map(c.data(), kind) else {
        return Ok(Status::BadArgument.code());
    };
    match map.get_bytes(&key) {
        Some(value) => {
            let value = value.to_vec();
            Ok(status(return_bytes(&mut c, &value, ptr_ptr, size_ptr)?))
        }
        None => Ok(Status::NotFound.code()),
    }
}

fn edit(
    mut c: C<'_>,
    name: &str,
    kind: u32,
    key_ptr: u32,
    key_len: u32,
    value: Option<(u32, u32)>,
    apply: impl FnOnce(&mut HeaderMap, &str, &[u8]),
) -> u32 {
    if let Some(code) = injected_status(&c, name) {
        return code;
    }
    let Some(kind) = MapType::from_code(kind) else {
        return Status::BadArgument.code();
    };
    let key = match read_string(&mut c, key_ptr, key_len) {
        Ok(key) => key,
        Err(s) => return s.code(),
    };
    let value = match value.map(|(p, l)| read(&mut c, p, l)).transpose() {
        Ok(v) => v.unwrap_or_default(),
        Err(s) => return s.code(),
    };
    let late = match mutable_map(c.data_mut(), kind) {
        Some((map, late)) => {
            apply(map, &key, &value);
            late
        }
        None => return Status::BadArgument.code(),
    };
    if late {
        record_late(c.data_mut(), kind, vec![key.to_ascii_lowercase()]);
    }
    Status::Ok.code()
}

fn record_late(state: &mut HostState, kind: MapType, keys: Vec<String>) {
    let Some(stream) = state.effective_stream() else {
        return;
    };
    let direction = match kind {
        MapType::HttpRequestHeaders => &mut stream.request,
        _ => &mut stream.response,
    };
    direction.late_header_writes.extend(keys);
}

#[allow(clippy::too_many_arguments)] // the ABI's signature
fn send_local_response(
    mut c: C<'_>,
    status_code: u32,
    details_ptr: u32,
    details_len: u32,
    body_ptr: u32,
    body_len: u32,
    headers_ptr: u32,
    headers_len: u32,
    grpc_status: i32,
) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_send_local_response") {
        return code;
    }
    let details = read_string(&mut c, details_ptr, details_len);
    let body = read(&mut c, body_ptr, body_len);
    let headers = read(&mut c, headers_ptr, headers_len);
    let (details, body, headers) = match (details, body, headers) {
        (Ok(d), Ok(b), Ok(h)) => (d, b, h),
        (Err(s), _, _) | (_, Err(s), _) | (_, _, Err(s)) => return s.code(),
    };
    let Some(headers) = HeaderMap::deserialize(&headers) else {
        return Status::ParseFailure.code();
    };
    let Some(stream) = c.data_mut().effective_stream() else {
        return Status::BadArgument.code();
    };
    stream.local_response = Some(LocalResponse {
        status: status_code,
        details,
        body,
        headers,
        grpc_status,
    });
    Status::Ok.code()
}

fn stream_control(c: &mut C<'_>, kind: u32, apply: impl FnOnce(&mut Direction)) -> u32 {
    let Some(kind) = StreamType::from_code(kind) else {
        return Status::BadArgument.code();
    };
    let Some(stream) = c.data_mut().effective_stream_to_settle() else {
        return Status::BadArgument.code();
    };
    match kind {
        StreamType::HttpRequest => apply(&mut stream.request),
        StreamType::HttpResponse => apply(&mut stream.response),
        StreamType::Downstream | StreamType::Upstream => return Status::Unimplemented.code(),
    }
    Status::Ok.code()
}

#[allow(clippy::too_many_arguments)] // the ABI's signature
fn http_call(
    mut c: C<'_>,
    upstream_ptr: u32,
    upstream_len: u32,
    headers_ptr: u32,
    headers_len: u32,
    body_ptr: u32,
    body_len: u32,
    trailers_ptr: u32,
    trailers_len: u32,
    timeout_ms: u32,
    token_ptr: u32,
) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_http_call") {
        return code;
    }
    let upstream = read_string(&mut c, upstream_ptr, upstream_len);
    let headers = read(&mut c, headers_ptr, headers_len);
    let body = read(&mut c, body_ptr, body_len);
    let trailers = read(&mut c, trailers_ptr, trailers_len);
    let (upstream, headers, body, trailers) = match (upstream, headers, body, trailers) {
        (Ok(u), Ok(h), Ok(b), Ok(t)) => (u, h, b, t),
        (Err(s), ..) | (_, Err(s), ..) | (_, _, Err(s), _) | (.., Err(s)) => return s.code(),
    };
    let (Some(headers), Some(trailers)) = (
        HeaderMap::deserialize(&headers),
        HeaderMap::deserialize(&trailers),
    ) else {
        return Status::ParseFailure.code();
    };
    let state = c.data_mut();
    // Envoy refuses unknown clusters and calls without :method, :path and :authority.
    let known = state
        .clusters
        .as_ref()
        .is_none_or(|list| list.contains(&upstream));
    let complete = [":method", ":path", ":authority"]
        .iter()
        .all(|h| headers.contains(h));
    if !known || !complete {
        return Status::BadArgument.code();
    }
    state.last_call_token = state.last_call_token.wrapping_add(1).max(1);
    let token = state.last_call_token;
    let call = HttpCall {
        token,
        context_id: state.effective_context,
        upstream,
        headers,
        body,
        trailers,
        timeout_ms,
        sent_at_ms: state.now_ms(),
    };
    state.pending_calls.push(call);
    match write_u32(&mut c, token_ptr, token) {
        Ok(()) => Status::Ok.code(),
        Err(s) => {
            c.data_mut().pending_calls.retain(|p| p.token != token);
            s.code()
        }
    }
}

/// Envoy's status of the HTTP call being delivered: 0 on success, `BrokenConnection` (11)
/// with the message `reset` on failure (the proxy-wasm C++ host's `WasmResult` numbering).
fn get_status(mut c: C<'_>, code_ptr: u32, ptr_ptr: u32, size_ptr: u32) -> CallResult {
    const BROKEN_CONNECTION: u32 = 11;
    let (code, message): (u32, &[u8]) = if c.data().call_failed {
        (BROKEN_CONNECTION, b"reset")
    } else {
        (0, b"")
    };
    if let Err(s) = write_u32(&mut c, code_ptr, code) {
        return Ok(s.code());
    }
    Ok(status(return_bytes(&mut c, message, ptr_ptr, size_ptr)?))
}
