//! The running process: boot (`app`), listeners (`server`), and live reload (`reload`).

pub mod app;
pub mod proxy_protocol;
pub mod reload;
pub mod server;

use std::path::PathBuf;
use std::sync::Arc;

use crate::model::table::Boot;
use crate::pipeline::Gateway;

/// The running process around the request pipeline: the gateway every listener serves, and
/// what live reload needs (the config file and what was last seen of it).
pub struct Runtime {
    pub gateway: Arc<Gateway>,
    /// What only a restart changes, as running.
    pub boot: Boot,
    pub config_path: PathBuf,
    /// Reloads run one at a time.
    reload_lock: parking_lot::Mutex<()>,
    /// Hash of the config content last seen by a file event (to ignore no-op events).
    last_seen: parking_lot::Mutex<String>,
}

impl Runtime {
    pub fn new(gateway: Gateway, boot: Boot, config_path: PathBuf) -> Runtime {
        let last_seen = std::fs::read_to_string(&config_path)
            .map(|t| crate::config::version_of(&t))
            .unwrap_or_default();
        Runtime {
            gateway: Arc::new(gateway),
            boot,
            config_path,
            reload_lock: Default::default(),
            last_seen: parking_lot::Mutex::new(last_seen),
        }
    }
}

impl std::ops::Deref for Runtime {
    type Target = Gateway;
    fn deref(&self) -> &Gateway {
        &self.gateway
    }
}
