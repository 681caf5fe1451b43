//! One conversation with a registry: the client (with the transport's
//! settings), the credentials stored for the image's registry, and the
//! runtime its requests run on; and the client's errors in the user's
//! terms. Pull, push and manifest share it.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::{auth, reference, Error, ErrorKind, Transport};

/// The client, the image, the credentials for its registry, and the
/// runtime to run requests on.
pub(crate) struct Session {
    pub client: Client,
    pub image: Reference,
    /// The image's registry, `host[:port]`.
    pub registry: String,
    pub auth: RegistryAuth,
    runtime: &'static tokio::runtime::Runtime,
}

impl Session {
    /// A session for the image `reference`, reached as `transport` says.
    pub fn open(reference: &str, transport: &Transport) -> Result<Session, Error> {
        let image = reference::parse(reference)?;
        let client = Client::new(client_config(transport)?);
        let registry = image.resolve_registry().to_owned();
        let auth = auth::credentials_for(&registry);
        Ok(Session {
            client,
            image,
            registry,
            auth,
            runtime: runtime()?,
        })
    }

    /// The client's error in the user's terms.
    pub fn failed(&self, e: OciDistributionError) -> Error {
        explain(&self.registry, &self.auth, e)
    }

    /// Runs `future` to its end on the process's registry runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

/// `registry/repository` of `image`.
pub(crate) fn repository_of(image: &Reference) -> String {
    format!("{}/{}", image.resolve_registry(), image.repository())
}

/// The runtime every registry request of the process runs on, made at the
/// first: two worker threads drive the client's connections, and each
/// caller's future runs on the caller's own thread, so the pulls and
/// pushes of several requests go side by side.
fn runtime() -> Result<&'static tokio::runtime::Runtime, Error> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let made = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("registry")
        .enable_all()
        .build()
        .map_err(|e| {
            Error::new(
                ErrorKind::Store,
                format!("cannot start the registry client: {e}"),
            )
        })?;
    Ok(RUNTIME.get_or_init(|| made))
}

/// The client's settings: plain HTTP only for the registries named.
fn client_config(transport: &Transport) -> Result<ClientConfig, Error> {
    let Transport {
        insecure,
        no_tls_verify,
        ca_file,
    } = transport;
    let mut config = ClientConfig {
        protocol: if insecure.is_empty() {
            ClientProtocol::Https
        } else {
            ClientProtocol::HttpsExcept(insecure.clone())
        },
        accept_invalid_certificates: *no_tls_verify,
        read_timeout: Some(Duration::from_secs(60)),
        connect_timeout: Some(Duration::from_secs(10)),
        ..ClientConfig::default()
    };
    if let Some(file) = ca_file {
        let data = std::fs::read(file)
            .map_err(|e| Error::invalid(format!("the CA file {}: {e}", file.display())))?;
        config.extra_root_certificates.push(Certificate {
            encoding: CertificateEncoding::Pem,
            data,
        });
    }
    Ok(config)
}

/// The host's architecture as image indexes name it.
pub(crate) fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

/// An error and its causes, innermost last: a client's own message ("error
/// sending request") hides why.
fn causes(e: &dyn std::error::Error) -> String {
    let mut all = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        all.push_str(": ");
        all.push_str(&cause.to_string());
        source = cause.source();
    }
    all
}

/// The client's error in the user's terms.
fn explain(
    registry: &str,
    auth: &RegistryAuth,
    e: oci_client::errors::OciDistributionError,
) -> Error {
    use OciDistributionError as E;
    let message = match e {
        E::AuthenticationFailure(_) | E::UnauthorizedError { .. } => {
            return Error::new(
                ErrorKind::Unauthorized,
                match auth {
                    RegistryAuth::Anonymous => {
                        format!("{registry} wants credentials: run `layerfs login {registry}`")
                    }
                    _ => format!(
                        "{registry} refused the stored credentials: run `layerfs login {registry}` again"
                    ),
                },
            )
        }
        E::RequestError(e)
            if e.url().is_some_and(|u| u.scheme() == "https")
                && (e.is_connect() || e.is_request()) =>
        {
            let causes = causes(&e);
            if causes.contains("certificate") || causes.contains("UnknownIssuer") {
                format!(
                    "{registry}: its TLS certificate is not trusted ({causes}): name its CA's PEM \
                     file in LAYERFS_REGISTRY_CA for the daemon, or give --tls-verify=false"
                )
            } else {
                format!(
                    "{registry}: cannot reach it over HTTPS ({causes}); if it serves plain \
                     HTTP, add --insecure-registry {registry}"
                )
            }
        }
        e => format!("{registry}: {e}"),
    };
    Error::new(ErrorKind::Registry, message)
}
