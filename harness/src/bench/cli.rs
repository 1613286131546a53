//! The flags the calibration commands (`demo`, `bench ttft`, `bench affinity`) share, and
//! those of the one-stack scenarios (`demo --scenario hotspot|tenants`).

use anyhow::{bail, Context, Result};

use super::calibration::DEFAULT_TIME_SCALE;
use crate::launch::Flavor;

/// The flags the calibration commands share: `--time-scale S`, `--quick`,
/// `--flavor a[,b]`, `--workers a[,b]` (Envoy's `--concurrency`, which is accepted as its
/// other name).
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationArgs {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// The smaller workload.
    pub quick: bool,
    /// Gateway flavours.
    pub flavors: Vec<Flavor>,
    /// Envoy worker counts (`--concurrency` values).
    pub concurrencies: Vec<u32>,
}

impl CalibrationArgs {
    /// Parses `args` over the given defaults; anything else is an error.
    pub fn parse(args: &[String], flavors: &[Flavor], concurrencies: &[u32]) -> Result<Self> {
        let mut out = CalibrationArgs {
            time_scale: DEFAULT_TIME_SCALE,
            quick: false,
            flavors: flavors.to_vec(),
            concurrencies: concurrencies.to_vec(),
        };
        each_flag(args, |arg, value| {
            match arg {
                "--quick" => out.quick = true,
                "--time-scale" => {
                    out.time_scale = value()?.parse().context("--time-scale")?;
                    if out.time_scale.is_nan() || out.time_scale <= 0.0 {
                        bail!("--time-scale must be positive");
                    }
                }
                "--flavor" | "--flavour" | "--flavors" => {
                    out.flavors = list(&value()?).context("--flavor")?;
                    if out.flavors.contains(&Flavor::Plain) {
                        bail!("--flavor: the picker needs wasm or native");
                    }
                }
                "--workers" | "--concurrency" => {
                    out.concurrencies = list(&value()?).with_context(|| arg.to_owned())?;
                    if out.concurrencies.contains(&0) {
                        bail!("{arg}: Envoy needs at least one worker");
                    }
                }
                other => bail!(
                    "unknown argument `{other}` (expected --quick, --time-scale S, \
                     --flavor wasm,native, --workers 1,2 (or --concurrency 1,2))"
                ),
            }
            Ok(())
        })?;
        if out.flavors.is_empty() || out.concurrencies.is_empty() {
            bail!("at least one flavour and one concurrency are needed");
        }
        Ok(out)
    }
}

/// The flags a one-stack scenario (`demo --scenario hotspot|tenants`) shares: `--quick`,
/// `--time-scale S`, `--flavor wasm|native` and `--workers N` (or `--concurrency N`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScenarioArgs {
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// The scenario's shorter form.
    pub quick: bool,
    /// The gateway's flavour.
    pub flavor: Flavor,
    /// Envoy worker threads.
    pub workers: u32,
}

impl ScenarioArgs {
    /// Parses `args` over these defaults. The shared flags are read here; any other flag
    /// goes to `extra` with a reader of its value, and `extra` answers `Ok(false)` for a
    /// flag it does not know either. `gateway` says what needs a gateway flavour (the error
    /// for `--flavor plain`); `expected` lists the scenario's flags (the error for an
    /// unknown one).
    pub fn parse(
        mut self,
        args: &[String],
        gateway: &str,
        expected: &str,
        mut extra: impl FnMut(&str, &mut dyn FnMut() -> Result<String>) -> Result<bool>,
    ) -> Result<ScenarioArgs> {
        each_flag(args, |arg, value| {
            match arg {
                "--quick" => self.quick = true,
                "--time-scale" => {
                    self.time_scale = value()?.parse().context("--time-scale")?;
                    if self.time_scale.is_nan() || self.time_scale <= 0.0 {
                        bail!("--time-scale must be positive");
                    }
                }
                "--flavor" | "--flavour" => {
                    self.flavor = value()?.parse().context("--flavor")?;
                    if self.flavor == Flavor::Plain {
                        bail!("--flavor: {gateway} needs wasm or native");
                    }
                }
                "--workers" | "--concurrency" => {
                    self.workers = value()?.parse().with_context(|| arg.to_owned())?;
                    if self.workers == 0 {
                        bail!("{arg}: Envoy needs at least one worker");
                    }
                }
                other => {
                    if !extra(other, value)? {
                        bail!("unknown argument `{other}` (expected {expected})");
                    }
                }
            }
            Ok(())
        })?;
        Ok(self)
    }
}

/// Walks `args` flag by flag: `each(flag, value)` reads one, `value` taking the argument
/// after it (the error `<flag> needs a value` when there is none).
pub fn each_flag(
    args: &[String],
    mut each: impl FnMut(&str, &mut dyn FnMut() -> Result<String>) -> Result<()>,
) -> Result<()> {
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .with_context(|| format!("{arg} needs a value"))
        };
        each(arg, &mut value)?;
    }
    Ok(())
}

fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.parse::<T>().map_err(|e| anyhow::anyhow!("`{x}`: {e}")))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse() {
        let a = CalibrationArgs::parse(&[], &[Flavor::Wasm], &[2]).unwrap();
        assert_eq!(a.time_scale, DEFAULT_TIME_SCALE);
        assert_eq!(
            (a.flavors, a.concurrencies, a.quick),
            (vec![Flavor::Wasm], vec![2], false)
        );
        let a = CalibrationArgs::parse(
            &strings(&[
                "--flavor",
                "wasm,native",
                "--concurrency",
                "1,2,4",
                "--quick",
                "--time-scale",
                "4",
            ]),
            &[Flavor::Wasm],
            &[2],
        )
        .unwrap();
        assert_eq!(a.flavors, vec![Flavor::Wasm, Flavor::Native]);
        assert_eq!(a.concurrencies, vec![1, 2, 4]);
        assert!(a.quick);
        assert_eq!(a.time_scale, 4.0);
        let a = CalibrationArgs::parse(&strings(&["--workers", "1,2,4,8"]), &[Flavor::Wasm], &[2])
            .unwrap();
        assert_eq!(a.concurrencies, vec![1, 2, 4, 8]);
        for bad in [
            &["--flavor", "plain"][..],
            &["--time-scale", "0"],
            &["--concurrency", "x"],
            &["--workers", "1,0"],
            &["--workers"],
            &["--what"],
        ] {
            assert!(
                CalibrationArgs::parse(&strings(bad), &[Flavor::Wasm], &[2]).is_err(),
                "{bad:?}"
            );
        }
    }
}
