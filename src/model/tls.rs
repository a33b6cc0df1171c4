//! Listeners and TLS settings as plain data: addresses, certificate files, versions. Loading
//! the files (PEM parsing, key checks, expiry) is the `tls` layer's; this is only what the
//! config said, with where it said it, so a file that does not load is reported at its entry.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Where in the config file a setting was written (for errors found after compile, when a
/// certificate is loaded at start or on a reload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub file: String,
    pub line: usize,
    pub col: usize,
}

/// One data-plane listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub address: SocketAddr,
    /// `None`: cleartext HTTP/1.1 and h2c.
    pub tls: Option<ListenerTls>,
    /// Expect a PROXY protocol header (v1 or v2) before anything else on each connection.
    pub proxy_protocol: bool,
}

impl Listener {
    /// What only a restart changes: the socket, whether it speaks TLS and which versions,
    /// and PROXY. The certificate list is swapped live.
    pub fn shape(&self) -> (SocketAddr, Option<TlsVersion>, bool) {
        (
            self.address,
            self.tls.as_ref().map(|t| t.min_version),
            self.proxy_protocol,
        )
    }

    /// The `listener` label of this listener's metrics.
    pub fn label(&self) -> String {
        self.address.to_string()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The first pair is the default; the others are chosen by SNI among their DNS names.
    pub certificates: Vec<CertFiles>,
    pub min_version: TlsVersion,
}

/// A certificate chain and its private key, both PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub at: At,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    V1_2,
    V1_3,
}

/// TLS from the gateway to a server (an upstream target or Redis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// PEM roots to verify the server against; the system's roots when `None`.
    pub ca: Option<PathBuf>,
    /// A client certificate chain and key (mutual TLS), both or neither.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// The name sent as SNI and verified; the target's host when `None`.
    pub server_name: Option<String>,
    /// Accept any server certificate (a warning at every load).
    pub insecure_skip_verify: bool,
    /// The entry that asked for TLS (its `tls` map, or the `https://` / `rediss://` URL).
    pub at: At,
}

impl ClientTls {
    /// TLS with the system roots and no client certificate, asked for at `at`.
    pub fn system_roots(at: At) -> ClientTls {
        ClientTls {
            ca: None,
            client_cert: None,
            client_key: None,
            server_name: None,
            insecure_skip_verify: false,
            at,
        }
    }
}
