//! The running process: boot (`app`), listeners (`server`, with `proxy_protocol` ahead of
//! TLS), and live reload (`reload`, certificates included).

pub mod app;
mod fd_limit;
mod idle;
mod preface;
pub mod proxy_protocol;
pub mod reload;
pub mod server;
pub mod spread;
mod stall;

use std::path::PathBuf;
use std::sync::Arc;

use crate::model::table::Boot;
use crate::pipeline::Gateway;
use crate::tls::server::{CertSet, Resolver};

/// The running process around the request pipeline: the gateway every listener serves, and
/// what live reload needs (the config file and what was last seen of it).
pub struct Runtime {
    pub gateway: Arc<Gateway>,
    /// What only a restart changes, as running.
    pub boot: Boot,
    pub config_path: PathBuf,
    /// Reloads run one at a time.
    reload_lock: parking_lot::Mutex<()>,
    /// The config content and the files it reads as last seen (file events that change
    /// neither are not reloads).
    last_seen: parking_lot::Mutex<reload::Seen>,
    /// By index of `boot.listeners`: what new TLS handshakes are served (`None`: cleartext).
    pub certificates: Vec<Option<Arc<Resolver>>>,
    /// The file watcher, kept here so reloads can add certificate directories to it.
    watcher: parking_lot::Mutex<Option<notify::RecommendedWatcher>>,
}

impl Runtime {
    /// `certificates`: the loaded set of each listener of `boot` (`None` for cleartext).
    pub fn new(
        gateway: Gateway,
        boot: Boot,
        config_path: PathBuf,
        certificates: Vec<Option<Arc<CertSet>>>,
    ) -> Runtime {
        let last_seen = reload::Seen::of(&config_path, &gateway.live.load().file);
        let rt = Runtime {
            watcher: Default::default(),
            gateway: Arc::new(gateway),
            certificates: certificates
                .into_iter()
                .map(|c| c.map(|set| Arc::new(Resolver::new(set))))
                .collect(),
            boot,
            config_path,
            reload_lock: Default::default(),
            last_seen: parking_lot::Mutex::new(last_seen),
        };
        rt.publish_certificates();
        rt
    }

    /// Set `sluice_tls_certificate_expiry_timestamp_seconds` to what the listeners serve.
    fn publish_certificates(&self) {
        let mut certs = Vec::new();
        for (l, r) in self.boot.listeners.iter().zip(&self.certificates) {
            if let Some(r) = r {
                for info in &r.current().infos {
                    certs.push((l.label(), info.name.clone(), info.not_after));
                }
            }
        }
        self.metrics.set_certificates(&certs);
    }
}

impl std::ops::Deref for Runtime {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}
