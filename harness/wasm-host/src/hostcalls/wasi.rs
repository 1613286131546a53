//! The WASI preview1 subset a proxy host offers a plugin, deterministic for tests.
//!
//! Mirrors what the proxy-wasm C++ host (Envoy) gives a plugin: stdout/stderr writes become
//! log lines (`Info` / `Error`), the clocks read the test-controlled host time, `random_get`
//! is a seeded generator, the environment is what the test configured, there are no
//! arguments and no preopened directories, and `proc_exit` traps. Any other WASI import fails
//! linking, so a module needing more would fail in Envoy too.

use crate::memory::{read, write, write_u32, write_u64};
use crate::state::HostState;
use wasmtime::{Caller, Linker};

type C<'a> = Caller<'a, HostState>;

const SUCCESS: u32 = 0;
const BADF: u32 = 8;
const FAULT: u32 = 21;
const INVAL: u32 = 28;
const NOSYS: u32 = 52;
const SPIPE: u32 = 70;
const FILETYPE_CHARACTER_DEVICE: u8 = 2;

const M: &str = "wasi_snapshot_preview1";

fn errno<T>(result: Result<T, crate::abi::Status>) -> u32 {
    match result {
        Ok(_) => SUCCESS,
        Err(_) => FAULT,
    }
}

pub(super) fn add(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(M, "fd_write", fd_write)?;
    linker.func_wrap(
        M,
        "fd_read",
        |mut c: C<'_>, fd: u32, _iovs: u32, _n: u32, nread: u32| {
            // stdin is empty; nothing else is open.
            if fd == 0 {
                errno(write_u32(&mut c, nread, 0))
            } else {
                BADF
            }
        },
    )?;
    linker.func_wrap(
        M,
        "fd_seek",
        |_: C<'_>, fd: u32, _off: i64, _whence: u32, _ptr: u32| {
            if fd <= 2 {
                SPIPE
            } else {
                BADF
            }
        },
    )?;
    linker.func_wrap(M, "fd_close", |_: C<'_>, _fd: u32| BADF)?;
    linker.func_wrap(M, "fd_fdstat_get", |mut c: C<'_>, fd: u32, ptr: u32| {
        if fd > 2 {
            return BADF;
        }
        // struct fdstat { u8 filetype; u16 flags; u64 rights_base; u64 rights_inheriting }
        let mut stat = [0u8; 24];
        stat[0] = FILETYPE_CHARACTER_DEVICE;
        errno(write(&mut c, ptr, &stat))
    })?;
    linker.func_wrap(
        M,
        "fd_fdstat_set_flags",
        |_: C<'_>, _fd: u32, _flags: u32| NOSYS,
    )?;
    linker.func_wrap(M, "fd_prestat_get", |_: C<'_>, _fd: u32, _ptr: u32| BADF)?;
    linker.func_wrap(
        M,
        "fd_prestat_dir_name",
        |_: C<'_>, _fd: u32, _ptr: u32, _len: u32| BADF,
    )?;
    linker.func_wrap(M, "args_sizes_get", |mut c: C<'_>, argc: u32, size: u32| {
        errno(write_u32(&mut c, argc, 0).and_then(|()| write_u32(&mut c, size, 0)))
    })?;
    linker.func_wrap(M, "args_get", |_: C<'_>, _argv: u32, _buf: u32| SUCCESS)?;
    linker.func_wrap(
        M,
        "environ_sizes_get",
        |mut c: C<'_>, count_ptr: u32, size_ptr: u32| {
            let env = &c.data().env;
            let count = u32::try_from(env.len()).unwrap_or(u32::MAX);
            let size: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
            let size = u32::try_from(size).unwrap_or(u32::MAX);
            errno(
                write_u32(&mut c, count_ptr, count)
                    .and_then(|()| write_u32(&mut c, size_ptr, size)),
            )
        },
    )?;
    linker.func_wrap(M, "environ_get", environ_get)?;
    linker.func_wrap(
        M,
        "clock_time_get",
        |mut c: C<'_>, id: u32, _precision: u64, ptr: u32| {
            // realtime, monotonic, process and thread CPU time all read the test's clock.
            if id > 3 {
                return INVAL;
            }
            let now = c.data().now_ns;
            errno(write_u64(&mut c, ptr, now))
        },
    )?;
    linker.func_wrap(M, "clock_res_get", |mut c: C<'_>, id: u32, ptr: u32| {
        if id > 3 {
            INVAL
        } else {
            errno(write_u64(&mut c, ptr, 1))
        }
    })?;
    linker.func_wrap(M, "random_get", |mut c: C<'_>, ptr: u32, len: u32| {
        let mut bytes = Vec::with_capacity(len as usize);
        while bytes.len() < len as usize {
            bytes.extend_from_slice(&c.data_mut().next_random().to_le_bytes());
        }
        bytes.truncate(len as usize);
        errno(write(&mut c, ptr, &bytes))
    })?;
    linker.func_wrap(M, "sched_yield", |_: C<'_>| SUCCESS)?;
    linker.func_wrap(
        M,
        "poll_oneoff",
        |_: C<'_>, _i: u32, _o: u32, _n: u32, _r: u32| NOSYS,
    )?;
    linker.func_wrap(
        M,
        "proc_exit",
        |mut c: C<'_>, code: u32| -> wasmtime::Result<()> {
            c.data_mut().exit_code = Some(code);
            Err(wasmtime::Error::msg(format!(
                "module called proc_exit({code})"
            )))
        },
    )?;
    Ok(())
}

fn fd_write(mut c: C<'_>, fd: u32, iovs: u32, iovs_len: u32, written_ptr: u32) -> u32 {
    if fd != 1 && fd != 2 {
        return BADF;
    }
    let Ok(table) = read(&mut c, iovs, iovs_len.saturating_mul(8)) else {
        return FAULT;
    };
    let mut out = Vec::new();
    for iov in table.chunks_exact(8) {
        let field = |at: usize| {
            iov.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let (Some(ptr), Some(len)) = (field(0), field(4)) else {
            return FAULT;
        };
        match read(&mut c, ptr, len) {
            Ok(bytes) => out.extend_from_slice(&bytes),
            Err(_) => return FAULT,
        }
    }
    c.data_mut().write_output(fd == 2, &out);
    let written = u32::try_from(out.len()).unwrap_or(u32::MAX);
    errno(write_u32(&mut c, written_ptr, written))
}

fn environ_get(mut c: C<'_>, array_ptr: u32, buf_ptr: u32) -> u32 {
    let env = c.data().env.clone();
    let mut offset = 0u32;
    for (i, (k, v)) in env.iter().enumerate() {
        let entry = format!("{k}={v}\0");
        let Ok(index) = u32::try_from(i) else {
            return FAULT;
        };
        let at = buf_ptr.wrapping_add(offset);
        if write_u32(&mut c, array_ptr.wrapping_add(index * 4), at).is_err()
            || write(&mut c, at, entry.as_bytes()).is_err()
        {
            return FAULT;
        }
        offset = offset.wrapping_add(u32::try_from(entry.len()).unwrap_or(u32::MAX));
    }
    SUCCESS
}
