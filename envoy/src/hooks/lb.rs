//! The exported load-balancer-policy hooks (`envoy_dynamic_module_on_lb_*`, all six Envoy
//! 1.40 resolves): the policy `infergate-membership` of [`crate::membership`].
//!
//! Object lifetimes: `config_new` leaks a `Box<LbPolicyConfig>` (dropped in
//! `config_destroy`); `lb_new` leaks a `Box<LbInstance>` per instance (dropped in
//! `lb_destroy`, which also takes the instance out of the registry). Envoy creates and
//! destroys each instance on the thread it serves, and calls `choose_host` and
//! `on_host_membership_update` only there.

use core::cell::Cell;

use crate::abi::{
    EnvoyBuffer, LbConfigEnvoyPtr, LbConfigModulePtr, LbContextEnvoyPtr, LbEnvoyPtr, LbModulePtr,
};
use crate::guard;
use crate::membership::{self, LB_POLICY_NAME, REGISTRY};

/// Our object behind `lb_config_module_ptr`. Holds nothing: the policy has no settings.
/// (`Sync`: shared by every thread's `on_lb_new`.)
#[derive(Debug)]
struct LbPolicyConfig;

/// Our object behind `lb_module_ptr`: one instance on one thread.
#[derive(Debug)]
struct LbInstance {
    /// This instance's registry entry.
    id: u64,
    /// The round robin's position (the instance's own thread only).
    cursor: Cell<usize>,
}

