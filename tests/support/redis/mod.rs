//! Real Redis servers for tests: a standalone server, a three-primary cluster and a
//! master watched by one sentinel, each on free loopback ports with its files in a
//! tempdir, plus a minimal synchronous RESP2 client ([`Conn`]) to drive and inspect them.
//!
//! Everything here is blocking std code so it works from plain and `#[tokio::test]` tests.
//! A missing binary panics with how to install it: a Redis test never skips silently.
//!
//! - `resp`: the RESP2 client ([`Resp`], [`Conn`]) and [`info_field`].
//! - `process`: waiting for, capturing and killing server and sentinel processes.
//! - `server`: a standalone [`RedisServer`].
//! - `cluster`: key slots ([`key_slot`]) and a three-primary [`RedisCluster`].
//! - `sentinel`: a master plus one sentinel ([`Sentinel`]).
//! - `relay`: a TCP relay whose connections can go silent without closing ([`SilentRelay`]).
//!
//! The public names are re-exported here, so tests write `support::redis::{Conn, ...}`.

mod cluster;
mod process;
mod relay;
mod resp;
mod sentinel;
mod server;

use std::sync::OnceLock;

// Every test crate uses its own subset of these.
#[allow(unused_imports)]
pub use cluster::{crc16, key_slot, RedisCluster};
#[allow(unused_imports)]
pub use relay::SilentRelay;
#[allow(unused_imports)]
pub use resp::{info_field, Conn, Resp};
#[allow(unused_imports)]
pub use sentinel::Sentinel;
#[allow(unused_imports)]
pub use server::RedisServer;

const INSTALL_HINT: &str = "install it with `apt-get install -y redis-server redis-tools redis-sentinel` (or run ./scripts/test.sh, which does)";

/// Path of `redis-server` on PATH; panics with install instructions when absent.
pub fn redis_server_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| find_bin("redis-server"))
}

/// Path of `redis-sentinel` on PATH; panics with install instructions when absent.
pub fn redis_sentinel_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| find_bin("redis-sentinel"))
}

fn find_bin(name: &str) -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("{name} not found: {INSTALL_HINT}"))
}
