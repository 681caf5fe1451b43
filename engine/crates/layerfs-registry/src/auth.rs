//! Credentials as users already keep them: podman's auth file
//! (`$REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`) and
//! Docker's (`$DOCKER_CONFIG/config.json`, `~/.docker/config.json`). Each
//! holds `{"auths": {"registry": {"auth": base64("user:password")}}}`.
//! A secret read here is handed to the client and never logged.

use std::path::PathBuf;

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

#[derive(Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: std::collections::HashMap<String, Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
}

/// The auth files read, in the order they are searched.
fn auth_files() -> Vec<PathBuf> {
    let env = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let mut files = Vec::new();
    files.extend(env("REGISTRY_AUTH_FILE"));
    files.extend(env("XDG_RUNTIME_DIR").map(|d| d.join("containers/auth.json")));
    files.extend(env("DOCKER_CONFIG").map(|d| d.join("config.json")));
    files.extend(env("HOME").map(|d| d.join(".docker/config.json")));
    files
}

/// The credentials stored for `registry` (`host[:port]`), or anonymous.
pub fn credentials_for(registry: &str) -> RegistryAuth {
    // Docker Hub is stored under its old v1 address too.
    let names: Vec<&str> = if registry == "docker.io" || registry == "index.docker.io" {
        vec![
            "docker.io",
            "index.docker.io",
            "https://index.docker.io/v1/",
        ]
    } else {
        vec![registry]
    };
    for file in auth_files() {
        let Ok(text) = std::fs::read(&file) else {
            continue;
        };
        let Ok(parsed) = serde_json::from_slice::<AuthFile>(&text) else {
            tracing::warn!(file = %file.display(), "not an auth file: skipped");
            continue;
        };
        for name in &names {
            let Some(encoded) = parsed.auths.get(*name).and_then(|e| e.auth.as_deref()) else {
                continue;
            };
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()
                .and_then(|d| String::from_utf8(d).ok());
            if let Some((user, password)) = decoded.as_deref().and_then(|d| d.split_once(':')) {
                return RegistryAuth::Basic(user.to_owned(), password.to_owned());
            }
        }
    }
    RegistryAuth::Anonymous
}