/// Checks the policy's `lb_policy_config`: nothing, or an empty JSON object.
fn check_config(config: &[u8]) -> Result<(), String> {
    if config.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    match serde_json::from_slice::<serde_json::Value>(config) {
        Ok(serde_json::Value::Object(fields)) => match fields.keys().next() {
            None => Ok(()),
            Some(key) => Err(format!(
                "lb_policy_config.{key}: unknown field (the policy takes no settings)"
            )),
        },
        Ok(_) => Err("lb_policy_config: expected a JSON object".into()),
        Err(e) => Err(format!("lb_policy_config: {e}")),
    }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_lb_config_new(
    _lb_config_envoy_ptr: LbConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> LbConfigModulePtr {
    guard::catch("on_lb_config_new", || {
        // SAFETY: both buffers are valid for this hook; copied at once.
        let (name, config) = unsafe { (name.as_bytes().to_vec(), config.as_bytes().to_vec()) };
        let name = String::from_utf8_lossy(&name).into_owned();
        if name != LB_POLICY_NAME {
            crate::log::error(&format!(
                "infergate: unknown lb_name `{name}` (expected {LB_POLICY_NAME})"
            ));
            return core::ptr::null();
        }
        if let Err(e) = check_config(&config) {
            crate::log::error(&format!("infergate: {LB_POLICY_NAME}: {e}"));
            return core::ptr::null();
        }
        Box::into_raw(Box::new(LbPolicyConfig)).cast_const().cast()
    })
    .unwrap_or(core::ptr::null())
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_lb_config_destroy(config_ptr: LbConfigModulePtr) {
    let _ = guard::catch("on_lb_config_destroy", || {
        if !config_ptr.is_null() {
            // SAFETY: from `Box::into_raw` in config_new; Envoy destroys it once.
            drop(unsafe { Box::from_raw(config_ptr.cast_mut().cast::<LbPolicyConfig>()) });
        }
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_lb_new(
    _config_ptr: LbConfigModulePtr,
    lb_envoy_ptr: LbEnvoyPtr,
) -> LbModulePtr {
    guard::catch("on_lb_new", || {
        // SAFETY: Envoy's live instance, on its own thread, during its creation.
        let (cluster, members) = unsafe {
            (
                membership::cluster_name(lb_envoy_ptr),
                membership::read_members(lb_envoy_ptr),
            )
        };
        crate::log::info(&format!(
            "infergate: {LB_POLICY_NAME} instance for cluster {cluster}: {}",
            membership::describe(&members)
        ));
        let id = REGISTRY.add(&cluster, members);
        let instance = LbInstance {
            id,
            cursor: Cell::new(0),
        };
        Box::into_raw(Box::new(instance)).cast_const().cast()
    })
    .unwrap_or(core::ptr::null())
}

/// # Safety
/// `ptr` must be NULL or a live pointer returned by `lb_new`, used on its instance's thread.
unsafe fn instance<'a>(ptr: LbModulePtr) -> Option<&'a LbInstance> {
    // SAFETY: per the contract.
    unsafe { ptr.cast::<LbInstance>().as_ref() }
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_lb_choose_host(
    lb_envoy_ptr: LbEnvoyPtr,
    lb_module_ptr: LbModulePtr,
    _context_envoy_ptr: LbContextEnvoyPtr,
    result_priority: *mut u32,
    result_index: *mut u32,
) -> bool {
    guard::catch("on_lb_choose_host", || {
        // SAFETY: our live instance, on its thread.
        let Some(lb) = (unsafe { instance(lb_module_ptr) }) else {
            return false;
        };
        if result_priority.is_null() || result_index.is_null() {
            return false;
        }
        let mut cursor = lb.cursor.get();
        // SAFETY: Envoy's live instance, during its choose_host.
        let chosen = unsafe { membership::next_healthy(lb_envoy_ptr, &mut cursor) };
        lb.cursor.set(cursor);
        match chosen {
            Some((priority, index)) => {
                // SAFETY: Envoy's out-parameters, checked non-null, writable for this hook.
                unsafe {
                    *result_priority = priority;
                    *result_index = index;
                }
                true
            }
            None => false,
        }
    })
    .unwrap_or(false)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_lb_on_host_membership_update(
    lb_envoy_ptr: LbEnvoyPtr,
    lb_module_ptr: LbModulePtr,
    num_hosts_added: usize,
    num_hosts_removed: usize,
) {
    let _ = guard::catch("on_lb_on_host_membership_update", || {
        // SAFETY: our live instance, on its thread.
        let Some(lb) = (unsafe { instance(lb_module_ptr) }) else {
            return;
        };
        // SAFETY: Envoy's live instance, during the update hook (the new host set is in
        // place when the hook runs).
        let members = unsafe { membership::read_members(lb_envoy_ptr) };
        crate::log::info(&format!(
            "infergate: {LB_POLICY_NAME} membership update (+{num_hosts_added} -{num_hosts_removed}): {}",
            membership::describe(&members)
        ));
        REGISTRY.update(lb.id, members);
    });
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_on_lb_destroy(lb_module_ptr: LbModulePtr) {
    let _ = guard::catch("on_lb_destroy", || {
        if lb_module_ptr.is_null() {
            return;
        }
        // SAFETY: from `Box::into_raw` in lb_new; Envoy destroys it once, on its thread.
        let lb = unsafe { Box::from_raw(lb_module_ptr.cast_mut().cast::<LbInstance>()) };
        REGISTRY.remove(lb.id);
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fake_envoy::{self, FakeLb};

    fn buf(s: &str) -> EnvoyBuffer {
        EnvoyBuffer {
            ptr: s.as_ptr().cast(),
            length: s.len(),
        }
    }

    #[test]
    fn config_takes_only_our_name_and_no_settings() {
        fake_envoy::reset();
        let ok = envoy_dynamic_module_on_lb_config_new(
            fake_envoy::dummy_ptr(),
            buf(LB_POLICY_NAME),
            buf("{}"),
        );
        assert!(!ok.is_null());
        envoy_dynamic_module_on_lb_config_destroy(ok);
        let empty = envoy_dynamic_module_on_lb_config_new(
            fake_envoy::dummy_ptr(),
            buf(LB_POLICY_NAME),
            buf(""),
        );
        assert!(!empty.is_null());
        envoy_dynamic_module_on_lb_config_destroy(empty);
        for (name, config, says) in [
            ("round-robin", "", "unknown lb_name"),
            (LB_POLICY_NAME, r#"{"x":1}"#, "lb_policy_config.x"),
            (LB_POLICY_NAME, "[1]", "expected a JSON object"),
        ] {
            fake_envoy::reset();
            let p = envoy_dynamic_module_on_lb_config_new(
                fake_envoy::dummy_ptr(),
                buf(name),
                buf(config),
            );
            assert!(p.is_null(), "{name} {config}");
            assert!(
                fake_envoy::logs().iter().any(|l| l.contains(says)),
                "{:?}",
                fake_envoy::logs()
            );
        }
    }

    #[test]
    fn an_instance_registers_updates_chooses_round_robin_and_leaves() {
        let config = envoy_dynamic_module_on_lb_config_new(
            fake_envoy::dummy_ptr(),
            buf(LB_POLICY_NAME),
            buf(""),
        );
        let lb = FakeLb::new(
            "hooks-pool",
            vec![vec![("10.1.0.1:80", true, 2), ("10.1.0.2:80", true, 2)]],
        );
        let instance = envoy_dynamic_module_on_lb_new(config, lb.ptr());
        assert!(!instance.is_null());
        assert_eq!(REGISTRY.members("hooks-pool").unwrap().len(), 2);
        let (mut priority, mut index) = (9u32, 9u32);
        let mut picks = Vec::new();
        for _ in 0..3 {
            assert!(envoy_dynamic_module_on_lb_choose_host(
                lb.ptr(),
                instance,
                core::ptr::null_mut(),
                &mut priority,
                &mut index
            ));
            picks.push((priority, index));
        }
        assert_eq!(picks, vec![(0, 0), (0, 1), (0, 0)]);
        lb.set_hosts(vec![vec![("10.1.0.3:80", false, 0)]]);
        envoy_dynamic_module_on_lb_on_host_membership_update(lb.ptr(), instance, 1, 2);
        let members = REGISTRY.members("hooks-pool").unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].address, "10.1.0.3:80");
        assert!(!envoy_dynamic_module_on_lb_choose_host(
            lb.ptr(),
            instance,
            core::ptr::null_mut(),
            &mut priority,
            &mut index
        ));
        envoy_dynamic_module_on_lb_destroy(instance);
        assert_eq!(REGISTRY.members("hooks-pool"), None);
        envoy_dynamic_module_on_lb_config_destroy(config);
    }

    #[test]
    fn a_worker_reporting_an_older_update_does_not_bring_back_a_removed_host() {
        let config = envoy_dynamic_module_on_lb_config_new(
            fake_envoy::dummy_ptr(),
            buf(LB_POLICY_NAME),
            buf(""),
        );
        let both = vec![vec![("10.2.0.1:80", true, 2), ("10.2.0.2:80", true, 2)]];
        let main = FakeLb::new("hooks-late-pool", both.clone());
        let worker = FakeLb::new("hooks-late-pool", both.clone());
        // The stale one is the older instance (its view is the published order).
        let worker_instance = envoy_dynamic_module_on_lb_new(config, worker.ptr());
        let main_instance = envoy_dynamic_module_on_lb_new(config, main.ptr());
        // EDS drops 10.2.0.2: the main thread applies it first.
        main.set_hosts(vec![vec![("10.2.0.1:80", true, 2)]]);
        envoy_dynamic_module_on_lb_on_host_membership_update(main.ptr(), main_instance, 0, 1);
        let addresses = || -> Vec<String> {
            REGISTRY
                .members("hooks-late-pool")
                .unwrap()
                .into_iter()
                .map(|m| m.address)
                .collect()
        };
        assert_eq!(addresses(), vec!["10.2.0.1:80"]);
        // The worker runs its hook still over the older hosts.
        envoy_dynamic_module_on_lb_on_host_membership_update(worker.ptr(), worker_instance, 0, 0);
        assert_eq!(addresses(), vec!["10.2.0.1:80"]);
        envoy_dynamic_module_on_lb_destroy(main_instance);
        envoy_dynamic_module_on_lb_destroy(worker_instance);
        assert_eq!(REGISTRY.members("hooks-late-pool"), None);
        envoy_dynamic_module_on_lb_config_destroy(config);
    }
}
