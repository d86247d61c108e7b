//! TLS through rustls with the *ring* provider, for the three places that speak it:
//! - the main listener (`server.tls_cert_file`, `server.tls_key_file`): view-syncers of Zero 0.22 and later reach
//!   the sidecar at a `wss://` URL. The certificate is read at start and again on SIGHUP ([`Tls::reload`]);
//!   handshakes after a reload present the new one, connections already open keep theirs, and a reload that
//!   cannot read a usable pair keeps the old one, so a botched renewal never takes the listener down;
//! - the relay's connection to the upstream change-streamer (`upstream.tls`), for a change-streamer behind a
//!   TLS-terminating proxy; its CA bundle is re-read on SIGHUP too;
//! - `litestream-sidecar status` asking a daemon whose listener speaks TLS ([`status_connector`]).
//!
//! Apart from the server and the relay, so that neither knows more of TLS than "wrap this stream".

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

/// The only protocol the listener and the relay speak over TLS: offering it through ALPN keeps a client or proxy
/// that prefers HTTP/2 from choosing it.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Why TLS material could not be loaded; each names the key and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{key} = {path:?}: {reason}")]
    File {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error(
        "server.tls_key_file = {key:?} is not the private key of the certificate in server.tls_cert_file = {cert:?}"
    )]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error(
        "upstream.tls: no trusted root certificate found on this system; set upstream.tls_ca_file (or SSL_CERT_FILE)"
    )]
    NoRoots,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `server.tls_cert_file` and `server.tls_key_file`: only paths here; this module reads them at start and on
/// SIGHUP, so that `status` and `--check-config` users need no access to the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// PEM: the certificate, then any intermediates.
    pub cert_file: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

/// `upstream.tls = true`: how the upstream's certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTlsConfig {
    /// PEM bundle of the CAs trusted instead of the system's; `None`: the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// The name the certificate must carry, also sent as SNI (unless an IP address).
    pub server_name: rustls::pki_types::ServerName<'static>,
}

/// The TLS material a config asks for, loaded.
#[derive(Clone, Default)]
pub struct Tls {
    pub server: Option<Arc<ServerTls>>,
    pub upstream: Option<Arc<UpstreamTls>>,
}

impl Tls {
    /// Reads every file the config names; an error here means the sidecar cannot serve as configured.
    pub fn load(
        server: Option<&ServerTlsFiles>,
        upstream: Option<&UpstreamTlsConfig>,
    ) -> Result<Tls, TlsError> {
        Ok(Tls {
            server: match server {
                Some(files) => Some(Arc::new(ServerTls::load(files.clone())?)),
                None => None,
            },
            upstream: match upstream {
                Some(upstream) => Some(Arc::new(UpstreamTls::load(upstream.clone())?)),
                None => None,
            },
        })
    }

    /// What SIGHUP does: re-reads the listener's certificate and key and the upstream's trusted CAs. Each part
    /// that fails is logged and keeps what it had; each part's outcome is handed to `outcome` (true: re-read), which
    /// counts it.
    pub fn reload(&self, mut outcome: impl FnMut(bool)) {
        if self.server.is_none() && self.upstream.is_none() {
            info!("reload: no TLS configured, nothing to re-read");
            return;
        }
        if let Some(server) = &self.server {
            let result = server.reload();
            outcome(result.is_ok());
            match result {
                Ok(chain) => info!(
                    cert_file = %server.files.cert_file.display(),
                    chain,
                    "TLS certificate reloaded; new connections get it"
                ),
                Err(err) => error!(
                    error = %err,
                    "TLS certificate not reloaded; still serving the previous one"
                ),
            }
        }
        if let Some(upstream) = &self.upstream {
            let result = upstream.reload();
            outcome(result.is_ok());
            match result {
                Ok(roots) => info!(roots, "upstream TLS trust reloaded"),
                Err(err) => error!(
                    error = %err,
                    "upstream TLS trust not reloaded; keeping the previous one"
                ),
            }
        }
    }
}

/// The server side of a handshake on an accepted connection, given up after `within` (a client that never sends
/// its ClientHello must not hold a connection) or on shutdown. Failures are logged at debug only: port scanners
/// and TCP health checks fail them all day.
pub async fn accept<S>(
    acceptor: &TlsAcceptor,
    stream: S,
    within: Duration,
    shutdown: &CancellationToken,
) -> Option<tokio_rustls::server::TlsStream<S>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let result = tokio::select! {
        result = tokio::time::timeout(within, acceptor.accept(stream)) => result,
        _ = shutdown.cancelled() => return None,
    };
    match result {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(err)) => {
            debug!(error = %err, "TLS handshake failed");
            None
        }
        Err(_) => {
            debug!(?within, "no TLS handshake in time");
            None
        }
    }
}

/// The listener's TLS: one rustls config for the process, whose certificate resolver hands out the pair loaded
/// last, so that a reload reaches new handshakes without touching open connections.
pub struct ServerTls {
    files: ServerTlsFiles,
    provider: Arc<CryptoProvider>,
    current: Arc<CurrentCert>,
    acceptor: TlsAcceptor,
}

