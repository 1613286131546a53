//! Reading and writing the module's linear memory from host calls.
//!
//! Every pointer and size comes from the module, so every access is bounds-checked and an
//! out-of-range one becomes `Status::InvalidMemoryAccess` instead of a host panic. Values the
//! host returns are copied into memory the module allocates itself (through
//! `proxy_on_memory_allocate`), because the module adopts and frees them with its own
//! allocator.

use crate::abi::Status;
use crate::state::{HostState, HostcallFault};
use wasmtime::Caller;

/// A host call's result before it is turned into a status code: `Err` is a trap.
pub(crate) type CallResult = wasmtime::Result<u32>;

/// Turns a status into the wire value.
pub(crate) fn status(result: Result<(), Status>) -> u32 {
    match result {
        Ok(()) => Status::Ok.code(),
        Err(status) => status.code(),
    }
}

/// Copies `len` bytes at `ptr` out of the module's memory.
pub(crate) fn read(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    len: u32,
) -> Result<Vec<u8>, Status> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let memory = caller.data().memory.ok_or(Status::InternalFailure)?;
    let data = memory.data(&*caller);
    let start = usize::try_from(ptr).map_err(|_| Status::InvalidMemoryAccess)?;
    let len = usize::try_from(len).map_err(|_| Status::InvalidMemoryAccess)?;
    let end = start.checked_add(len).ok_or(Status::InvalidMemoryAccess)?;
    data.get(start..end)
        .map(<[u8]>::to_vec)
        .ok_or(Status::InvalidMemoryAccess)
}

/// Copies a UTF-8 string out of the module's memory (lossy).
pub(crate) fn read_string(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    len: u32,
) -> Result<String, Status> {
    read(caller, ptr, len).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Writes `bytes` at `ptr` in the module's memory.
pub(crate) fn write(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    bytes: &[u8],
) -> Result<(), Status> {
    let memory = caller.data().memory.ok_or(Status::InternalFailure)?;
    let data = memory.data_mut(&mut *caller);
    let start = usize::try_from(ptr).map_err(|_| Status::InvalidMemoryAccess)?;
    let end = start
        .checked_add(bytes.len())
        .ok_or(Status::InvalidMemoryAccess)?;
    data.get_mut(start..end)
        .ok_or(Status::InvalidMemoryAccess)?
        .copy_from_slice(bytes);
    Ok(())
}

/// Writes a little-endian `u32` (a wasm32 pointer, size or id) at `ptr`.
pub(crate) fn write_u32(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    value: u32,
) -> Result<(), Status> {
    write(caller, ptr, &value.to_le_bytes())
}

/// Writes a little-endian `u64` at `ptr`.
pub(crate) fn write_u64(
    caller: &mut Caller<'_, HostState>,
    ptr: u32,
    value: u64,
) -> Result<(), Status> {
    write(caller, ptr, &value.to_le_bytes())
}

/// Hands `bytes` to the module: allocates with the module's allocator, copies, and writes the
/// pointer and size at `ptr_ptr` / `size_ptr`. Empty data is returned as a null pointer and
/// size 0, as the proxy-wasm C++ host (Envoy) does. The outer error is a trap inside the
/// module's allocator.
pub(crate) fn return_bytes(
    caller: &mut Caller<'_, HostState>,
    bytes: &[u8],
    ptr_ptr: u32,
    size_ptr: u32,
) -> wasmtime::Result<Result<(), Status>> {
    if bytes.is_empty() {
        return Ok(write_u32(caller, ptr_ptr, 0).and_then(|()| write_u32(caller, size_ptr, 0)));
    }
    let Ok(len) = u32::try_from(bytes.len()) else {
        return Ok(Err(Status::InternalFailure));
    };
    let Some(alloc) = caller.data().alloc.clone() else {
        return Ok(Err(Status::InternalFailure));
    };
    let ptr = alloc.call(&mut *caller, len)?;
    if ptr == 0 {
        return Ok(Err(Status::InternalFailure));
    }
    Ok(write(caller, ptr, bytes)
        .and_then(|()| write_u32(caller, ptr_ptr, ptr))
        .and_then(|()| write_u32(caller, size_ptr, len)))
}

/// The status an injected fault makes hostcall `name` answer (a status-only call ignores a
/// [`HostcallFault::Bytes`] fault).
pub(crate) fn injected_status(caller: &Caller<'_, HostState>, name: &str) -> Option<u32> {
    match caller.data().fault(name)? {
        HostcallFault::Status(code) => Some(code),
        HostcallFault::Bytes(_) => None,
    }
}

/// The answer an injected fault makes the byte-returning hostcall `name` give: its status,
/// or `Ok` with the injected bytes handed over as the call's value.
pub(crate) fn injected_bytes(
    caller: &mut Caller<'_, HostState>,
    name: &str,
    ptr_ptr: u32,
    size_ptr: u32,
) -> wasmtime::Result<Option<u32>> {
    Ok(match caller.data().fault(name) {
        None => None,
        Some(HostcallFault::Status(code)) => Some(code),
        Some(HostcallFault::Bytes(bytes)) => {
            Some(status(return_bytes(caller, &bytes, ptr_ptr, size_ptr)?))
        }
    })
}
