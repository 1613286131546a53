//! The filter-name table: the object behind Envoy's `filter_config_module_ptr`, one per
//! filter config (shared by every worker, so `Sync`), built for its `filter_name`.
//!
//! `router`, `picker` and `gateway` (both in one filter) are each a pipeline the filters
//! crate's builder assembles (configured in `router.rs`, `picker.rs` and `gateway.rs`, run
//! by the one generic adapter in `pipeline.rs`); `probe` is a measuring tool (`probe.rs`),
//! only in the bench build (feature `probe`): without it the name is unknown.
//! A `picker` or `gateway` config that carries the process's scraper also hosts it
//! (`scraper.rs`) for as long as it lives. Only the hooks use this module: the filter kinds
//! it names never import it back.

use crate::abi::HttpFilterConfigEnvoyPtr;
use crate::filter::{FilterConfigHandle, StreamFactory, StreamLogic};

/// The filter names this build knows, as the unknown-name error lists them.
#[cfg(not(feature = "probe"))]
const NAMES: &str = "router, picker or gateway";
/// The filter names this build knows, as the unknown-name error lists them.
#[cfg(feature = "probe")]
const NAMES: &str = "router, picker, gateway or probe";

/// Our object behind `filter_config_module_ptr`.
pub struct HttpConfig {
    factory: Box<dyn StreamFactory>,
    /// The scraper this config carries and hosts (`crate::scraper`); leaves with it.
    scraper: Option<crate::scraper::Hosting>,
    /// Envoy's config object, for the last flush of the stats as it is destroyed.
    envoy: EnvoyConfig,
}

/// Envoy's pointer to its config object, as config_new gave it.
struct EnvoyConfig(HttpFilterConfigEnvoyPtr);
// SAFETY: only a handle, used by the hooks of the config it names (`HttpConfig::last_flush`).
unsafe impl Send for EnvoyConfig {}
// SAFETY: as above; nothing is reached through `&EnvoyConfig` but the pointer's value.
unsafe impl Sync for EnvoyConfig {}

impl HttpConfig {
    /// Builds the config for `filter_name` from its JSON `config` bytes.
    pub fn new(
        filter_name: &str,
        config: &[u8],
        envoy: &mut FilterConfigHandle,
    ) -> Result<HttpConfig, String> {
        let (factory, scraper): (Box<dyn StreamFactory>, _) = match filter_name {
            "router" => (Box::new(crate::router::factory(config, envoy)?), None),
            "picker" => {
                let (factory, scraper) = crate::picker::factory(config, envoy)?;
                (Box::new(factory), scraper)
            }
            "gateway" => {
                let (factory, scraper) = crate::gateway::factory(config, envoy)?;
                (Box::new(factory), scraper)
            }
            #[cfg(feature = "probe")]
            "probe" => (Box::new(crate::probe::ProbeFactory::new(config)?), None),
            other => return Err(format!("unknown filter_name `{other}` (expected {NAMES})")),
        };
        Ok(HttpConfig {
            factory,
            scraper,
            envoy: EnvoyConfig(envoy.raw()),
        })
    }

    /// The scraper this config hosts, if it carries one.
    pub fn scraper(&self) -> Option<&crate::scraper::Hosting> {
        self.scraper.as_ref()
    }

    /// Hands this config's buffered counters and gauges to Envoy (`crate::flush`).
    pub fn flush_stats(&self, envoy: HttpFilterConfigEnvoyPtr) {
        self.factory.flush_stats(envoy);
    }

    /// The last flush, as Envoy destroys the config: what its last requests counted since
    /// the previous flush (their in-flight gauges' decrements among it) still reaches Envoy.
    /// Envoy calls `on_http_filter_config_destroy` from its config's destructor body, before
    /// the config's metrics go; each stream holds the config, so its streams are gone.
    pub fn last_flush(&self) {
        self.factory.flush_stats(self.envoy.0);
    }

    /// A fresh per-stream object.
    pub fn new_stream(&self) -> Box<dyn StreamLogic> {
        self.factory.new_stream()
    }

    /// A config around any factory (tests drive the hooks with factories of their own).
    #[cfg(test)]
    pub fn from_factory(factory: Box<dyn StreamFactory>) -> HttpConfig {
        HttpConfig {
            factory,
            scraper: None,
            envoy: EnvoyConfig(core::ptr::null_mut()),
        }
    }
}
