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
use super::{Expired, Located, EXPIRY_WARNING};
use crate::model::tls::{CertFiles, TlsVersion};

/// A listener's certificates. A name may have several pairs (an RSA and an ECDSA one, as
/// nginx serves with two `ssl_certificate` lines): a handshake gets the first, in the order
/// written, that the client can use. Without SNI, or for a name none covers, every pair is
/// a candidate, the first being the default.
#[derive(Debug)]
pub struct CertSet {
    all: Vec<Arc<CertifiedKey>>,
    exact: HashMap<String, Vec<Arc<CertifiedKey>>>,
    /// `*.example.com` is stored as `example.com`; it covers exactly one more label.
    wildcard: HashMap<String, Vec<Arc<CertifiedKey>>>,
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
        expired: &mut Vec<Expired>,
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
                        expired.push(Expired {
                            names: info.names().map(str::to_string).collect(),
                            not_after: info.not_after,
                            entry: Located {
                                at,
                                message: format!(
                                    "certificate `{cert}` ({which}) expired at {} (Unix time)",
                                    info.not_after
                                ),
                            },
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

    /// The first of `names` that a pair still valid at `now` serves (by the name itself, or
    /// a wildcard covering it, as [`CertSet::choose`] matches).
    pub fn valid_for<'a>(&self, names: &'a [String], now: SystemTime) -> Option<&'a str> {
        let valid = || self.infos.iter().filter(|i| i.seconds_left(now) > 0);
        names
            .iter()
            .find(|n| valid().any(|i| i.names().any(|m| covers(m, n))))
            .map(String::as_str)
    }

    /// Whether `expired` is one of the pairs running now (same names, same notAfter): it is
    /// served already, and refusing it would block every reload until it is renewed.
    pub fn runs(&self, expired: &Expired) -> bool {
        self.infos.iter().any(|i| {
            i.not_after == expired.not_after
                && i.names().eq(expired.names.iter().map(String::as_str))
        })
    }

    /// `None` when `pairs` is empty.
    pub fn from_pairs(pairs: Vec<(Arc<CertifiedKey>, CertInfo)>) -> Option<CertSet> {
        pairs.first()?;
        let mut exact = HashMap::<_, Vec<_>>::new();
        let mut wildcard = HashMap::<_, Vec<_>>::new();
        for (key, info) in &pairs {
            for n in &info.dns_names {
                match n.strip_prefix("*.") {
                    Some(base) => wildcard.entry(base.to_string()),
                    None => exact.entry(n.clone()),
                }
                .or_default()
                .push(key.clone());
            }
        }
        let (all, infos) = pairs.into_iter().unzip();
        Some(CertSet {
            all,
            exact,
            wildcard,
            infos,
        })
    }

    /// The pair for an SNI name (RFC 6066 §3: a DNS host name; matched case-insensitively,
    /// exact names before wildcards, RFC 6125 §6.4.3: `*` covers one left-most label): the
    /// first of its pairs that `usable` accepts, else its first (the handshake then fails as
    /// it must).
    pub fn choose(
        &self,
        sni: Option<&str>,
        usable: impl Fn(&CertifiedKey) -> bool,
    ) -> Arc<CertifiedKey> {
        let Some(name) = sni else {
            return pick(&self.all, &usable);
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let exact = self.exact.get(&name);
        let wildcard = name
            .split_once('.')
            .and_then(|(_, parent)| self.wildcard.get(parent));
        match (exact, wildcard) {
            // The exact name's pairs, then (none of them usable) the wildcard's.
            (Some(e), Some(w)) if !e.iter().any(|k| usable(k)) => match pick(w, &usable) {
                k if usable(&k) => k,
                _ => e[0].clone(),
            },
            (Some(list), _) | (None, Some(list)) => pick(list, &usable),
            (None, None) => pick(&self.all, &usable),
        }
    }
}

/// The first of `pairs` that `usable` accepts, else the first (the handshake then fails as it
/// must). One pair is taken as it is.
fn pick(pairs: &[Arc<CertifiedKey>], usable: impl Fn(&CertifiedKey) -> bool) -> Arc<CertifiedKey> {
    match pairs {
        [only] => only,
        many => many.iter().find(|k| usable(k)).unwrap_or(&many[0]),
    }
    .clone()
}

/// Whether a certificate name (`api.example.com`, `*.example.com`) covers `name` (lower
/// case): RFC 6125 §6.4.3, `*` stands for one left-most label.
fn covers(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(base) => name
            .split_once('.')
            .is_some_and(|(_, parent)| parent == base),
        None => pattern == name,
    }
}

