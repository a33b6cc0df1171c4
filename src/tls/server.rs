//! The listener side: a set of certificate pairs chosen by SNI, published through an
//! `ArcSwap` so a reload or a certificate rotation changes what new handshakes get while
//! open connections keep the pair they started with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

use super::certs::{load_pair, CertInfo};
use super::{Located, EXPIRY_WARNING};
use crate::model::tls::{CertFiles, TlsVersion};

/// A listener's certificates: the first is the default (no SNI, or a name none covers).
#[derive(Debug)]
pub struct CertSet {
    default: Arc<CertifiedKey>,
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` is stored as `example.com`; it covers exactly one more label.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    pub infos: Vec<CertInfo>,
}

impl CertSet {
    /// Load every pair; a name covered by two pairs goes to the first. Warnings for pairs
    /// that expire within [`EXPIRY_WARNING`], or have expired, are appended to `warnings`,
    /// and the expired ones to `expired` too.
    pub fn load(
        files: &[CertFiles],
        now: SystemTime,
        warnings: &mut Vec<Located>,
        expired: &mut Vec<Located>,
    ) -> Result<CertSet, Vec<Located>> {
        let mut errors = Vec::new();
        let mut loaded = Vec::with_capacity(files.len());
        for f in files {
            match load_pair(&f.cert, &f.key) {
                Ok((key, info)) => {
                    let left = info.seconds_left(now);
                    let (cert, which) = (f.cert.display(), &info.first_to_expire);
                    let at = f.at.clone();
                    if left <= 0 {
                        // Served all the same (as nginx and Envoy do): refusing it would
                        // stop every reload, and a restart, until it is renewed.
                        warnings.push(Located {
                            at: at.clone(),
                            message: format!("certificate `{cert}` ({which}) expired {} days ago, at {} (Unix time): served anyway; renew it", -left / 86_400, info.not_after),
                        });
                        expired.push(Located {
                            at,
                            message: format!("certificate `{cert}` ({which}) expired at {} (Unix time): the listener's running certificates are all valid and are kept", info.not_after),
                        });
                    } else if left < EXPIRY_WARNING.as_secs() as i64 {
                        warnings.push(Located {
                            at,
                            message: format!(
                                "certificate `{cert}` ({}) expires in {} days ({} hours)",
                                info.name,
                                left / 86_400,
                                left / 3_600
                            ),
                        });
                    }
                    loaded.push((Arc::new(key), info));
                }
                Err(e) => errors.push(Located {
                    at: f.at.clone(),
                    message: e.to_string(),
                }),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        CertSet::from_pairs(loaded).ok_or_else(Vec::new)
    }

    /// Whether no pair has expired at `now`.
    pub fn all_valid(&self, now: SystemTime) -> bool {
        self.infos.iter().all(|i| i.seconds_left(now) > 0)
    }

    /// `None` when `pairs` is empty.
    pub fn from_pairs(pairs: Vec<(Arc<CertifiedKey>, CertInfo)>) -> Option<CertSet> {
        let default = pairs.first()?.0.clone();
        let mut exact = HashMap::new();
        let mut wildcard = HashMap::new();
        for (key, info) in &pairs {
            for n in &info.dns_names {
                match n.strip_prefix("*.") {
                    Some(base) => wildcard.entry(base.to_string()),
                    None => exact.entry(n.clone()),
                }
                .or_insert_with(|| key.clone());
            }
        }
        Some(CertSet {
            default,
            exact,
            wildcard,
            infos: pairs.into_iter().map(|(_, i)| i).collect(),
        })
    }

    /// The pair for an SNI name (RFC 6066 §3: a DNS host name; matched case-insensitively,
    /// exact names before wildcards, RFC 6125 §6.4.3: `*` covers one left-most label).
    pub fn choose(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = sni else {
            return self.default.clone();
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(k) = self.exact.get(&name) {
            return k.clone();
        }
        name.split_once('.')
            .and_then(|(_, parent)| self.wildcard.get(parent))
            .unwrap_or(&self.default)
            .clone()
    }
}

/// Chooses a pair per handshake from whatever set is current.
#[derive(Debug)]
pub struct Resolver {
    current: ArcSwap<CertSet>,
}

impl Resolver {
    pub fn new(set: Arc<CertSet>) -> Resolver {
        Resolver {
            current: ArcSwap::new(set),
        }
    }

    /// New handshakes use `set`; established connections are not touched.
    pub fn swap(&self, set: Arc<CertSet>) {
        self.current.store(set);
    }

    pub fn current(&self) -> Arc<CertSet> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load().choose(hello.server_name()))
    }
}

/// A listener's rustls configuration: ALPN h2, then http/1.1, then http/1.0; versions from
/// `min_version`.
pub fn config(resolver: Arc<Resolver>, min: TlsVersion) -> Result<ServerConfig, rustls::Error> {
    let versions: &[&'static rustls::SupportedProtocolVersion] = match min {
        TlsVersion::V1_2 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsVersion::V1_3 => &[&rustls::version::TLS13],
    };
    let mut cfg = ServerConfig::builder_with_provider(super::provider())
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    // `http/1.0` too (as nginx offers it): a client offering only it would otherwise get a
    // fatal alert, though the same request without ALPN is served.
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), b"http/1.0".to_vec()];
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(names: &[&str]) -> (Arc<CertifiedKey>, CertInfo) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let c = rcgen::generate_simple_self_signed(names.clone()).unwrap();
        let der = c.cert.der().clone();
        let key = rustls::pki_types::PrivateKeyDer::try_from(c.key_pair.serialize_der()).unwrap();
        let ck = CertifiedKey::from_der(vec![der.clone()], key, &crate::tls::provider()).unwrap();
        let info = CertInfo::parse(&der, std::path::Path::new("t.pem")).unwrap();
        (Arc::new(ck), info)
    }

    fn is(a: &Arc<CertifiedKey>, b: &(Arc<CertifiedKey>, CertInfo)) -> bool {
        Arc::ptr_eq(a, &b.0)
    }

    #[test]
    fn sni_chooses_exact_then_wildcard_then_default() {
        let a = pair(&["api.example.com"]);
        let b = pair(&["other.example.net", "*.example.org"]);
        let c = pair(&["www.example.org"]);
        let set = CertSet::from_pairs(vec![a.clone(), b.clone(), c.clone()]).unwrap();
        assert!(is(&set.choose(None), &a), "no SNI: the first pair");
        assert!(is(&set.choose(Some("api.example.com")), &a));
        assert!(
            is(&set.choose(Some("OTHER.example.NET")), &b),
            "case-insensitive"
        );
        assert!(
            is(&set.choose(Some("other.example.net.")), &b),
            "trailing dot"
        );
        assert!(is(&set.choose(Some("x.example.org")), &b), "wildcard");
        assert!(
            is(&set.choose(Some("www.example.org")), &c),
            "exact before wildcard"
        );
        assert!(
            is(&set.choose(Some("a.b.example.org")), &a),
            "* covers one label"
        );
        assert!(is(&set.choose(Some("example.org")), &a), "* needs a label");
        assert!(
            is(&set.choose(Some("unknown.test")), &a),
            "unknown: default"
        );
    }

    #[test]
    fn first_pair_wins_a_shared_name() {
        let a = pair(&["same.test"]);
        let b = pair(&["same.test"]);
        let set = CertSet::from_pairs(vec![a.clone(), b]).unwrap();
        assert!(is(&set.choose(Some("same.test")), &a));
    }

    #[test]
    fn info_names_the_first_dns_name() {
        let (_, info) = pair(&["first.test", "second.test"]);
        assert_eq!(info.name, "first.test");
        assert_eq!(info.dns_names, ["first.test", "second.test"]);
        assert!(info.not_after > 0);
    }
}
