//! The seed objects the render and control-plane tests render, shared by both test crates
//! (each includes this file as a module).

use std::path::{Path, PathBuf};

use infergate_artefacts::workspace_root;

/// `testdata/objects/`: the seed's Kubernetes objects.
pub fn seed_objects() -> PathBuf {
    workspace_root().join("testdata/objects")
}

/// Fills `dir` with the seed objects, their placeholder `TenantQuota`s replaced by the
/// tenants of `testdata/tenants/` (real key digests), and returns it.
pub fn objects_with_tenants(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(seed_objects()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("quota-") {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    for name in ["quota-a.yaml", "quota-b.yaml"] {
        std::fs::copy(
            workspace_root().join("testdata/tenants").join(name),
            dir.join(name),
        )
        .unwrap();
    }
    dir.to_path_buf()
}
