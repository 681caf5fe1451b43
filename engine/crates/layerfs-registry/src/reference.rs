//! Image references as podman reads them: `debian` is
//! `docker.io/library/debian:latest`.

use oci_client::Reference;

use crate::Error;

/// `reference` parsed with Docker Hub's defaults applied, or why it is not
/// one.
pub fn parse(reference: &str) -> Result<Reference, Error> {
    reference
        .parse::<Reference>()
        .map_err(|e| Error::invalid(format!("{reference:?} is not an image reference: {e}")))
}

/// The full form of `reference` (`registry/repository:tag` or `@digest`),
/// the name an image is recorded under.
pub fn normalize(reference: &str) -> Result<String, Error> {
    Ok(parse(reference)?.whole())
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn short_names_get_docker_hubs_defaults() {
        assert_eq!(
            normalize("debian").unwrap(),
            "docker.io/library/debian:latest"
        );
        assert_eq!(
            normalize("debian:bookworm").unwrap(),
            "docker.io/library/debian:bookworm"
        );
        assert_eq!(
            normalize("127.0.0.1:5000/team/app:v1").unwrap(),
            "127.0.0.1:5000/team/app:v1"
        );
        let pinned = format!("quay.io/x/y@sha256:{}", "a".repeat(64));
        assert_eq!(normalize(&pinned).unwrap(), pinned);
        assert!(normalize("has space").is_err());
        assert!(normalize("").is_err());
        assert!(normalize("library/UPPER").is_err());
    }
}