impl ServerTls {
    pub fn load(files: ServerTlsFiles) -> Result<ServerTls, TlsError> {
        let provider = provider();
        let current = Arc::new(CurrentCert(RwLock::new(Arc::new(certified_key(
            &files, &provider,
        )?))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(ServerTls {
            files,
            provider,
            current,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Re-reads both files; on success new handshakes present the new pair. Returns the chain's length.
    pub fn reload(&self) -> Result<usize, TlsError> {
        let loaded = certified_key(&self.files, &self.provider)?;
        let chain = loaded.cert.len();
        swap(&self.current.0, Arc::new(loaded));
        Ok(chain)
    }
}

/// Puts `value` in place of what `lock` holds. A panic while it was held cannot have left a half-written value
/// behind (every write is this one assignment), so poisoning is ignored.
fn swap<T>(lock: &RwLock<T>, value: T) {
    *lock.write().unwrap_or_else(PoisonError::into_inner) = value;
}

/// The certificate and key new handshakes present.
#[derive(Debug)]
struct CurrentCert(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.0
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// The certificate chain and its private key, checked to belong together: a renewal that replaced one file and
/// not (yet) the other is refused rather than served to clients that would all fail their handshake.
fn certified_key(
    files: &ServerTlsFiles,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    const CERT: &str = "server.tls_cert_file";
    const KEY: &str = "server.tls_key_file";
    let chain = certificates(CERT, &files.cert_file)?;
    let key = PrivateKeyDer::from_pem_slice(&read(KEY, &files.key_file)?).map_err(|err| {
        let reason = match err {
            pem::Error::NoItemsFound => "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it".into(),
            err => format!("not PEM: {err}"),
        };
        file_error(KEY, &files.key_file, reason)
    })?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|err| file_error(KEY, &files.key_file, format!("unusable private key: {err}")))?;
    let certified = CertifiedKey::new(chain, key);
    match certified.keys_match() {
        // A key whose public half rustls cannot derive is not known to mismatch.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch {
                cert: files.cert_file.clone(),
                key: files.key_file.clone(),
            })
        }
        Err(err) => Err(file_error(
            CERT,
            &files.cert_file,
            format!("unusable certificate: {err}"),
        )),
    }
}

fn file_error(key: &'static str, path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::File {
        key,
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The whole of a (small) file named by config key `key`.
fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|err| file_error(key, path, err.to_string()))
}

/// Every certificate of a PEM file, at least one; other sections (such as a key) are skipped.
fn certificates(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(&read(key, path)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| file_error(key, path, format!("not PEM: {err}")))?;
    if certs.is_empty() {
        return Err(file_error(key, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// The relay's TLS toward the upstream change-streamer.
pub struct UpstreamTls {
    config: UpstreamTlsConfig,
    connector: RwLock<TlsConnector>,
}

impl std::fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl UpstreamTls {
    pub fn load(config: UpstreamTlsConfig) -> Result<UpstreamTls, TlsError> {
        let (connector, _) = client_connector(&config)?;
        Ok(UpstreamTls {
            config,
            connector: RwLock::new(connector),
        })
    }

    /// Wraps a connected stream in TLS, checking the upstream's certificate against the trusted CAs and the
    /// configured name.
    pub async fn connect(
        &self,
        stream: TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let connector = self
            .connector
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        connector
            .connect(self.config.server_name.clone(), stream)
            .await
    }

    /// Re-reads the trusted CAs; returns how many there are.
    pub fn reload(&self) -> Result<usize, TlsError> {
        let (connector, roots) = client_connector(&self.config)?;
        swap(&self.connector, connector);
        Ok(roots)
    }
}

/// A connector trusting `upstream.tls_ca_file` alone when it is set (as `curl --cacert` does: a private CA is
/// not a reason to trust every public one too), else the system's trust store; and how many roots it trusts.
fn client_connector(config: &UpstreamTlsConfig) -> Result<(TlsConnector, usize), TlsError> {
    const CA: &str = "upstream.tls_ca_file";
    let mut roots = rustls::RootCertStore::empty();
    match &config.ca_file {
        Some(path) => {
            for cert in certificates(CA, path)? {
                roots.add(cert).map_err(|err| {
                    file_error(CA, path, format!("not a usable CA certificate: {err}"))
                })?;
            }
        }
        None => {
            roots = system_roots().0;
            if roots.is_empty() {
                return Err(TlsError::NoRoots);
            }
        }
    }
    let count = roots.len();
    let mut client = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok((TlsConnector::from(Arc::new(client)), count))
}

/// The connector `litestream-sidecar status` uses toward a daemon whose listener speaks TLS: it trusts exactly the
/// certificate in `server.tls_cert_file`, whoever issued it and whatever names it carries, since the command
/// usually asks over loopback, which no certificate names. Only the certificate is read, never the key.
pub fn status_connector(files: &ServerTlsFiles) -> Result<TlsConnector, TlsError> {
    let provider = provider();
    let expected = certificates("server.tls_cert_file", &files.cert_file)?.swap_remove(0);
    let mut client = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned { expected, provider }))
        .with_no_client_auth();
    client.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(TlsConnector::from(Arc::new(client)))
}

/// Why `status` refused the daemon's certificate.
#[derive(Debug, thiserror::Error)]
#[error(
    "the daemon's certificate is not the one in server.tls_cert_file (renewed since the daemon read it? \
     send it SIGHUP)"
)]
struct NotTheConfiguredCertificate;

/// Accepts one certificate, byte for byte. Handshake signatures are still verified, so the peer holds its key.
#[derive(Debug)]
struct Pinned {
    expected: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.expected.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(
                    NotTheConfiguredCertificate,
                ))),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The system's trust store (as `SSL_CERT_FILE`/`SSL_CERT_DIR` or the platform's defaults say), and why any of
/// it could not be read: the roots every verified TLS client of the sidecar trusts unless told otherwise.
pub(crate) fn system_roots() -> (rustls::RootCertStore, Vec<rustls_native_certs::Error>) {
    let loaded = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(loaded.certs);
    (roots, loaded.errors)
}
