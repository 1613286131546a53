//! Context lifecycle, logging, time, ticks, buffers, properties and foreign functions.

use crate::abi::{BufferType, LogLevel, Status};
use crate::memory::{
    injected_bytes, injected_status, read, read_string, return_bytes, status, write_u32, write_u64,
    CallResult,
};
use crate::state::{ForeignCall, HostState, StreamState};
use wasmtime::{Caller, Linker};

type C<'a> = Caller<'a, HostState>;

pub(super) fn add(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_log", proxy_log)?;
    linker.func_wrap("env", "proxy_get_log_level", |mut c: C<'_>, ptr: u32| {
        let level = c.data().log_level as u32;
        status(write_u32(&mut c, ptr, level))
    })?;
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ptr: u32| {
            if let Some(code) = injected_status(&c, "proxy_get_current_time_nanoseconds") {
                return code;
            }
            let now = c.data().now_ns;
            status(write_u64(&mut c, ptr, now))
        },
    )?;
    linker.func_wrap("env", "proxy_set_tick_period_milliseconds", set_tick_period)?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C<'_>, id: u32| {
            let state = c.data_mut();
            let live_stream = state.streams.get(&id).is_some_and(|s| !s.deleted);
            if live_stream || state.roots.contains_key(&id) {
                state.effective_context = id;
                Status::Ok.code()
            } else {
                Status::BadArgument.code()
            }
        },
    )?;
    linker.func_wrap("env", "proxy_done", |mut c: C<'_>| {
        match c.data_mut().effective_stream_to_settle() {
            // Only valid after `proxy_on_done` returned false, as in Envoy.
            Some(stream) if stream.awaiting_done => {
                stream.done_called = true;
                Status::Ok.code()
            }
            _ => Status::NotFound.code(),
        }
    })?;
    linker.func_wrap("env", "proxy_get_buffer_bytes", get_buffer_bytes)?;
    linker.func_wrap("env", "proxy_set_buffer_bytes", set_buffer_bytes)?;
    linker.func_wrap("env", "proxy_get_buffer_status", get_buffer_status)?;
    linker.func_wrap("env", "proxy_get_property", get_property)?;
    linker.func_wrap("env", "proxy_set_property", set_property)?;
    linker.func_wrap("env", "proxy_call_foreign_function", call_foreign_function)?;
    Ok(())
}

fn proxy_log(mut c: C<'_>, level: u32, ptr: u32, len: u32) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_log") {
        return code;
    }
    let Some(level) = LogLevel::from_code(level) else {
        return Status::BadArgument.code();
    };
    match read_string(&mut c, ptr, len) {
        Ok(message) => {
            c.data_mut().log(level, message);
            Status::Ok.code()
        }
        Err(s) => s.code(),
    }
}

fn set_tick_period(mut c: C<'_>, period_ms: u32) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_set_tick_period_milliseconds") {
        return code;
    }
    let state = c.data_mut();
    let now = state.now_ms();
    let Some(root_id) = state.root_of(state.effective_context) else {
        return Status::BadArgument.code();
    };
    match state.roots.get_mut(&root_id) {
        Some(root) => {
            root.tick_period_ms = period_ms;
            root.next_tick_ms = now.saturating_add(u64::from(period_ms));
            Status::Ok.code()
        }
        None => Status::BadArgument.code(),
    }
}

/// The bytes a buffer call sees now, or why it cannot.
fn buffer_contents(state: &mut HostState, kind: BufferType) -> Result<Vec<u8>, Status> {
    match kind {
        BufferType::HttpRequestBody => state
            .effective_stream()
            .map(|s| s.request.buffered.clone())
            .ok_or(Status::NotFound),
        BufferType::HttpResponseBody => state
            .effective_stream()
            .map(|s| s.response.buffered.clone())
            .ok_or(Status::NotFound),
        BufferType::HttpCallResponseBody => state
            .call_response
            .as_ref()
            .map(|r| r.body.clone())
            .ok_or(Status::NotFound),
        BufferType::VmConfiguration => Ok(state.vm_config.clone()),
        BufferType::PluginConfiguration => state.plugin_config.clone().ok_or(Status::NotFound),
        BufferType::DownstreamData
        | BufferType::UpstreamData
        | BufferType::GrpcReceiveBuffer
        | BufferType::CallData => Err(Status::NotFound),
    }
}

fn get_buffer_bytes(
    mut c: C<'_>,
    kind: u32,
    start: u32,
    max: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> CallResult {
    if let Some(code) = injected_bytes(&mut c, "proxy_get_buffer_bytes", ptr_ptr, size_ptr)? {
        return Ok(code);
    }
    let Some(kind) = BufferType::from_code(kind) else {
        return Ok(Status::BadArgument.code());
    };
    let contents = match buffer_contents(c.data_mut(), kind) {
        Ok(bytes) => bytes,
        Err(s) => return Ok(s.code()),
    };
    let start = start as usize;
    // Envoy clamps the length to what is there: modules ask for `usize::MAX` bytes.
    let Some(tail) = contents.get(start..) else {
        return Ok(Status::BadArgument.code());
    };
    let take = tail.len().min(max as usize);
    let slice = tail.get(..take).unwrap_or_default();
    Ok(status(return_bytes(&mut c, slice, ptr_ptr, size_ptr)?))
}

fn body_of(stream: &mut StreamState, kind: BufferType) -> Option<&mut Vec<u8>> {
    match kind {
        BufferType::HttpRequestBody => Some(&mut stream.request.buffered),
        BufferType::HttpResponseBody => Some(&mut stream.response.buffered),
        _ => None,
    }
}

fn set_buffer_bytes(mut c: C<'_>, kind: u32, start: u32, size: u32, ptr: u32, len: u32) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_set_buffer_bytes") {
        return code;
    }
    let Some(kind) = BufferType::from_code(kind) else {
        return Status::BadArgument.code();
    };
    let data = match read(&mut c, ptr, len) {
        Ok(data) => data,
        Err(s) => return s.code(),
    };
    let Some(stream) = c.data_mut().effective_stream() else {
        return Status::NotFound.code();
    };
    let Some(body) = body_of(stream, kind) else {
        return Status::NotFound.code();
    };
    // Envoy's body buffers support exactly two edits: drain `size` bytes from the front then
    // prepend (start == 0), or append (start >= length). Anything else is BadArgument there,
    // so it is here too: a module that works in this host works in Envoy.
    if start == 0 {
        let drain = (size as usize).min(body.len());
        body.drain(..drain);
        body.splice(0..0, data);
        Status::Ok.code()
    } else if start as usize >= body.len() {
        body.extend_from_slice(&data);
        Status::Ok.code()
    } else {
        Status::BadArgument.code()
    }
}

