//! Tenancy in a launched gateway: who may use it, and where the record of what each request
//! consumed goes.
//!
//! Three independent pieces, each rendered only when it is set:
//! - the platform's `TenantQuota` objects (and the `InferenceObjective` objects their
//!   `inject.objective` names), verbatim, in the router's configuration under
//!   [`TENANT_QUOTAS_KEY`]; the module tells the two kinds apart by `kind`;
//! - a JWT provider: Envoy's own `jwt_authn` filter in front of the gateway filters (the
//!   template prototype `jwt_filter`, spliced at `jwt_filters`);
//! - a billing log: a file access logger on the gateway's connection manager that writes
//!   one line per request with a billing record (prototype `billing_log`, spliced at
//!   `billing_logs`).
//!
//! [`load_objects`] reads the objects from a directory or a (multi-document) file.

use super::template::{Template, Vars};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value as Json;
use serde_yaml_ng::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The router configuration key that holds the tenancy objects.
pub const TENANT_QUOTAS_KEY: &str = "tenantQuotas";

/// How often Envoy writes its access log files out (`--file-flush-interval-msec`) when a
/// billing log is configured: Envoy's default (10 s) would leave a test or a person reading
/// the log waiting for lines of requests that already ended.
pub const BILLING_LOG_FLUSH: Duration = Duration::from_millis(100);

/// Envoy's command-line flag for [`BILLING_LOG_FLUSH`].
pub const FILE_FLUSH_FLAG: &str = "--file-flush-interval-msec";

/// A JWT issuer whose tokens Envoy's `jwt_authn` verifies with a local JWKS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtProvider {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// The JWKS (JSON text) holding the issuer's verification keys.
    pub jwks: String,
}

/// The tenancy of one launched gateway; every part is optional, and an empty `Tenancy`
/// renders exactly what no tenancy renders.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tenancy {
    /// `TenantQuota` and `InferenceObjective` objects, passed to the router verbatim (none:
    /// the key is left out and the gateway runs without tenants).
    pub objects: Vec<Json>,
    /// Verify JWTs with Envoy's `jwt_authn` in front of the gateway filters.
    pub jwt: Option<JwtProvider>,
    /// Write the billing log to this file (absolute, or relative to Envoy's working
    /// directory).
    pub billing_log: Option<PathBuf>,
}

impl Tenancy {
    /// Puts the objects into the router configuration `router` (a JSON object), unless
    /// there are none.
    pub fn apply_to_router(&self, router: &mut Json) -> Result<()> {
        if self.objects.is_empty() {
            return Ok(());
        }
        let Some(map) = router.as_object_mut() else {
            bail!("the router configuration is not a JSON object");
        };
        map.insert(TENANT_QUOTAS_KEY.into(), Json::Array(self.objects.clone()));
        Ok(())
    }

    /// The items spliced at `jwt_filters` and `billing_logs` in `template`: none for an
    /// absent piece, the rendered prototype otherwise.
    pub fn splices(&self, template: &Template) -> Result<Splices> {
        let mut out = Splices::default();
        if let Some(jwt) = &self.jwt {
            let mut vars = Vars::new();
            vars.insert("jwt_issuer".into(), Value::String(jwt.issuer.clone()));
            vars.insert("jwt_jwks".into(), Value::String(jwt.jwks.clone()));
            out.jwt_filters
                .push(template.prototype("jwt_filter", &vars)?);
        }
        if let Some(path) = &self.billing_log {
            let Some(path) = path.to_str() else {
                bail!("billing log path {} is not UTF-8", path.display());
            };
            let mut vars = Vars::new();
            vars.insert("billing_log_path".into(), Value::String(path.into()));
            out.billing_logs
                .push(template.prototype("billing_log", &vars)?);
        }
        Ok(out)
    }

    /// Whether nothing is set (then rendering is exactly as without tenancy). Anything set
    /// needs a gateway flavour: the plain template has no gateway filters.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty() && self.jwt.is_none() && self.billing_log.is_none()
    }
}

