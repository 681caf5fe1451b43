//! The crates import only what docs/architecture/crates.md allows.

use std::path::Path;

/// The layerfs crates a crate's library depends on (dev-dependencies left out).
fn library_deps(krate: &str) -> Vec<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line.ends_with("dependencies]") && !line.contains("dev-dependencies");
            continue;
        }
        if in_deps {
            if let Some(name) = line.split(['.', ' ', '=']).next() {
                if name.starts_with("layerfs-") {
                    deps.push(name.to_string());
                }
            }
        }
    }
    deps
}

#[test]
fn libraries_keep_to_their_layer() {
    let forbidden: [(&str, &[&str]); 6] = [
        (
            "layerfs-vfs",
            &[
                "layerfs-rpc",
                "layerfs-nfs",
                "layerfs-fuse",
                "layerfs-layers",
            ],
        ),
        ("layerfs-nfs", &["layerfs-fuse", "layerfs-layers"]),
        (
            "layerfs-fuse",
            &["layerfs-rpc", "layerfs-nfs", "layerfs-layers"],
        ),
        (
            "layerfs-layers",
            &["layerfs-rpc", "layerfs-nfs", "layerfs-fuse"],
        ),
        // Images reach the store, never a door.
        (
            "layerfs-registry",
            &["layerfs-rpc", "layerfs-nfs", "layerfs-fuse", "layerfs-vfs"],
        ),
        (
            "layerfs-rpc",
            &[
                "layerfs-vfs",
                "layerfs-nfs",
                "layerfs-fuse",
                "layerfs-layers",
            ],
        ),
    ];
    for (krate, never) in forbidden {
        let deps = library_deps(krate);
        // The daemon sits above every library; only the command uses it.
        assert!(
            !deps
                .iter()
                .any(|d| d == "layerfs-daemon" || d == "layerfs-cli"),
            "{krate} depends on the daemon or the command: {deps:?}"
        );
        for dep in never {
            assert!(
                !deps.iter().any(|d| d == dep),
                "{krate} depends on {dep}: {deps:?}"
            );
        }
    }
    // The parser sees dependencies at all.
    assert!(library_deps("layerfs-nfs").contains(&"layerfs-vfs".to_string()));
    assert!(library_deps("layerfs-cli").contains(&"layerfs-fuse".to_string()));
    assert!(library_deps("layerfs-daemon").contains(&"layerfs-layers".to_string()));
    assert!(library_deps("layerfs-registry").contains(&"layerfs-layers".to_string()));
}
