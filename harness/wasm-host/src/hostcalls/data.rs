//! Shared data (with compare-and-swap), shared queues and metrics.

use crate::abi::{MetricType, Status};
use crate::memory::{
    injected_bytes, injected_status, read, read_string, return_bytes, status, write_u32, write_u64,
    CallResult,
};
use crate::state::{HostState, Metric};
use wasmtime::{Caller, Linker};

type C<'a> = Caller<'a, HostState>;

pub(super) fn add(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap("env", "proxy_get_shared_data", get_shared_data)?;
    linker.func_wrap("env", "proxy_set_shared_data", set_shared_data)?;
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: C<'_>, ptr: u32, len: u32, id_ptr: u32| match read_string(&mut c, ptr, len) {
            Ok(name) => {
                let owner = c.data().root_of(c.data().effective_context).map(|root| {
                    crate::shared::QueueOwner {
                        host: c.data().host_id,
                        root_context_id: root,
                    }
                });
                let id = c.data().shared.register_queue_for(&name, owner);
                status(write_u32(&mut c, id_ptr, id))
            }
            Err(s) => s.code(),
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: C<'_>, vm_ptr: u32, vm_len: u32, ptr: u32, len: u32, id_ptr: u32| {
            let (vm_id, name) = match (
                read_string(&mut c, vm_ptr, vm_len),
                read_string(&mut c, ptr, len),
            ) {
                (Ok(v), Ok(n)) => (v, n),
                (Err(s), _) | (_, Err(s)) => return s.code(),
            };
            // One SharedData handle is one vm_id scope; other VMs' queues are not visible.
            let same_vm = vm_id.is_empty() || vm_id == c.data().vm_id;
            match c.data().shared.resolve_queue(&name).filter(|_| same_vm) {
                Some(id) => status(write_u32(&mut c, id_ptr, id)),
                None => Status::NotFound.code(),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: C<'_>, id: u32, ptr: u32, len: u32| match read(&mut c, ptr, len) {
            Ok(value) if c.data().shared.enqueue(id, &value) => Status::Ok.code(),
            Ok(_) => Status::NotFound.code(),
            Err(s) => s.code(),
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: C<'_>, id: u32, ptr_ptr: u32, size_ptr: u32| -> CallResult {
            match c.data().shared.dequeue(id) {
                Some(Some(value)) => Ok(status(return_bytes(&mut c, &value, ptr_ptr, size_ptr)?)),
                Some(None) => Ok(Status::Empty.code()),
                None => Ok(Status::NotFound.code()),
            }
        },
    )?;
    linker.func_wrap("env", "proxy_define_metric", define_metric)?;
    linker.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: C<'_>, id: u32, delta: i64| {
            if let Some(code) = injected_status(&c, "proxy_increment_metric") {
                return code;
            }
            with_metric(&mut c, id, |m| match m.kind {
                MetricType::Counter if delta < 0 => Err(Status::BadArgument),
                MetricType::Histogram => Err(Status::BadArgument),
                _ => {
                    m.value = m.value.saturating_add_signed(delta);
                    Ok(())
                }
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: C<'_>, id: u32, value: u64| {
            if let Some(code) = injected_status(&c, "proxy_record_metric") {
                return code;
            }
            with_metric(&mut c, id, |m| {
                m.value = value;
                if m.kind == MetricType::Histogram {
                    m.recorded.push(value);
                }
                Ok(())
            })
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_metric",
        |mut c: C<'_>, id: u32, ptr: u32| {
            let value = metric_index(id)
                .and_then(|i| c.data().metrics.get(i))
                .map(|m| (m.kind, m.value));
            match value {
                // Envoy cannot read a histogram back.
                Some((MetricType::Histogram, _)) => Status::BadArgument.code(),
                Some((_, value)) => status(write_u64(&mut c, ptr, value)),
                None => Status::NotFound.code(),
            }
        },
    )?;
    Ok(())
}

fn get_shared_data(
    mut c: C<'_>,
    key_ptr: u32,
    key_len: u32,
    ptr_ptr: u32,
    size_ptr: u32,
    cas_ptr: u32,
) -> CallResult {
    if let Some(code) = injected_bytes(&mut c, "proxy_get_shared_data", ptr_ptr, size_ptr)? {
        return Ok(code);
    }
    let key = match read_string(&mut c, key_ptr, key_len) {
        Ok(key) => key,
        Err(s) => return Ok(s.code()),
    };
    let Some((value, cas)) = c.data().shared.get(&key) else {
        return Ok(Status::NotFound.code());
    };
    if let Err(s) = return_bytes(&mut c, &value, ptr_ptr, size_ptr)? {
        return Ok(s.code());
    }
    Ok(status(write_u32(&mut c, cas_ptr, cas)))
}

fn set_shared_data(mut c: C<'_>, key_ptr: u32, key_len: u32, ptr: u32, len: u32, cas: u32) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_set_shared_data") {
        return code;
    }
    let (key, value) = match (
        read_string(&mut c, key_ptr, key_len),
        read(&mut c, ptr, len),
    ) {
        (Ok(k), Ok(v)) => (k, v),
        (Err(s), _) | (_, Err(s)) => return s.code(),
    };
    match c.data().shared.set(&key, &value, cas) {
        Ok(_) => Status::Ok.code(),
        Err(_) => Status::CasMismatch.code(),
    }
}

fn define_metric(mut c: C<'_>, kind: u32, ptr: u32, len: u32, id_ptr: u32) -> u32 {
    if let Some(code) = injected_status(&c, "proxy_define_metric") {
        return code;
    }
    let Some(kind) = MetricType::from_code(kind) else {
        return Status::BadArgument.code();
    };
    let name = match read_string(&mut c, ptr, len) {
        Ok(name) => name,
        Err(s) => return s.code(),
    };
    let metrics = &mut c.data_mut().metrics;
    // Defining the same name again yields the same metric, as Envoy's stats scope does.
    let index = match metrics.iter().position(|m| m.name == name) {
        Some(i) if metrics.get(i).is_some_and(|m| m.kind == kind) => i,
        Some(_) => return Status::BadArgument.code(),
        None => {
            metrics.push(Metric {
                name,
                kind,
                value: 0,
                recorded: Vec::new(),
            });
            metrics.len() - 1
        }
    };
    let id = u32::try_from(index + 1).unwrap_or(u32::MAX);
    status(write_u32(&mut c, id_ptr, id))
}

fn metric_index(id: u32) -> Option<usize> {
    usize::try_from(id).ok()?.checked_sub(1)
}

fn with_metric(
    c: &mut C<'_>,
    id: u32,
    apply: impl FnOnce(&mut Metric) -> Result<(), Status>,
) -> u32 {
    match metric_index(id).and_then(|i| c.data_mut().metrics.get_mut(i)) {
        Some(metric) => status(apply(metric)),
        None => Status::NotFound.code(),
    }
}
