//! Reading PEM certificate chains and keys, and what the gateway reports about a certificate:
//! its name (first DNS name, for metrics and logs), the names SNI may choose it by, notAfter.

use std::path::Path;
use std::time::SystemTime;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::TlsError;

/// A chain from a PEM file (end-entity certificate first).
pub fn read_chain(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path, what)?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCertificate {
            path: path.display().to_string(),
            error: pem_error(&e),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.display().to_string(),
            expected: "CERTIFICATE",
        });
    }
    Ok(chain)
}

/// A private key from a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path, "key")?;
    // PKCS#8's encrypted form (RFC 5958 §3), or OpenSSL's legacy `Proc-Type: 4,ENCRYPTED`
    // header on a PKCS#1 or SEC1 key (which would otherwise parse and fail as garbage).
    let holds = |m: &[u8]| bytes.windows(m.len()).any(|w| w == m);
    if holds(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || holds(b"Proc-Type: 4,ENCRYPTED") {
        return Err(TlsError::EncryptedKey {
            path: path.display().to_string(),
        });
    }
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| TlsError::Empty {
        what: "key",
        path: path.display().to_string(),
        expected: "PRIVATE KEY",
    })
}

/// A PEM error in words: the parser's own names its markers as lists of bytes.
fn pem_error(e: &pem::Error) -> String {
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
    match e {
        pem::Error::MissingSectionEnd { end_marker } => format!(
            "a PEM block has no `-----END {}-----` line (is the file cut short?)",
            text(end_marker)
        ),
        pem::Error::IllegalSectionStart { line } => {
            format!("a malformed PEM `-----BEGIN` line: `{}`", text(line))
        }
        other => other.to_string(),
    }
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.display().to_string(),
        error: e.to_string(),
    })
}

/// What the gateway knows about one loaded pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The first DNS name (else the subject's CN, else `-`): the `cert` metric label.
    pub name: String,
    /// DNS names SNI may choose this pair by, lower-case (`*.example.com` included as is).
    pub dns_names: Vec<String>,
    /// notAfter as Unix seconds (of the chain's first certificate to expire).
    pub not_after: i64,
    /// Which certificate that is: `name`, or `name's chain: OTHER` (for messages).
    pub first_to_expire: String,
}

impl CertInfo {
    /// The names SNI chooses it by, or, with none, the one it is labelled by (its CN).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let label = self.dns_names.is_empty().then_some(self.name.as_str());
        self.dns_names.iter().map(String::as_str).chain(label)
    }

    pub fn parse(der: &CertificateDer<'_>, path: &Path) -> Result<CertInfo, TlsError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| TlsError::BadCertificate {
                path: path.display().to_string(),
                error: e.to_string(),
            })?;
        let mut dns_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for n in &san.value.general_names {
                if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                    dns_names.push(d.to_ascii_lowercase());
                }
            }
        }
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .map(str::to_ascii_lowercase);
        let name = dns_names
            .first()
            .cloned()
            .or(cn)
            .unwrap_or_else(|| "-".into());
        Ok(CertInfo {
            first_to_expire: name.clone(),
            name,
            dns_names,
            not_after: cert.validity().not_after.timestamp(),
        })
    }

    /// Seconds left at `now` (negative once expired).
    pub fn seconds_left(&self, now: SystemTime) -> i64 {
        let now = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        self.not_after - now
    }
}

/// Load one certificate/key pair: both readable, the key the certificate's. Expiry is the
/// caller's to judge ([`CertInfo::seconds_left`]). The pair lasts as long as the first of its
/// chain to expire: an expired intermediate fails every client that verifies the chain, as an
/// expired leaf does, so its `notAfter` is the pair's (in `check`'s days left, the expiry
/// gauge and the warnings) and the name is that certificate's.
pub fn load_pair(cert: &Path, key: &Path) -> Result<(CertifiedKey, CertInfo), TlsError> {
    let chain = read_chain(cert, "certificate")?;
    let mut info = CertInfo::parse(&chain[0], cert)?;
    let mut first_to_expire = info.name.clone();
    for c in &chain[1..] {
        let other = CertInfo::parse(c, cert)?;
        if other.not_after < info.not_after {
            info.not_after = other.not_after;
            first_to_expire = format!("{}'s chain: {}", info.name, other.name);
        }
    }
    let der = read_key(key)?;
    // What `CertifiedKey::from_der` does, in two steps, so that a key the provider cannot
    // use is not reported as a key that does not match its certificate.
    let signing = super::provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| TlsError::UnusableKey {
            path: key.display().to_string(),
            error: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        // A key whose public half cannot be derived is not known to mismatch.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(e) => {
            let error = match e {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    "the certificate's public key is not this key's (a key from another pair?)"
                        .to_string()
                }
                e => e.to_string(),
            };
            return Err(TlsError::KeyMismatch {
                cert: cert.display().to_string(),
                key: key.display().to_string(),
                error,
            });
        }
    }
    info.first_to_expire = first_to_expire;
    Ok((certified, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both ways a PEM key is put under a passphrase: PKCS#8's own, and OpenSSL's legacy
    /// header on a PKCS#1 or SEC1 block (which would otherwise read as a key of garbage).
    #[test]
    fn an_encrypted_key_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        for (name, pem) in [
            (
                "pkcs8.key",
                "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
            ),
            (
                "legacy.key",
                "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00\n\nMIIB\n-----END EC PRIVATE KEY-----\n",
            ),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).unwrap();
            match read_key(&path) {
                Err(TlsError::EncryptedKey { .. }) => {}
                other => panic!("{name}: {other:?}"),
            }
        }
        let plain = dir.path().join("plain.key");
        std::fs::write(&plain, "no key here\n").unwrap();
        assert!(matches!(read_key(&plain), Err(TlsError::Empty { .. })));
    }
}
