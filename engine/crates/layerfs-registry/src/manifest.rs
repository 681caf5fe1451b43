//! An image's manifest and config: through its index for the platform
//! wanted, each bounded by [`MAX_MANIFEST`].
//!
//! `oci-client` fetches them, checks their digests and keeps the token;
//! it reads a manifest's body whole before handing it over, with no bound,
//! so the bound is checked on what it read: a hostile registry can make a
//! pull hold one oversized body for a moment, never keep or use it. A
//! config's size is checked in its descriptor before it is fetched, and
//! again on its bytes.

use crate::session::{host_arch, Session};
use crate::{Error, ErrorKind, MAX_MANIFEST};
use oci_client::client::current_platform_resolver;
use oci_client::manifest::{
    ImageIndexEntry, OciImageManifest, OciManifest, IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE,
};

/// Picks the digest of one image of an index.
pub(crate) type Chooser = Box<dyn Fn(&[ImageIndexEntry]) -> Option<String> + Send + Sync>;

/// What a pull fetches before any layer.
pub(crate) struct Fetched {
    pub manifest: OciImageManifest,
    /// The digest of the image's own manifest (not of its index).
    pub digest: String,
    pub config: Vec<u8>,
}

/// Fetches the session's image's manifest, choosing from an index with
/// `choose`, and its config. `platform` names the choice in errors.
pub(crate) async fn fetch(
    session: &Session,
    choose: &Chooser,
    platform: Option<&str>,
) -> Result<Fetched, Error> {
    let Session {
        client,
        image,
        auth,
        ..
    } = session;
    let failed = |e| session.failed(e);
    const ANY: &[&str] = &[
        OCI_IMAGE_MEDIA_TYPE,
        IMAGE_MANIFEST_MEDIA_TYPE,
        OCI_IMAGE_INDEX_MEDIA_TYPE,
        IMAGE_MANIFEST_LIST_MEDIA_TYPE,
    ];
    let (body, digest) = client
        .pull_manifest_raw(image, auth, ANY)
        .await
        .map_err(failed)?;
    let (manifest, digest) = match parse(&body)? {
        OciManifest::Image(manifest) => (manifest, digest),
        OciManifest::ImageIndex(index) => {
            let chosen = choose(&index.manifests).ok_or_else(|| {
                Error::invalid(match platform {
                    Some(p) => format!("its index has no image for {p}"),
                    None => format!(
                        "its index has no image for this host ({}/{}): choose one with --platform",
                        std::env::consts::OS,
                        host_arch()
                    ),
                })
            })?;
            let one = image.clone_with_digest(chosen);
            let (body, digest) = client
                .pull_manifest_raw(
                    &one,
                    auth,
                    &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE],
                )
                .await
                .map_err(failed)?;
            match parse(&body)? {
                OciManifest::Image(manifest) => (manifest, digest),
                OciManifest::ImageIndex(_) => {
                    return Err(sent("its index names another index, not an image"))
                }
            }
        }
    };
    if !(0..=MAX_MANIFEST as i64).contains(&manifest.config.size) {
        return Err(too_large("config"));
    }
    let mut config = Vec::new();
    client
        .pull_blob(image, &manifest.config, &mut config)
        .await
        .map_err(failed)?;
    if config.len() > MAX_MANIFEST {
        return Err(too_large("config"));
    }
    Ok(Fetched {
        manifest,
        digest,
        config,
    })
}

fn parse(body: &[u8]) -> Result<OciManifest, Error> {
    if body.len() > MAX_MANIFEST {
        return Err(too_large("manifest"));
    }
    serde_json::from_slice(body).map_err(|e| sent(&format!("its manifest cannot be read: {e}")))
}

fn too_large(what: &str) -> Error {
    sent(&format!(
        "its {what} is larger than {MAX_MANIFEST} bytes, the most a pull accepts"
    ))
}

/// What the registry sent cannot be used.
fn sent(why: &str) -> Error {
    Error::new(ErrorKind::Registry, why)
}

/// The image of an index a pull takes: the one of `platform`
/// (`os/arch[/variant]`), or the host's.
pub(crate) fn chooser(platform: Option<&str>) -> Result<Chooser, Error> {
    let Some(platform) = platform else {
        return Ok(Box::new(current_platform_resolver));
    };
    let (os, arch, variant) = parse_platform(platform)?;
    Ok(Box::new(move |entries: &[ImageIndexEntry]| {
        entries
            .iter()
            .find(|e| {
                e.platform.as_ref().is_some_and(|p| {
                    p.os.to_string() == os
                        && p.architecture.to_string() == arch
                        && (variant.is_none() || p.variant == variant)
                })
            })
            .map(|e| e.digest.clone())
    }))
}

/// Whether an image of platform `have` (`os/arch[/variant]`, as a pull
/// records it) is one of platform `wanted`: the same os and architecture,
/// and the same variant where `wanted` names one.
pub fn platform_matches(wanted: &str, have: &str) -> Result<bool, Error> {
    let (os, arch, variant) = parse_platform(wanted)?;
    let Ok((have_os, have_arch, have_variant)) = parse_platform(have) else {
        return Ok(false);
    };
    Ok(os == have_os && arch == have_arch && (variant.is_none() || variant == have_variant))
}

/// `os/arch[/variant]`.
fn parse_platform(platform: &str) -> Result<(String, String, Option<String>), Error> {
    let mut parts = platform.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(os), Some(arch), variant, None) if !os.is_empty() && !arch.is_empty() => {
            Ok((os.to_owned(), arch.to_owned(), variant.map(str::to_owned)))
        }
        _ => Err(Error::invalid(format!(
            "{platform:?} is not a platform: give os/arch[/variant], e.g. linux/arm64"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_are_os_arch_and_maybe_a_variant() {
        assert_eq!(
            parse_platform("linux/arm64/v8").unwrap(),
            ("linux".into(), "arm64".into(), Some("v8".into()))
        );
        assert_eq!(
            parse_platform("linux/amd64").unwrap(),
            ("linux".into(), "amd64".into(), None)
        );
        for bad in ["linux", "/amd64", "linux/", "a/b/c/d"] {
            assert_eq!(
                parse_platform(bad).unwrap_err().kind,
                crate::ErrorKind::Invalid
            );
        }
    }

    #[test]
    fn a_platform_asked_for_matches_the_images_of_it() {
        let m = |w, h| platform_matches(w, h).unwrap();
        assert!(m("linux/amd64", "linux/amd64"));
        assert!(m("linux/arm64", "linux/arm64/v8"), "no variant asked: any");
        assert!(m("linux/arm64/v8", "linux/arm64/v8"));
        assert!(!m("linux/arm64/v8", "linux/arm64"));
        assert!(!m("linux/amd64", "linux/arm64"));
        assert!(
            !m("linux/amd64", ""),
            "an image whose platform is not known"
        );
        assert!(platform_matches("amd64", "linux/amd64").is_err());
    }

    #[test]
    fn a_manifest_past_the_bound_is_refused_before_it_is_parsed() {
        let mut big = b"{\"schemaVersion\":2,\"layers\":[".to_vec();
        big.resize(MAX_MANIFEST + 1, b' ');
        let e = parse(&big).unwrap_err();
        assert!(e.message.contains("larger than"), "{e}");
        assert!(parse(b"{not json").is_err());
    }
}
