//! The router's model rewrites (`InferenceModelRewrite` objects, as `modelRewrites`) and
//! how a rule's weighted targets are drawn (`split`): sticky on a key or per request.

use anyhow::{bail, Result};

/// How a rewrite rule's weights are applied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// One target per sticky key (session header, else fairness id, else per request).
    #[default]
    Sticky,
    /// A fresh weighted draw for every request.
    PerRequest,
}

/// The router's `split` setting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Sticky or per request.
    pub mode: SplitMode,
    /// The request header whose value is the sticky key (e.g. `x-session-id`).
    pub session_header: Option<String>,
}

impl Split {
    /// The router config's `split` object.
    pub fn to_json(&self) -> serde_json::Value {
        let mode = match self.mode {
            SplitMode::Sticky => "sticky",
            SplitMode::PerRequest => "perRequest",
        };
        let mut v = serde_json::json!({ "mode": mode });
        if let Some(header) = &self.session_header {
            v["sessionHeader"] = serde_json::Value::from(header.clone());
        }
        v
    }
}

/// Adds `rewrites` (as `modelRewrites`, when there are any) and `split` to a router
/// configuration.
pub fn apply_rewrites(
    router: &mut serde_json::Value,
    rewrites: &[serde_json::Value],
    split: Option<&Split>,
) -> Result<()> {
    let Some(obj) = router.as_object_mut() else {
        bail!("the router configuration is not a JSON object");
    };
    if !rewrites.is_empty() {
        obj.insert(
            "modelRewrites".into(),
            serde_json::Value::from(rewrites.to_vec()),
        );
    }
    if let Some(split) = split {
        obj.insert("split".into(), split.to_json());
    }
    Ok(())
}