/// Whether the client can take a handshake signed by `pair`'s key: it offers a signature
/// scheme the key signs with, and a cipher suite for the key's algorithm (every TLS 1.3 suite
/// is; TLS 1.2's name theirs, `ECDHE-ECDSA-…` or `ECDHE-RSA-…`).
fn client_can_use(pair: &CertifiedKey, hello: &ClientHello<'_>) -> bool {
    let algorithm = pair.key.algorithm();
    pair.key.choose_scheme(hello.signature_schemes()).is_some()
        && super::provider().cipher_suites.iter().any(|suite| {
            hello.cipher_suites().contains(&suite.suite())
                && suite.usable_for_signature_algorithm(algorithm)
        })
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
        let set = self.current.load();
        Some(set.choose(hello.server_name(), |pair| client_can_use(pair, &hello)))
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
        let choose = |sni| set.choose(sni, |_| true);
        assert!(is(&choose(None), &a), "no SNI: the first pair");
        assert!(is(&choose(Some("api.example.com")), &a));
        assert!(
            is(&choose(Some("OTHER.example.NET")), &b),
            "case-insensitive"
        );
        assert!(is(&choose(Some("other.example.net.")), &b), "trailing dot");
        assert!(is(&choose(Some("x.example.org")), &b), "wildcard");
        assert!(
            is(&choose(Some("www.example.org")), &c),
            "exact before wildcard"
        );
        assert!(
            is(&choose(Some("a.b.example.org")), &a),
            "* covers one label"
        );
        assert!(is(&choose(Some("example.org")), &a), "* needs a label");
        assert!(is(&choose(Some("unknown.test")), &a), "unknown: default");
    }

    /// A shared name (an RSA and an ECDSA pair): the first the client can use, else the
    /// first. Without SNI, every pair is a candidate.
    #[test]
    fn a_shared_name_goes_to_the_first_pair_the_client_can_use() {
        let a = pair(&["same.test"]);
        let b = pair(&["same.test"]);
        let c = pair(&["other.test"]);
        let set = CertSet::from_pairs(vec![a.clone(), b.clone(), c.clone()]).unwrap();
        let same = Some("same.test");
        assert!(is(&set.choose(same, |_| true), &a));
        assert!(is(&set.choose(same, |k| std::ptr::eq(&*b.0, k)), &b));
        assert!(is(&set.choose(same, |_| false), &a), "none fits: the first");
        assert!(
            is(&set.choose(same, |k| std::ptr::eq(&*c.0, k)), &a),
            "only the name's pairs"
        );
        assert!(is(&set.choose(None, |k| std::ptr::eq(&*c.0, k)), &c));
        assert!(is(
            &set.choose(Some("x.test"), |k| std::ptr::eq(&*b.0, k)),
            &b
        ));
        // An exact name none of whose pairs fit falls back to a wildcard pair that does.
        let w = pair(&["*.test"]);
        let set = CertSet::from_pairs(vec![a.clone(), w.clone()]).unwrap();
        let only_w = |k: &CertifiedKey| std::ptr::eq(&*w.0, k);
        assert!(is(&set.choose(same, only_w), &w));
        assert!(
            is(&set.choose(same, |_| false), &a),
            "none fits: the exact one"
        );
        assert!(is(&set.choose(same, |_| true), &a), "exact first");
    }

    /// The reload guard's "a valid pair serves this name" matches as `choose` does: an
    /// exact name, or a wildcard covering one label.
    #[test]
    fn a_wildcard_serves_the_names_it_covers() {
        assert!(covers("*.example.com", "www.example.com"));
        assert!(!covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(covers("api.example.com", "api.example.com"));
        let set = CertSet::from_pairs(vec![pair(&["*.example.com"])]).unwrap();
        let names = ["www.example.com".to_string()];
        #[allow(clippy::disallowed_methods)] // the pair is valid from now for a while
        let now = SystemTime::now();
        assert_eq!(set.valid_for(&names, now), Some("www.example.com"));
        assert_eq!(set.valid_for(&["other.test".to_string()], now), None);
    }

    #[test]
    fn info_names_the_first_dns_name() {
        let (_, info) = pair(&["first.test", "second.test"]);
        assert_eq!(info.name, "first.test");
        assert_eq!(info.dns_names, ["first.test", "second.test"]);
        assert!(info.not_after > 0);
    }
}
