//! TLS material: certificate pairs for the listeners (chosen by SNI, swapped live) and client
//! configurations for https upstreams and Redis. Loaded from the files the model names, once
//! per (re)load and off the request path; a handshake only reads an `ArcSwap`.
//!
//! rustls with the *ring* provider throughout (no OpenSSL). Listeners offer ALPN `h2`,
//! `http/1.1` and `http/1.0`, and TLS 1.2+ (or 1.3 only).

pub mod certs;
pub mod client;
pub mod server;

use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use rustls::crypto::CryptoProvider;

use crate::model::table::{Boot, Table};
use crate::model::tls::At;

/// How long before its notAfter a certificate is warned about (by `sluice check` and every
/// load).
pub const EXPIRY_WARNING: std::time::Duration = std::time::Duration::from_secs(14 * 86_400);

/// Why a TLS file did not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} `{path}`: {error}")]
    Read {
        what: &'static str,
        path: String,
        error: String,
    },
    #[error("{what} `{path}` holds no PEM {expected}")]
    Empty {
        what: &'static str,
        path: String,
        expected: &'static str,
    },
    /// A PEM key under a passphrase: there is no one to type it at a reload.
    #[error("key `{path}` is encrypted: sluice reads unencrypted keys (write one with `openssl pkey -in {path} -out PLAIN.key`)")]
    EncryptedKey { path: String },
    /// A key this TLS stack cannot sign with, whatever certificate it comes with.
    #[error("key `{path}` cannot sign TLS handshakes here: {error} (RSA of 2048 to 8192 bits, ECDSA P-256 or P-384, and Ed25519 keys can)")]
    UnusableKey { path: String, error: String },
    #[error("certificate `{cert}` and key `{key}` do not belong together: {error}")]
    KeyMismatch {
        cert: String,
        key: String,
        error: String,
    },
    #[error("certificate `{path}` cannot be parsed: {error}")]
    BadCertificate { path: String, error: String },
    #[error("{0}")]
    Config(String),
}

/// One problem, at the config entry that named the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    pub at: At,
    pub message: String,
}

/// Everything a load produced: per listener its certificate set (`None` for cleartext),
/// per upstream its client configuration (`None` for http), the Redis one, and warnings
/// (certificates about to expire, verification switched off).
#[derive(Default)]
pub struct Material {
    pub listeners: Vec<Option<Arc<server::CertSet>>>,
    pub upstreams: Vec<Option<Arc<rustls::ClientConfig>>>,
    pub redis: Option<Arc<rustls::ClientConfig>>,
    pub warnings: Vec<Located>,
    /// Per listener (by index), each pair that had expired at load. It is served, with a
    /// warning; but a reload does not put one in where a valid pair runs (`runtime::reload`).
    pub expired: Vec<(usize, Expired)>,
}

/// A pair that had expired at load: the names it is chosen by, and the entry naming it
/// (`message` says when it expired; the reload that refuses it says why).
#[derive(Debug, Clone)]
pub struct Expired {
    pub names: Vec<String>,
    /// Its notAfter: with its names, what tells whether it is already running.
    pub not_after: i64,
    pub entry: Located,
}

/// The process's crypto provider (ring), shared by every configuration.
pub fn provider() -> Arc<CryptoProvider> {
    static P: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    P.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// Load every file `boot` and `table` name, as of `now`. All problems are returned at once.
pub fn load(boot: &Boot, table: &Table, now: SystemTime) -> Result<Material, Vec<Located>> {
    let mut errors = Vec::new();
    let mut m = Material::default();
    for (i, l) in boot.listeners.iter().enumerate() {
        let mut expired = Vec::new();
        let set = l.tls.as_ref().and_then(|t| {
            match server::CertSet::load(&t.certificates, now, &mut m.warnings, &mut expired) {
                Ok(set) => Some(Arc::new(set)),
                Err(e) => {
                    errors.extend(e);
                    None
                }
            }
        });
        m.listeners.push(set);
        m.expired.extend(expired.into_iter().map(|e| (i, e)));
    }
    let mut client = |tls: &Option<crate::model::tls::ClientTls>, m: &mut Material| {
        let t = tls.as_ref()?;
        if t.insecure_skip_verify {
            m.warnings.push(Located {
                at: t.at.clone(),
                message: "insecure_skip_verify: the upstream's certificate is not verified; anyone on the path can impersonate it".into(),
            });
        }
        match client::config(t) {
            Ok(c) => Some(Arc::new(c)),
            Err(e) => {
                errors.push(Located {
                    at: t.at.clone(),
                    message: e.to_string(),
                });
                None
            }
        }
    };
    for u in &table.upstreams {
        let c = client(&u.tls, &mut m);
        m.upstreams.push(c);
    }
    m.redis = client(&boot.store.redis.tls, &mut m);
    if errors.is_empty() {
        Ok(m)
    } else {
        Err(errors)
    }
}
