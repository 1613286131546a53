//! Several clusters on loopback, as `cargo xtask up --clusters N` starts them: cluster `k`
//! is a gateway over a simulated pool of its own, every process of it on the loopback
//! address `127.0.1.<k+1>` (the replicas and the gateway's listener; Envoy's admin stays on
//! 127.0.0.1). Each cluster exports its pools, and lists every other cluster's gateway as
//! a peer of each pool (Parent Mode): a saturated cluster spills new conversations to the
//! cheapest other one, and a conversation stays in the cluster that served its first turn.
//!
//! The listener ports are chosen before any gateway starts (each must name the others),
//! so the clusters start in parallel. Nothing is shared between them at run time but the
//! HTTP each gateway serves: its export pages and the requests its peers send it.

use super::stack::{Backends, Stack, StackOptions};
use crate::sim::SimConfig;
use anyhow::{bail, Context, Result};
use infergate_cli::config::bootstrap::{PeerMode, Peers};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};

/// Running clusters; dropping it stops every gateway and its simulator.
#[derive(Debug)]
pub struct Clusters {
    clusters: Vec<Stack>,
}

/// The loopback address of cluster `k`.
pub fn cluster_address(k: usize) -> Result<IpAddr> {
    let last = u8::try_from(k + 1).context("at most 254 clusters")?;
    Ok(IpAddr::V4(Ipv4Addr::new(127, 0, 1, last)))
}

/// A port free on `ip` right now (bound, read and released).
fn free_port_on(ip: IpAddr) -> Result<SocketAddr> {
    let socket = TcpListener::bind((ip, 0)).with_context(|| format!("finding a port on {ip}"))?;
    Ok(socket.local_addr()?)
}

impl Clusters {
    /// Starts `n` clusters (at least two) from `opts`, whose backends must be the
    /// in-process simulator: each cluster gets its own simulator of that configuration,
    /// on its own loopback address, and `opts`' pools with `export` set and every other
    /// cluster's gateway as their peers. Returns when every gateway is ready.
    pub async fn start(opts: StackOptions, n: usize) -> Result<Clusters> {
        if n < 2 {
            bail!("--clusters needs at least 2 clusters");
        }
        Clusters::start_each(vec![opts; n], true).await
    }

    /// Starts one cluster per entry of `options` (each over its own in-process
    /// simulator), on the loopback address of its index; every pool is exported, and with
    /// `peers` lists the other clusters' gateways as its peers (in the mode and with the
    /// spillover its own `peers` sets, if any).
    pub async fn start_each(options: Vec<StackOptions>, peers: bool) -> Result<Clusters> {
        let n = options.len();
        let mut listeners = Vec::with_capacity(n);
        let mut prepared = Vec::with_capacity(n);
        for (k, mut o) in options.into_iter().enumerate() {
            let Backends::InProcess(sim) = &o.backends else {
                bail!("clusters run over the in-process simulator");
            };
            let ip = cluster_address(k)?;
            listeners.push(free_port_on(ip)?);
            let mut cfg: SimConfig = (**sim).clone();
            cfg.listen = (0..cfg.replicas)
                .map(|_| free_port_on(ip))
                .collect::<Result<_>>()?;
            o.backends = Backends::InProcess(Box::new(cfg));
            prepared.push(o);
        }
        let mut starting = tokio::task::JoinSet::new();
        for (k, mut o) in prepared.into_iter().enumerate() {
            o.listener = listeners.get(k).copied();
            let others: Vec<SocketAddr> = listeners
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != k)
                .map(|(_, a)| *a)
                .collect();
            for pool in &mut o.pools {
                pool.export = true;
                if peers {
                    // The pool's own `peers` (mode, spillover) with the other gateways.
                    let template = pool.peers.take().unwrap_or_default();
                    // Importers in Endpoint Mode read the members from the export pages.
                    pool.export_members = template.mode == PeerMode::Endpoint;
                    pool.peers = Some(Peers {
                        gateways: others.clone(),
                        remote_pool: None,
                        ..template
                    });
                }
            }
            starting.spawn(async move { (k, Stack::start(o).await) });
        }
        let mut started = Vec::with_capacity(n);
        while let Some(joined) = starting.join_next().await {
            let (k, stack) = joined.context("a cluster's start task failed")?;
            started.push((k, stack.with_context(|| format!("starting cluster {k}"))?));
        }
        started.sort_by_key(|(k, _)| *k);
        Ok(Clusters {
            clusters: started.into_iter().map(|(_, s)| s).collect(),
        })
    }

    /// Each cluster's gateway, cluster 0 first.
    pub fn gateways(&self) -> &[Stack] {
        &self.clusters
    }
}
