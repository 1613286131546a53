//! Several gateway replicas over one pool, as a production gateway runs: N Envoy processes
//! of one flavour, each with its own listener, admin port, run directory and log, in front
//! of the same engine replicas (behind them, an L4 load balancer spreads the clients'
//! connections; the load generator plays it, see `infergate_load::Target::balanced`).
//!
//! Every gateway is a [`Stack`] started from the same [`StackOptions`]: gateway 0 starts
//! the replicas (the simulator, when the options ask for one), the others are started over
//! gateway 0's replica addresses ([`Backends::External`]), so every gateway renders the
//! same pools, routes and plugin configurations over the same members. With membership
//! `Eds`, every gateway's pool clusters read gateway 0's EDS files (as the replicas of a
//! production gateway read one EDS source), so [`Fleet::set_members`] changes the members
//! for all of them at once. Nothing else is shared between the gateways at run time: each
//! keeps its own picker state (prefix index, in-flight load, sessions) and its own scraper,
//! exactly as separate Envoy replicas do.
//!
//! With a billing log, gateway 0 writes the file the options name and gateway `i` writes
//! a sibling of its own ([`gateway_file`]), so two processes never append to one file.

use super::stack::{Backends, Stack, StackOptions};
use crate::sim::SimHandle;
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Running gateways over one set of replicas; dropping it stops every Envoy, then the
/// simulator (gateway 0's).
#[derive(Debug)]
pub struct Fleet {
    /// Gateway 0 first; it owns the simulated replicas, so it is stopped last.
    gateways: Vec<Stack>,
}

impl Fleet {
    /// Starts `gateways` gateways from `opts` (at least one): gateway 0 with `opts` as
    /// they are, then the others at once over gateway 0's replicas. Returns when every
    /// gateway is ready and its scraper has published (what [`Stack::start`] waits for).
    pub async fn start(opts: StackOptions, gateways: usize) -> Result<Fleet> {
        if gateways == 0 {
            bail!("a fleet needs at least one gateway");
        }
        let first = Stack::start(opts.clone())
            .await
            .context("starting gateway 0")?;
        let replicas = first.replicas().to_vec();
        let eds = first.eds().cloned();
        let mut fleet = Fleet {
            gateways: vec![first],
        };
        let mut starting = tokio::task::JoinSet::new();
        for i in 1..gateways {
            let mut o = Fleet::gateway_options(&opts, i, &replicas);
            o.eds_dir = eds.clone();
            starting.spawn(async move { (i, Stack::start(o).await) });
        }
        let mut started: Vec<(usize, Stack)> = Vec::with_capacity(gateways - 1);
        while let Some(joined) = starting.join_next().await {
            let (i, stack) = joined.context("a gateway's start task failed")?;
            started.push((i, stack.with_context(|| format!("starting gateway {i}"))?));
        }
        started.sort_by_key(|(i, _)| *i);
        fleet.gateways.extend(started.into_iter().map(|(_, s)| s));
        Ok(fleet)
    }

    /// The options of gateway `index` (≥ 1) over `replicas`: `opts` with the replicas
    /// gateway 0 started, and a billing log of its own.
    fn gateway_options(opts: &StackOptions, index: usize, replicas: &[SocketAddr]) -> StackOptions {
        let mut o = opts.clone();
        o.backends = Backends::External(replicas.to_vec());
        o.tenancy.billing_log = opts
            .tenancy
            .billing_log
            .as_deref()
            .map(|f| gateway_file(f, index));
        o
    }

    /// The gateways, gateway 0 first.
    pub fn gateways(&self) -> &[Stack] {
        &self.gateways
    }

    /// The number of gateways.
    pub fn len(&self) -> usize {
        self.gateways.len()
    }

    /// Whether the fleet has no gateway (never, once started).
    pub fn is_empty(&self) -> bool {
        self.gateways.is_empty()
    }

    /// Each gateway's base URL (requests there go through its gateway filters), in order.
    pub fn picker_urls(&self) -> Vec<String> {
        self.gateways.iter().map(Stack::picker_url).collect()
    }

