//! Certificates made by the tests (rcgen): a private CA and leaves it signs, written as PEM
//! files, with chosen names and validity.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};

/// A private certificate authority.
pub struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A leaf's files.
#[derive(Clone)]
pub struct Pair {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// notAfter, Unix seconds.
    pub not_after: i64,
    /// The certificate's DER, to tell pairs apart.
    pub der: Vec<u8>,
}

pub fn now_unix() -> i64 {
    #[allow(clippy::disallowed_methods)] // certificate validity is wall-clock
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn ts(unix: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix).unwrap()
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = ts(now_unix() - 86_400);
        params.not_after = ts(now_unix() + 3650 * 86_400);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// Write the CA certificate to `path`.
    pub fn write(&self, path: &Path) -> PathBuf {
        std::fs::write(path, self.cert.pem()).unwrap();
        path.to_path_buf()
    }

    /// A leaf for `names` (DNS names, or IP addresses), valid from a day ago for `days`
    /// (negative: already expired), written to `dir/{stem}.crt` and `dir/{stem}.key`.
    pub fn leaf(&self, dir: &Path, stem: &str, names: &[&str], days: i64) -> Pair {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, names.first().copied().unwrap_or(stem));
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().unwrap()),
            })
            .collect();
        let not_after = now_unix() + days * 86_400;
        params.not_before = ts(now_unix().min(not_after) - 86_400);
        params.not_after = ts(not_after);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let pair = Pair {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
            not_after,
            der: cert.der().to_vec(),
        };
        std::fs::write(&pair.cert, cert.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        pair
    }
}

/// A `listen:` list for the harness: the cleartext `{ADDR}` it waits for, and a TLS listener
/// on a free port serving `pair`.
pub fn listen_with_tls(pair: &Pair) -> String {
    format!(
        "listen:
  - address: {{ADDR}}
  - address: 127.0.0.1:{}
    tls:
      certificates:
        - {{ cert: {}, key: {} }}
",
        super::free_port(),
        pair.cert.display(),
        pair.key.display()
    )
}
