//! The TLS connector for the change DB, chosen once at start from the connection string's `sslmode`, through
//! rustls with the *ring* provider:
//! - `disable`: plain TCP.
//! - `prefer` (tokio-postgres' default): TLS if the server offers it, else plain, and the certificate is not
//!   verified: as with libpq, an active attacker can downgrade `prefer` to plain text anyway, so verification would add
//!   no protection and would only break servers with private CAs. SCRAM channel binding still applies.
//! - `require`: TLS, with the certificate verified against the system's trust store (`SSL_CERT_FILE` /
//!   `SSL_CERT_DIR` are honoured, so a private CA such as a cloud provider's can be added there). This is stricter
//!   than libpq's `require`, which only encrypts.
//!
//! Apart because the certificate handling is its own concern, and the one place that relaxes rustls' checks.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;
use tracing::warn;

/// The TLS connector chosen from `sslmode` once, at start.
#[derive(Clone)]
pub(super) enum ChangeDbTls {
    Off,
    Rustls(MakeRustlsConnect),
}

impl ChangeDbTls {
    pub(super) fn for_mode(mode: SslMode) -> ChangeDbTls {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions");
        match mode {
            SslMode::Disable => ChangeDbTls::Off,
            SslMode::Prefer => {
                let config = builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
                    .with_no_client_auth();
                ChangeDbTls::Rustls(MakeRustlsConnect::new(config))
            }
            // `require`, and any stricter mode a later tokio-postgres may add: verify.
            _ => {
                let (roots, errors) = crate::net::tls::system_roots();
                if roots.is_empty() {
                    warn!(
                        ?errors,
                        "sslmode=require but no trusted root certificates were found; set SSL_CERT_FILE"
                    );
                }
                let config = builder.with_root_certificates(roots).with_no_client_auth();
                ChangeDbTls::Rustls(MakeRustlsConnect::new(config))
            }
        }
    }
}

/// `sslmode=prefer`: encrypts without checking who is at the other end, as libpq does. Handshake signatures are
/// still verified, so the session keys belong to whoever holds the certificate's key.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
