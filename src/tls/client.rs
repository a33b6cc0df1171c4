//! The client side: rustls configurations for https upstreams and Redis over TLS.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::certs::{read_chain, read_key};
use super::TlsError;
use crate::model::tls::ClientTls;

/// The system's roots, read once per process (rustls-native-certs: the OpenSSL directories
/// on Linux, honouring `SSL_CERT_FILE`/`SSL_CERT_DIR`).
fn system_roots() -> Arc<RootCertStore> {
    static ROOTS: OnceLock<Arc<RootCertStore>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "cannot read some system root certificates");
            }
            let mut store = RootCertStore::empty();
            let (added, ignored) = store.add_parsable_certificates(found.certs);
            tracing::debug!(added, ignored, "system root certificates loaded");
            Arc::new(store)
        })
        .clone()
}

/// A client configuration for `t`: its CA (else the system roots), its client certificate.
/// ALPN is left empty: the gateway speaks HTTP/1.1 to upstreams and RESP to Redis.
pub fn config(t: &ClientTls) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder_with_provider(super::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = if t.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate))
    } else {
        let roots = match &t.ca {
            Some(ca) => {
                let mut store = RootCertStore::empty();
                for c in read_chain(ca, "ca")? {
                    store.add(c).map_err(|e| TlsError::BadCertificate {
                        path: ca.display().to_string(),
                        error: e.to_string(),
                    })?;
                }
                Arc::new(store)
            }
            None => system_roots(),
        };
        builder.with_root_certificates(roots)
    };
    match (&t.client_cert, &t.client_key) {
        (Some(cert), Some(key)) => {
            let chain = read_chain(cert, "client_cert")?;
            let der = read_key(key)?;
            builder
                .with_client_auth_cert(chain, der)
                .map_err(|e| TlsError::KeyMismatch {
                    cert: cert.display().to_string(),
                    key: key.display().to_string(),
                    error: e.to_string(),
                })
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// `insecure_skip_verify: true`: any certificate is accepted, though the handshake's
/// signatures are still checked (so the session is at least with the holder of *a* key).
#[derive(Debug)]
struct AnyCertificate;

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
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
            &super::provider().signature_verification_algorithms,
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
            &super::provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        super::provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
