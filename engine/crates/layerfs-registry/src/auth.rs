//! Credentials as users already keep them: podman's auth file
//! (`$REGISTRY_AUTH_FILE`, `$XDG_RUNTIME_DIR/containers/auth.json`) and
//! Docker's (`$DOCKER_CONFIG/config.json`, `~/.docker/config.json`). Each
//! holds `{"auths": {"registry": {"auth": base64("user:password")}}}`.
//! A secret read here is handed to the client and never logged.

use std::path::PathBuf;

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

use crate::{Error, ErrorKind};

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

/// Where `layerfs login` stores credentials: podman's auth file.
pub fn login_file() -> Result<PathBuf, Error> {
    if let Some(file) = std::env::var_os("REGISTRY_AUTH_FILE") {
        return Ok(file.into());
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) => Ok(PathBuf::from(dir).join("containers/auth.json")),
        None => Err(Error::invalid(
            "neither REGISTRY_AUTH_FILE nor XDG_RUNTIME_DIR is set: no auth file to store to",
        )),
    }
}

/// Stores `user` and `password` for `registry` in [`login_file`] (made
/// 0600, other registries' entries kept), replacing the file in one rename.
pub fn store_credentials(registry: &str, user: &str, password: &str) -> Result<PathBuf, Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let file = login_file()?;
    let shown =
        |e: std::io::Error| Error::new(ErrorKind::Store, format!("{}: {e}", file.display()));
    let not_auth = |why: &str| Error::invalid(format!("{}: not an auth file{why}", file.display()));
    let mut all: serde_json::Value = match std::fs::read(&file) {
        Ok(text) => serde_json::from_slice(&text).map_err(|e| not_auth(&format!(": {e}")))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => serde_json::json!({}),
        Err(e) => return Err(shown(e)),
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let Some(object) = all.as_object_mut() else {
        return Err(not_auth(""));
    };
    let auths = object
        .entry("auths")
        .or_insert_with(|| serde_json::json!({}));
    let Some(auths) = auths.as_object_mut() else {
        return Err(not_auth(": its \"auths\" is not an object"));
    };
    auths.insert(registry.to_owned(), serde_json::json!({ "auth": encoded }));
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(shown)?;
    }
    let staged = file.with_extension("json.new");
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&staged)
        .map_err(shown)?;
    let text = serde_json::to_vec_pretty(&all).expect("a JSON value serialises");
    out.write_all(&text)
        .and_then(|()| out.sync_all())
        .map_err(shown)?;
    std::fs::rename(&staged, &file).map_err(shown)?;
    Ok(file)
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