/// The list items a [`Tenancy`] adds to a template.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Splices {
    /// `jwt_filters`: the `jwt_authn` filter, or nothing.
    pub jwt_filters: Vec<Value>,
    /// `billing_logs`: the billing access logger, or nothing.
    pub billing_logs: Vec<Value>,
}

/// The billing records written to `file` so far, one JSON value per line (a missing file:
/// none yet). Only complete lines count: a last line without its newline is one Envoy's
/// access logger is still writing. A complete line that is not JSON is an error naming its
/// line number.
pub fn read_billing_log(file: &Path) -> Result<Vec<Json>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete
        .lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{} line {}: `{line}`", file.display(), i + 1))
        })
        .collect()
}

/// Whether `path` names a file [`load_objects`] reads from a directory.
fn is_object_file(path: &Path) -> bool {
    path.is_file()
        && matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        )
}

/// The tenancy objects at `path`: a directory (every `*.yaml`, `*.yml` and `*.json` file
/// directly in it, in file-name order) or one file. Each file may hold several YAML
/// documents (JSON is one); empty documents are skipped. Errors name the file.
pub fn load_objects(path: &Path) -> Result<Vec<Json>> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let files = if meta.is_dir() {
        let mut files = Vec::new();
        for entry in
            std::fs::read_dir(path).with_context(|| format!("listing {}", path.display()))?
        {
            let file = entry
                .with_context(|| format!("listing {}", path.display()))?
                .path();
            if is_object_file(&file) {
                files.push(file);
            }
        }
        files.sort();
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        for object in parse_documents(&text).with_context(|| format!("in {}", file.display()))? {
            // The same object in two files (a directory holding both the per-kind files and
            // a multi-document copy of them) counts once; two different objects of one
            // name are still the module's config error.
            if !objects.contains(&object) {
                objects.push(object);
            }
        }
    }
    Ok(objects)
}