    /// Gateway 0's stack: its flavour, its `/rr` baseline, the simulator it started.
    fn first(&self) -> Result<&Stack> {
        self.gateways.first().context("the fleet has no gateway")
    }

    /// Every replica, in order (the same for every gateway).
    pub fn replicas(&self) -> &[SocketAddr] {
        self.gateways.first().map(Stack::replicas).unwrap_or(&[])
    }

    /// `http://127.0.0.1:PORT/rr` of gateway 0: the round-robin baseline, when the options
    /// asked for it (the default).
    pub fn baseline_url(&self) -> Result<String> {
        Ok(self.first()?.baseline_url())
    }

    /// The in-process simulator, when gateway 0 started one.
    pub fn sim(&self) -> Option<&SimHandle> {
        self.gateways.first().and_then(Stack::sim)
    }

    /// Announces `members` (all healthy) as the members of pool `index`'s cluster, for
    /// every gateway at once (they read one set of EDS files); an error without EDS
    /// membership.
    pub fn set_members(&self, index: usize, members: &[SocketAddr]) -> Result<()> {
        self.first()?.set_members(index, members)
    }

    /// The billing log of each gateway that writes one, in gateway order.
    pub fn billing_logs(&self) -> Vec<&Path> {
        self.gateways
            .iter()
            .filter_map(Stack::billing_log)
            .collect()
    }
}

impl Drop for Fleet {
    /// The last gateway first: gateway 0, which owns the simulated replicas, stops last, so
    /// no Envoy outlives its upstreams.
    fn drop(&mut self) {
        while let Some(gateway) = self.gateways.pop() {
            drop(gateway);
        }
    }
}

/// The file gateway `index` writes in place of `file`: `file` itself for gateway 0, else
/// `<stem>-gw<index>.<ext>` beside it (`billing.log` → `billing-gw1.log`).
pub fn gateway_file(file: &Path, index: usize) -> PathBuf {
    if index == 0 {
        return file.to_path_buf();
    }
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match file.extension() {
        Some(ext) => format!("{stem}-gw{index}.{}", ext.to_string_lossy()),
        None => format!("{stem}-gw{index}"),
    };
    file.with_file_name(name)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::launch::Flavor;

    #[test]
    fn every_gateway_but_the_first_writes_a_file_of_its_own() {
        let f = Path::new("/tmp/run/billing.log");
        assert_eq!(gateway_file(f, 0), f);
        assert_eq!(
            gateway_file(f, 1),
            Path::new("/tmp/run/billing-gw1.log").to_path_buf()
        );
        assert_eq!(
            gateway_file(Path::new("/x/log"), 3),
            Path::new("/x/log-gw3").to_path_buf()
        );
    }

    /// Gateway `i` starts over gateway 0's replicas, never a simulator of its own, with
    /// everything else as given.
    #[test]
    fn later_gateways_run_over_the_first_ones_replicas() {
        let mut opts = StackOptions::new(
            Flavor::Native,
            Backends::Simulator {
                replicas: 4,
                args: Vec::new(),
            },
        );
        opts.tenancy.billing_log = Some(PathBuf::from("/r/billing.log"));
        let replicas = [SocketAddr::from(([127, 0, 0, 1], 9000))];
        let o = Fleet::gateway_options(&opts, 2, &replicas);
        assert!(matches!(&o.backends, Backends::External(a) if a == &replicas));
        assert_eq!(
            o.tenancy.billing_log.as_deref(),
            Some(Path::new("/r/billing-gw2.log"))
        );
        assert_eq!(o.flavor, Flavor::Native);
        assert_eq!(o.pools.len(), opts.pools.len());
    }

    #[tokio::test]
    async fn no_gateway_is_refused() {
        let opts = StackOptions::new(Flavor::Native, Backends::External(Vec::new()));
        let err = Fleet::start(opts, 0).await.unwrap_err();
        assert!(err.to_string().contains("at least one gateway"), "{err}");
    }
}
