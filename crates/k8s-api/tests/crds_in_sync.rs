//! The CRD YAML checked in under `manifests/crds/` must equal what the Rust types generate.
//! Regenerate with `OVNK_UPDATE_CRDS=1 cargo test -p ovnk-k8s-api --test crds_in_sync`.

use std::path::PathBuf;

fn crd_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../manifests/crds")
}

#[test]
fn checked_in_crds_match_rust_types() {
    let dir = crd_dir();
    let update = std::env::var_os("OVNK_UPDATE_CRDS").is_some();
    let manifests = k8s_api::crd_manifests().expect("CRDs render");
    for (file, yaml) in manifests {
        let path = dir.join(&file);
        if update {
            std::fs::create_dir_all(&dir).expect("create manifests/crds");
            std::fs::write(&path, &yaml).expect("write CRD");
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{} missing ({e}); run with OVNK_UPDATE_CRDS=1",
                path.display()
            )
        });
        assert_eq!(
            on_disk,
            yaml,
            "{} is out of date; run OVNK_UPDATE_CRDS=1 cargo test -p ovnk-k8s-api --test crds_in_sync",
            path.display()
        );
    }
}