/// Every non-empty YAML document of `text`, each a mapping, as JSON values.
pub fn parse_documents(text: &str) -> Result<Vec<Json>> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let n = i + 1;
        let value = Json::deserialize(document).with_context(|| format!("document {n}"))?;
        match value {
            Json::Null => {}
            Json::Object(_) => out.push(value),
            other => bail!("document {n} is not a mapping (an object with `kind`): {other}"),
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    const QUOTA: &str = "apiVersion: mini-platform.local/v1alpha1\nkind: TenantQuota\n\
                         metadata: {name: tenant-x}\nspec: {inject: {fairnessId: x}}\n";

    fn names(objects: &[Json]) -> Vec<String> {
        objects
            .iter()
            .map(|o| format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"]))
            .collect()
    }

    #[test]
    fn documents_are_split_and_empty_ones_skipped() {
        let text = format!("---\n# only a comment\n---\n{QUOTA}---\n---\nkind: InferenceObjective\nmetadata: {{name: p}}\n");
        let objects = parse_documents(&text).unwrap();
        assert_eq!(
            names(&objects),
            ["TenantQuota/\"tenant-x\"", "InferenceObjective/\"p\""]
        );
        assert_eq!(objects[0]["spec"]["inject"]["fairnessId"], "x");
        assert!(parse_documents("").unwrap().is_empty());
        assert!(
            parse_documents("- a\n- b\n").is_err(),
            "a list is not an object"
        );
    }

    #[test]
    fn a_directory_is_read_in_name_order_and_errors_name_the_file() {
        let dir = TempDir::new().unwrap();
        let p = dir.path();
        std::fs::write(p.join("b.yml"), QUOTA.replace("tenant-x", "tenant-b")).unwrap();
        std::fs::write(
            p.join("a.yaml"),
            format!(
                "{}---\n{}",
                QUOTA.replace("tenant-x", "a1"),
                QUOTA.replace("tenant-x", "a2")
            ),
        )
        .unwrap();
        std::fs::write(
            p.join("c.json"),
            r#"{"kind": "InferenceObjective", "metadata": {"name": "c"}}"#,
        )
        .unwrap();
        std::fs::write(p.join("notes.txt"), "not: [an object file").unwrap();
        std::fs::create_dir(p.join("sub.yaml")).unwrap();
        let all = load_objects(p).unwrap();
        assert_eq!(
            names(&all),
            [
                "TenantQuota/\"a1\"",
                "TenantQuota/\"a2\"",
                "TenantQuota/\"tenant-b\"",
                "InferenceObjective/\"c\""
            ]
        );
        assert_eq!(load_objects(&p.join("b.yml")).unwrap().len(), 1);
        std::fs::write(p.join("d.yaml"), "kind: [unclosed\n").unwrap();
        let err = format!("{:#}", load_objects(p).unwrap_err());
        assert!(err.contains("d.yaml"), "{err}");
        let err = format!("{:#}", load_objects(&p.join("missing")).unwrap_err());
        assert!(err.contains("missing"), "{err}");
    }

    /// The shared fixtures: the platform's objects one kind per file, and `all.yaml`, the
    /// same objects as one multi-document file.
    #[test]
    fn the_testdata_tenants_load() {
        let dir = infergate_artefacts::workspace_root().join("testdata/tenants");
        let all = dir.join("all.yaml");
        if !all.is_file() {
            eprintln!("SKIPPED: {} does not exist", all.display());
            return;
        }
        let from_all = load_objects(&all).unwrap();
        let kinds: Vec<&str> = from_all.iter().filter_map(|o| o["kind"].as_str()).collect();
        assert!(kinds.contains(&"TenantQuota"), "{kinds:?}");
        assert!(kinds.contains(&"InferenceObjective"), "{kinds:?}");
        let mut from_files = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let file = entry.unwrap().path();
            if is_object_file(&file) && file != all {
                from_files.extend(load_objects(&file).unwrap());
            }
        }
        let key = |o: &Json| o.to_string();
        let mut a: Vec<String> = from_all.iter().map(key).collect();
        let mut b: Vec<String> = from_files.iter().map(key).collect();
        a.sort();
        b.sort();
        assert_eq!(a, b, "all.yaml and the other files hold different objects");
        // The directory holds each object twice (its file and all.yaml): loaded once.
        let mut from_dir: Vec<String> = load_objects(&dir).unwrap().iter().map(key).collect();
        from_dir.sort();
        assert_eq!(from_dir, a);
    }

    #[test]
    fn the_billing_log_reads_one_record_per_line() {
        let dir = TempDir::new().unwrap();
        let file = dir.path().join("billing.log");
        assert!(read_billing_log(&file).unwrap().is_empty());
        std::fs::write(
            &file,
            "{\"tenant\":\"a\",\"charged\":3}\n{\"tenant\":\"b\"}\n",
        )
        .unwrap();
        let records = read_billing_log(&file).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0]["charged"], 3);
        // A last line still being written (no newline yet) is not read.
        std::fs::write(&file, "{\"tenant\":\"a\"}\n{\"tenant\":\"b\",\"obj").unwrap();
        assert_eq!(read_billing_log(&file).unwrap().len(), 1);
        std::fs::write(&file, "{\"tenant\":\"a\"}\n-\n").unwrap();
        let err = format!("{:#}", read_billing_log(&file).unwrap_err());
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn objects_go_into_the_router_config_only_when_there_are_some() {
        let mut router = serde_json::json!({"role": "router"});
        Tenancy::default().apply_to_router(&mut router).unwrap();
        assert!(router.get(TENANT_QUOTAS_KEY).is_none());
        let t = Tenancy {
            objects: parse_documents(QUOTA).unwrap(),
            ..Tenancy::default()
        };
        t.apply_to_router(&mut router).unwrap();
        assert_eq!(router[TENANT_QUOTAS_KEY][0]["kind"], "TenantQuota");
        assert!(t.apply_to_router(&mut Json::Null).is_err());
    }
}