fn get_buffer_status(mut c: C<'_>, kind: u32, size_ptr: u32, flags_ptr: u32) -> u32 {
    let Some(kind) = BufferType::from_code(kind) else {
        return Status::BadArgument.code();
    };
    match buffer_contents(c.data_mut(), kind) {
        Ok(bytes) => {
            let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
            status(write_u32(&mut c, size_ptr, len).and_then(|()| write_u32(&mut c, flags_ptr, 0)))
        }
        Err(s) => s.code(),
    }
}

fn parse_path(raw: &[u8]) -> Vec<String> {
    raw.split(|b| *b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// Looks a property up: stream properties, then `request.*` derived from the stream's
/// request headers, then host properties, then the proxy-wasm built-ins.
fn lookup_property(state: &HostState, path: &[String]) -> Option<Vec<u8>> {
    let stream = state.streams.get(&state.effective_context);
    if let Some(value) = stream.and_then(|s| s.properties.get(path)) {
        return Some(value.clone());
    }
    let parts: Vec<&str> = path.iter().map(String::as_str).collect();
    if let (Some(stream), ["request", field]) = (stream, parts.as_slice()) {
        let header = match *field {
            "path" => Some(":path"),
            "method" => Some(":method"),
            "host" => Some(":authority"),
            "scheme" => Some(":scheme"),
            "id" => Some("x-request-id"),
            _ => None,
        };
        let headers = stream.request.headers.as_ref();
        if let Some(value) = header.and_then(|h| headers.and_then(|m| m.get_bytes(h))) {
            return Some(value.to_vec());
        }
    }
    if let Some(value) = state.properties.get(path) {
        return Some(value.clone());
    }
    let root = state.effective_root();
    match parts.as_slice() {
        ["plugin_root_id"] | ["plugin_name"] => root.map(|r| r.root_id.clone().into_bytes()),
        ["plugin_vm_id"] => Some(state.vm_id.clone().into_bytes()),
        _ => None,
    }
}

fn get_property(
    mut c: C<'_>,
    path_ptr: u32,
    path_len: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> CallResult {
    if let Some(code) = injected_bytes(&mut c, "proxy_get_property", ptr_ptr, size_ptr)? {
        return Ok(code);
    }
    let path = match read(&mut c, path_ptr, path_len) {
        Ok(raw) => parse_path(&raw),
        Err(s) => return Ok(s.code()),
    };
    match lookup_property(c.data(), &path) {
        Some(value) => Ok(status(return_bytes(&mut c, &value, ptr_ptr, size_ptr)?)),
        None => Ok(Status::NotFound.code()),
    }
}

fn set_property(mut c: C<'_>, path_ptr: u32, path_len: u32, ptr: u32, len: u32) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_set_property") {
        return code;
    }
    let (path, value) = match (read(&mut c, path_ptr, path_len), read(&mut c, ptr, len)) {
        (Ok(path), Ok(value)) => (parse_path(&path), value),
        (Err(s), _) | (_, Err(s)) => return s.code(),
    };
    let state = c.data_mut();
    match state.effective_stream() {
        Some(stream) => {
            stream.properties.insert(path, value);
        }
        None => {
            state.properties.insert(path, value);
        }
    }
    Status::Ok.code()
}

fn call_foreign_function(
    mut c: C<'_>,
    name_ptr: u32,
    name_len: u32,
    args_ptr: u32,
    args_len: u32,
    ptr_ptr: u32,
    size_ptr: u32,
) -> CallResult {
    let fault = injected_bytes(&mut c, "proxy_call_foreign_function", ptr_ptr, size_ptr)?;
    if let Some(code) = fault {
        return Ok(code);
    }
    let (name, arguments) = match (
        read_string(&mut c, name_ptr, name_len),
        read(&mut c, args_ptr, args_len),
    ) {
        (Ok(name), Ok(args)) => (name, args),
        (Err(s), _) | (_, Err(s)) => return Ok(s.code()),
    };
    let state = c.data_mut();
    let result = match state.foreign_functions.get_mut(&name) {
        Some(function) => function(&arguments),
        None => Err(Status::NotFound),
    };
    let context_id = state.effective_context;
    let code = match result {
        Ok(results) => status(return_bytes(&mut c, &results, ptr_ptr, size_ptr)?),
        Err(s) => s.code(),
    };
    c.data_mut().foreign_calls.push(ForeignCall {
        name,
        arguments,
        context_id,
        status: Status::from_code(code).unwrap_or(Status::InternalFailure),
    });
    Ok(code)
}
