//! The `up` flags that lay out pools and the routes between them:
//!
//! - `--pool NAME=MODEL[@I,J,...]`: a pool named NAME serving MODEL on the replicas at
//!   those indices (every replica without `@`); given once or more, these replace the
//!   default pools (one per served model over every replica);
//! - `--split MODEL=POOL:W,POOL:W,...`: MODEL's traffic split across those pools by weight,
//!   per request, or by `x-gateway-split-key` with `--sticky-split` (one pool per
//!   conversation);
//! - `--canary-header NAME=VALUE:POOL`: requests carrying `NAME: VALUE` go to POOL (for
//!   the model POOL serves), ahead of any split.
//!
//! POOL is a `--pool` name or a pool index.

use super::stack::PoolSpec;
use anyhow::{bail, Context, Result};
use infergate_cli::config::routes::RouteSpec;

/// `--pool NAME=MODEL[@I,J,...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFlag {
    /// The pool's name.
    pub name: String,
    /// Its base model.
    pub model: String,
    /// Replica indices; empty: every replica.
    pub replicas: Vec<usize>,
}

/// `--split MODEL=POOL:W,...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitFlag {
    /// The model whose traffic is split.
    pub model: String,
    /// (pool name or index, weight).
    pub backends: Vec<(String, u32)>,
}

/// `--canary-header NAME=VALUE:POOL`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryFlag {
    /// Header name (lower-cased).
    pub header: String,
    /// Header value, matched exactly.
    pub value: String,
    /// Pool name or index.
    pub pool: String,
}

/// Parses `NAME=MODEL[@I,J,...]`.
pub fn parse_pool(text: &str) -> Result<PoolFlag> {
    let (name, rest) = split_once_nonempty(text, '=', "--pool NAME=MODEL[@I,J]")?;
    let (model, replicas) = match rest.split_once('@') {
        Some((model, list)) => {
            let replicas = list
                .split(',')
                .map(|i| i.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("--pool {text}: replica indices"))?;
            (model, replicas)
        }
        None => (rest, Vec::new()),
    };
    if model.is_empty() {
        bail!("--pool {text}: no model");
    }
    Ok(PoolFlag {
        name: name.to_owned(),
        model: model.to_owned(),
        replicas,
    })
}

/// Parses `MODEL=POOL:W,POOL:W,...`.
pub fn parse_split(text: &str) -> Result<SplitFlag> {
    let (model, list) = split_once_nonempty(text, '=', "--split MODEL=POOL:W,POOL:W")?;
    let mut backends = Vec::new();
    for item in list.split(',') {
        let (pool, weight) = split_once_nonempty(item, ':', "--split MODEL=POOL:W,POOL:W")?;
        let weight = weight
            .parse::<u32>()
            .with_context(|| format!("--split {text}: weight `{weight}`"))?;
        backends.push((pool.to_owned(), weight));
    }
    if backends.len() < 2 {
        bail!("--split {text}: a split needs two pools or more");
    }
    Ok(SplitFlag {
        model: model.to_owned(),
        backends,
    })
}

/// Parses `NAME=VALUE:POOL` (the value may not hold a `:`; the pool is after the last one).
pub fn parse_canary(text: &str) -> Result<CanaryFlag> {
    let usage = "--canary-header NAME=VALUE:POOL";
    let (header, rest) = split_once_nonempty(text, '=', usage)?;
    let Some((value, pool)) = rest.rsplit_once(':') else {
        bail!("{usage}: `{text}` has no `:POOL`");
    };
    if value.is_empty() || pool.is_empty() {
        bail!("{usage}: `{text}` has an empty value or pool");
    }
    Ok(CanaryFlag {
        header: header.to_ascii_lowercase(),
        value: value.to_owned(),
        pool: pool.to_owned(),
    })
}

fn split_once_nonempty<'a>(text: &'a str, sep: char, usage: &str) -> Result<(&'a str, &'a str)> {
    match text.split_once(sep) {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a, b)),
        _ => bail!("{usage}: cannot read `{text}`"),
    }
}

/// The pools of the `--pool` flags (none given: `defaults`), named after their flags.
pub fn pools(flags: &[PoolFlag], defaults: Vec<PoolSpec>) -> Vec<PoolSpec> {
    if flags.is_empty() {
        return defaults;
    }
    flags
        .iter()
        .map(|f| PoolSpec::on(f.model.clone(), &f.replicas).named(f.name.clone()))
        .collect()
}

/// The index of the pool `reference` (a `--pool` name or an index) in `pools`.
fn pool_index(pools: &[PoolSpec], reference: &str) -> Result<usize> {
    if let Some(i) = pools
        .iter()
        .position(|p| p.name.as_deref() == Some(reference))
    {
        return Ok(i);
    }
    match reference.parse::<usize>() {
        Ok(i) if i < pools.len() => Ok(i),
        _ => bail!(
            "no pool `{reference}` (pools: {})",
            pools
                .iter()
                .enumerate()
                .map(|(i, p)| p.name.clone().unwrap_or_else(|| i.to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The routes the `--split` and `--canary-header` flags describe over `pools`.
pub fn routes(
    pools: &[PoolSpec],
    splits: &[SplitFlag],
    sticky: bool,
    canaries: &[CanaryFlag],
) -> Result<Vec<RouteSpec>> {
    let mut out = Vec::new();
    for c in canaries {
        let i = pool_index(pools, &c.pool).context("--canary-header")?;
        let model = pools[i].base_model.clone();
        out.push(RouteSpec::to(model, i).when_header(c.header.clone(), c.value.clone()));
    }
    for s in splits {
        let backends = s
            .backends
            .iter()
            .map(|(p, w)| Ok((pool_index(pools, p)?, *w)))
            .collect::<Result<Vec<_>>>()
            .with_context(|| format!("--split {}", s.model))?;
        let route = RouteSpec::split(s.model.clone(), &backends);
        out.push(if sticky { route.sticky() } else { route });
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_pool("fp8=sim-model@2,3").unwrap(),
            PoolFlag {
                name: "fp8".into(),
                model: "sim-model".into(),
                replicas: vec![2, 3]
            }
        );
        assert!(parse_pool("bf16=sim-model").unwrap().replicas.is_empty());
        for bad in ["fp8", "=m", "fp8=", "fp8=m@x", "fp8=@1"] {
            assert!(parse_pool(bad).is_err(), "{bad}");
        }
        let s = parse_split("m=bf16:90,fp8:10").unwrap();
        assert_eq!(s.backends, [("bf16".into(), 90), ("fp8".into(), 10)]);
        for bad in ["m=bf16:90", "m=bf16:x,fp8:1", "m", "m=bf16,fp8"] {
            assert!(parse_split(bad).is_err(), "{bad}");
        }
        let c = parse_canary("X-Canary=fp8:fp8").unwrap();
        assert_eq!((c.header.as_str(), c.value.as_str()), ("x-canary", "fp8"));
        assert_eq!(c.pool, "fp8");
        for bad in ["x-canary=fp8", "x-canary=:p", "=v:p"] {
            assert!(parse_canary(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pools_and_routes_resolve_by_name_or_index() {
        let flags = [
            parse_pool("bf16=m@0,1").unwrap(),
            parse_pool("fp8=m@2").unwrap(),
        ];
        let pools = pools(&flags, vec![PoolSpec::all("other")]);
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[1].name.as_deref(), Some("fp8"));
        assert_eq!(pools[1].replicas, [2]);
        let routes = routes(
            &pools,
            &[parse_split("m=bf16:90,1:10").unwrap()],
            true,
            &[parse_canary("x-canary=yes:fp8").unwrap()],
        )
        .unwrap();
        assert_eq!(
            routes,
            [
                RouteSpec::to("m", 1).when_header("x-canary", "yes"),
                RouteSpec::split("m", &[(0, 90), (1, 10)]).sticky(),
            ]
        );
        let err = super::routes(
            &pools,
            &[parse_split("m=bf16:1,gpu:1").unwrap()],
            false,
            &[],
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("gpu"), "{err:#}");
    }
}
