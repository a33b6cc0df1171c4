//! The Redis store: every request's limits in one call of the script in `lua/` (FCALL of a
//! library of Redis Functions, or EVALSHA where Redis refuses those: see [`scripts`]), decided
//! atomically at Redis's own clock, through a pooled, pipelining fred client. On standalone
//! and Sentinel, requests that arrive while a call is in flight share the next call
//! ([`batch`]): Redis pays its per-call cost once per batch.
//!
//! Each worker has a lane of its own: its share of the `pool_size` connections (rounded
//! up, at least one), whose tasks run on its runtime, and its own batch queue. A request, its
//! batch's call and the reply then stay on the worker's thread, as its upstream I/O does;
//! through one shared pool, a second worker's calls went through the first worker's thread
//! and back, each hand-over a cross-thread wake-up (an `eventfd` write and the other thread's
//! return from `epoll_wait`).
//!
//! What keeps it honest when Redis misbehaves:
//! - a decision is sent at most once: `max_command_attempts = 1`, and `fail_fast` so nothing
//!   queues behind a reconnect (a re-sent decision after a dropped connection would charge
//!   twice);
//! - every call is bounded by `timeout` (fred's per-command option, and ours around the
//!   whole decision: both Cluster rounds and a NOSCRIPT retry);
//! - after `FUNCTION FLUSH` or a restart without persistence, FCALL answers that the function
//!   does not exist, and after `SCRIPT FLUSH`, a restart or a failover EVALSHA answers
//!   NOSCRIPT: nothing ran, so the library is loaded again and the same call sent once more
//!   (as EVAL for a script, which also caches it again);
//! - a [`Breaker`] fails fast while Redis keeps failing and probes it twice a second;
//! - connections whose calls time out while it is open are dropped and opened again
//!   (`Lane::record`): a peer that vanished without a reset leaves them open for minutes.
//!
//! On Redis Cluster a call is routed by its declared keys, which must share one slot. Each
//! key's hash tag is the hash of its identity, so the limits of one request on the same
//! identity share a slot and are decided together. Such requests are batched per node: one
//! call per node carries the requests whose slots it serves, their keys in ARGV (the script's
//! `allow-cross-slot-keys` flag lets it touch several slots of its node; a key of another
//! node is an error for that request alone, raised before it charged anything; the slot map
//! is read again and such requests are sent once more). Limits on different identities live
//! on different slots. Those are decided in two steps: a dry run of every slot (nothing is
//! charged if any enforced limit refuses), then a charge per slot. All-or-nothing thus holds
//! within a slot, and across slots except when another request takes the last unit between
//! the two steps: then the slots that still admitted are charged for a refused request (never
//! the reverse: nothing is admitted past a limit).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fred::prelude::*;
use fred::types::config::Server;
use fred::types::config::{ClusterDiscoveryPolicy, Options, ReconnectPolicy, ServerConfig};
use fred::types::config::{TlsConfig, TlsConnector, TlsHostMapping};
use fred::types::{ClusterHash, CustomCommand};
use futures_util::future::{join_all, try_join_all};

use super::batch::{self, Job};
use super::breaker::{Breaker, PROBE_EVERY};
use super::sentinel;
use super::{scripts, LimitCall, Peek, StoreError};
use crate::limiter::algo::{Algorithm, Decision, Op};
use crate::model::policy::RedisMode;
use crate::model::table::RedisSettings;

pub struct RedisStore {
    /// By worker (`crate::worker`): the first worker's is made with the store, the others'
    /// by [`RedisStore::attach_worker`] on their own runtimes.
    lanes: Box<[OnceLock<Lane>]>,
    /// What another worker's lane is built from.
    cfg: Config,
    lane_size: usize,
    opts: Options,
    timeout: Duration,
    cluster: bool,
    /// The library calls name (FCALL), loaded on every primary at startup and wherever a call
    /// finds it missing.
    library: scripts::Library,
    /// Whether calls go through the library: cleared for good when Redis refuses FUNCTION LOAD
    /// or FCALL (an ACL granting EVALSHA alone); calls are then EVALSHAs of the script.
    functions: AtomicBool,
    /// SHA-1 of the script, for EVALSHA.
    sha: String,
    /// Per-process random prefix of call nonces (+ the call id): unique sliding_log members
    /// and concurrency leases across gateways.
    nonce_prefix: String,
}

/// One worker's connections to Redis and its requests waiting for a script call. A request
/// resolves its worker's lane once ([`RedisStore::lane`]) and every step of its decision
/// (breaker, queue, sender, connection) uses that one.
struct Lane {
    /// Its place in [`RedisStore::lanes`] (the sender task it spawns finds it there).
    index: usize,
    pool: Pool,
    /// Requests waiting for the next script call (on Cluster, those whose keys share a slot).
    queue: batch::Queue,
    /// Whether any of its connections has ever been up (see [`RedisStore::client`]).
    ever_connected: AtomicBool,
    /// Its own: a worker whose connections fail must not open the breaker for workers whose
    /// connections answer, nor their successes keep its failures from opening it.
    breaker: Breaker,
    /// The last error a connection of the lane reported (a refused password, a refused
    /// connection, a TLS failure): what "not connected" is told with, so that an operator is
    /// pointed at the credentials rather than the network.
    last_error: Arc<parking_lot::Mutex<Option<String>>>,
    /// When its connections were last dropped and opened again for timing out, and when an
    /// error reply was last logged (see [`Lane::record`]).
    recycled: parking_lot::Mutex<Option<Instant>>,
    script_error_logged: parking_lot::Mutex<Option<Instant>>,
}

/// How often a lane logs that Redis answers its calls with errors, at most.
const SCRIPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// True at most once per `every`, as recorded in `last`.
fn once_per(last: &parking_lot::Mutex<Option<Instant>>, every: Duration) -> bool {
    let mut last = last.lock();
    if last.is_some_and(|t| t.elapsed() < every) {
        return false;
    }
    *last = Some(Instant::now());
    true
}

impl Lane {
    /// `size` connections (fred's pool, its tasks spawned on the current runtime) and a queue
    /// with as many senders; starts connecting in the background.
    fn connect(index: usize, cfg: Config, timeout: Duration, size: usize) -> Result<Lane, Error> {
        let pool = Builder::from_config(cfg)
            .with_connection_config(|c| {
                c.max_command_attempts = 1;
                c.connection_timeout = timeout.max(Duration::from_millis(500));
                c.internal_command_timeout = Duration::from_secs(2);
                c.tcp.nodelay = Some(true);
            })
            // Unlimited attempts, every 100 ms: back within the 2 s recovery budget.
            .set_policy(ReconnectPolicy::new_constant(0, 100))
            .build_pool(size)?;
        let last_error = Arc::new(parking_lot::Mutex::new(None));
        for client in pool.clients() {
            let last = last_error.clone();
            client.on_error(move |(e, _)| {
                *last.lock() = Some(e.to_string());
                async { Ok(()) }
            });
        }
        pool.connect();
        Ok(Lane {
            index,
            pool,
            queue: batch::Queue::new(size),
            ever_connected: AtomicBool::new(false),
            breaker: Breaker::default(),
            last_error,
            recycled: parking_lot::Mutex::new(None),
            script_error_logged: parking_lot::Mutex::new(None),
        })
    }

    /// Tell the breaker how a call went. A call that timed out while the breaker is open (the
    /// run that opened it, or a probe) also drops the lane's connections and opens new ones,
    /// at most once per [`PROBE_EVERY`]: a connection whose peer vanished without a reset (a
    /// failover behind a virtual IP, a NAT or firewall entry dropped) stays connected until the
    /// kernel gives up retransmitting, about 15 minutes, and every probe sent down it would
    /// time out too, while a new connection answers at once. Nothing is sent twice: what was
    /// in flight on the old connections had already timed out, and fred retries no command
    /// (one attempt each).
    ///
    /// An error reply (out of memory under `noeviction`, `READONLY` from a demoted primary, an
    /// ACL refusal) keeps the breaker closed, since Redis answered, but every decision it
    /// fails follows `on_error`: it is logged, at most once per [`SCRIPT_ERROR_LOG_EVERY`],
    /// so that the cause is named somewhere besides a metric.
    fn record(&self, r: &Result<(), StoreError>) {
        self.breaker.record(r);
        match r {
            Err(StoreError::Timeout) if self.breaker.is_open() => {}
            Err(StoreError::Script(e)) => {
                if once_per(&self.script_error_logged, SCRIPT_ERROR_LOG_EVERY) {
                    tracing::warn!(error = %e, "redis answers decisions with an error; they follow on_error");
                }
                return;
            }
            _ => return,
        }
        if !once_per(&self.recycled, PROBE_EVERY) {
            return;
        }
        tracing::warn!(
            "store calls time out on open connections: dropping them and connecting again"
        );
        self.reconnect();
    }

    /// Drop this lane's connections and open new ones, in the background. What was in flight
    /// fails; nothing is sent twice (fred retries no command).
    fn reconnect(&self) {
        let pool = self.pool.clone();
        tokio::spawn(async move {
            if let Err(e) = pool.force_reconnection().await {
                tracing::debug!(error = %e, "reconnecting to redis failed; fred keeps trying");
            }
        });
    }

    /// Why it is not connected, with the last error its connections reported.
    fn not_connected(&self, what: &str) -> StoreError {
        StoreError::Connection(match &*self.last_error.lock() {
            Some(e) => format!("{what} (last error: {e})"),
            None => what.to_owned(),
        })
    }
}

/// Build fred's config from ours (URL, mode, seeds, password).
fn fred_config(s: &RedisSettings) -> Result<Config, Error> {
    let node = |n: &String| -> Result<Server, Error> {
        let (h, p) = n.rsplit_once(':').unwrap_or((n, "6379"));
        let port = p
            .parse()
            .map_err(|_| Error::new(ErrorKind::Config, format!("bad node `{n}`")))?;
        Ok(Server::new(h, port))
    };
    let seeds = s.nodes.iter().map(node).collect::<Result<Vec<_>, _>>()?;
    let mut cfg = match (s.mode, &s.url) {
        (RedisMode::Standalone, Some(url)) => Config::from_url_centralized(url)?,
        (RedisMode::Standalone, None) => {
            return Err(Error::new(ErrorKind::Config, "standalone mode needs a url"))
        }
        (RedisMode::Cluster, url) => {
            let mut cfg = match url {
                Some(url) => Config::from_url_clustered(url)?,
                None => Config::default(),
            };
            let mut hosts = match cfg.server {
                ServerConfig::Clustered { hosts, .. } => hosts,
                _ => Vec::new(),
            };
            hosts.extend(seeds);
            cfg.server = ServerConfig::Clustered {
                hosts,
                policy: ClusterDiscoveryPolicy::default(),
            };
            cfg
        }
        (RedisMode::Sentinel, url) => {
            // The url (optional) carries the database, credentials and TLS of the primary.
            let mut cfg = match url {
                Some(url) => Config::from_url_centralized(url)?,
                None => Config::default(),
            };
            cfg.server = ServerConfig::Sentinel {
                hosts: seeds,
                service_name: s.sentinel_service.clone().unwrap_or_default(),
                username: None,
                password: None,
            };
            cfg
        }
    };
    if let Some(pw) = &s.password {
        cfg.password = Some(pw.clone());
    }
    // Keep reconnecting in the background when Redis is down at startup: serve per policy.
    cfg.fail_fast = false;
    Ok(cfg)
}

/// Whether fred accepts these settings (a URL it cannot parse, say). Config loading calls it,
/// so `sluice check` reports such a URL at its line instead of the gateway finding out when it
/// creates the client.
pub fn validate(s: &RedisSettings) -> Result<(), String> {
    fred_config(s)
        .map(|_| ())
        .map_err(|e| e.details().to_string())
}

/// Map a fred error to the store error the policy and metrics see.
fn store_error(e: &Error) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::Timeout,
        // A redirection is Redis answering (a slot moved, or a standalone client on a Cluster
        // node): the connection is fine, and must not open the breaker for other keys.
        ErrorKind::Cluster if is_redirection(e.details()) => StoreError::Script(e.to_string()),
        ErrorKind::IO
        | ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Sentinel
        | ErrorKind::Auth
        | ErrorKind::Backpressure
        | ErrorKind::Tls
        | ErrorKind::Config
        | ErrorKind::Url => StoreError::Connection(e.to_string()),
        // fred reports some transport failures with the same kind as a Redis error reply;
        // counting them as script errors would tell the breaker that a dead Redis answered.
        ErrorKind::Unknown if CLIENT_SIDE_FAILURES.contains(&e.details()) => {
            StoreError::Connection(e.to_string())
        }
        _ => StoreError::Script(e.to_string()),
    }
}

/// `MOVED slot host:port` or `ASK slot host:port`, as Redis Cluster sends them.
fn is_redirection(details: &str) -> bool {
    details.starts_with("MOVED ") || details.starts_with("ASK ")
}

/// fred's own messages (fred 10.1 `router/commands.rs`, `protocol/command.rs`,
/// `protocol/connection.rs`) for a command that never got a reply from Redis.
const CLIENT_SIDE_FAILURES: [&str; 4] = [
    "Failed to route command.",
    "Too many failed write attempts.",
    "Missing response.",
    "Max attempts exceeded",
];

/// What Redis Cluster answers a script touching a key of another node's slot.
const NOT_THIS_NODE: &str = "non local key";
/// What a replica answers a script that writes: after a failover (a graceful `CLUSTER
/// FAILOVER` keeps the old primary up, as a replica), calls routed by a stale slot map reach
/// it. Batched calls declare no keys, so Redis cannot redirect them with `MOVED`.
const DEMOTED: &str = "READONLY";

/// Whether a Cluster node refused a call before running any of it because the slot map the
/// call was routed by is stale: read the map again and send it once more.
fn stale_route(answer: &Result<Vec<Decision>, StoreError>) -> bool {
    matches!(answer, Err(StoreError::Script(e)) if e.contains(NOT_THIS_NODE) || e.contains(DEMOTED))
}

/// The slot all of `calls`' keys hash to, if they share one.
fn one_slot(calls: &[LimitCall]) -> Option<u16> {
    let mut slots = calls
        .iter()
        .map(|c| fred::util::redis_keyslot(c.key.as_bytes()));
    let first = slots.next()?;
    slots.all(|s| s == first).then_some(first)
}

fn is_noscript(e: &Error) -> bool {
    e.details().starts_with("NOSCRIPT")
}

/// FCALL of a function Redis does not have (a flush, or a restart without persistence).
fn is_no_function(e: &Error) -> bool {
    e.details().starts_with("ERR Function not found")
}

/// Redis will not run functions for this client: an ACL without FUNCTION LOAD or FCALL, or a
/// server without them. Nothing ran.
fn functions_refused(e: &Error) -> bool {
    let d = e.details();
    // Not a key the ACL denies ("NOPERM … access one of the keys"): that reply may come from
    // inside the script, after it wrote.
    (d.starts_with("NOPERM") && d.contains("command"))
        || d.contains("unknown command")
        || d.contains("unknown subcommand")
}

impl RedisStore {
    /// Create the pool and start connecting in the background; never waits for Redis (a
    /// gateway whose Redis is down still starts, and serves per `on_error`).
    /// `tls`: the loaded client configuration for `rediss://` (or `store.redis.tls`).
    pub fn connect(
        s: &RedisSettings,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<RedisStore, StoreError> {
        Self::connect_for(s, tls, 1)
    }

    /// [`RedisStore::connect`] for a gateway of `workers` workers: the calling (first)
    /// worker's lane now, the others' when they start ([`RedisStore::attach_worker`]).
    pub fn connect_for(
        s: &RedisSettings,
        tls: Option<Arc<rustls::ClientConfig>>,
        workers: usize,
    ) -> Result<RedisStore, StoreError> {
        let mut cfg = fred_config(s).map_err(|e| StoreError::Connection(e.to_string()))?;
        if let ServerConfig::Sentinel { hosts, .. } = &mut cfg.server {
            sentinel::answering_first(hosts, sentinel::PROBE);
        }
        if let Some(tls) = tls {
            // Ours rather than fred's default for `rediss://`: the configured CA and client
            // certificate, the same ring provider as everywhere else.
            cfg.tls = Some(TlsConfig {
                connector: TlsConnector::from((*tls).clone()),
                hostnames: TlsHostMapping::None,
            });
        }
        let workers = workers.max(1);
        let lane_size = s.pool_size.max(1).div_ceil(workers);
        let first = Lane::connect(0, cfg.clone(), s.timeout, lane_size)
            .map_err(|e| StoreError::Connection(e.to_string()))?;
        let lanes: Box<[OnceLock<Lane>]> = (0..workers).map(|_| OnceLock::new()).collect();
        let _ = lanes[0].set(first);
        let random = {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(std::process::id())
        };
        Ok(RedisStore {
            lanes,
            cfg,
            lane_size,
            opts: Options {
                max_attempts: Some(1),
                timeout: Some(s.timeout),
                fail_fast: true,
                ..Default::default()
            },
            timeout: s.timeout,
            cluster: s.mode == RedisMode::Cluster,
            library: scripts::Library::new(),
            functions: AtomicBool::new(true),
            sha: scripts::sha1_hex(scripts::SCRIPT),
            nonce_prefix: format!("{random:016x}"),
        })
    }

    /// Give the calling worker (`crate::worker`) its lane: its connections' tasks on the
    /// calling runtime, connecting in the background. Each worker but the first calls this
    /// before the store is waited for ([`RedisStore::wait_connected`] covers every attached
    /// lane), so no worker serves while its own connections are still being set up.
    pub fn attach_worker(&self) {
        let index = crate::worker::index();
        let Some(slot) = self.lanes.get(index).filter(|l| l.get().is_none()) else {
            return;
        };
        match Lane::connect(index, self.cfg.clone(), self.timeout, self.lane_size) {
            Ok(lane) => {
                let _ = slot.set(lane);
            }
            // Built from the settings the first lane was built from, so not expected; this
            // worker's requests then share the first worker's lane.
            Err(e) => tracing::error!(
                worker = crate::worker::number(index),
                error = %e,
                "cannot create this worker's Redis connections; sharing the first worker's"
            ),
        }
    }

    /// Sentinel mode: follow `+switch-master` (see `store/sentinel.rs`) on the calling runtime
    /// while this store lives. Not with TLS: the events are read in plain text.
    pub fn follow_failovers(self: &Arc<Self>) {
        let ServerConfig::Sentinel {
            hosts,
            service_name,
            ..
        } = &self.cfg.server
        else {
            return;
        };
        if self.cfg.tls.is_some() {
            return;
        }
        let sentinels = hosts.iter().map(|h| (h.host.to_string(), h.port)).collect();
        let (store, service) = (Arc::downgrade(self), service_name.clone());
        tokio::spawn(sentinel::follow(store, sentinels, service));
    }

    /// Drop every worker's connections and open new ones (in Sentinel mode, to the primary
    /// the sentinels name now). What was in flight fails, under `on_error`; nothing is sent
    /// twice.
    pub(super) fn reconnect_all(&self) {
        for lane in self.lanes.iter().filter_map(OnceLock::get) {
            lane.reconnect();
        }
    }

    /// Whether any connection that is up is to another server than `primary` (`host`, port).
    pub(super) fn connected_elsewhere(&self, primary: &(String, u16)) -> bool {
        self.lanes.iter().filter_map(OnceLock::get).any(|lane| {
            lane.pool
                .active_connections()
                .iter()
                .any(|s| (&*s.host, s.port) != (primary.0.as_str(), primary.1))
        })
    }

    fn first(&self) -> &Lane {
        self.lanes[0].get().expect("made with the store")
    }

    /// The calling worker's lane; the first worker's on any other thread, and for a worker
    /// not (yet) attached. Resolved once per store operation and passed down.
    fn lane(&self) -> &Lane {
        match self
            .lanes
            .get(crate::worker::index())
            .and_then(OnceLock::get)
        {
            Some(lane) => lane,
            None => self.first(),
        }
    }

    /// The lane a sender was spawned for (`Lane::index` of one [`RedisStore::lane`] handed out).
    fn lane_at(&self, index: usize) -> &Lane {
        self.lanes[index]
            .get()
            .expect("a lane handed out is set for good")
    }

    /// Wait (up to `within`) until every connection of every attached worker's lane is up and
    /// the library (or, where Redis refuses functions, the script) is loaded: startup waits
    /// for this before opening the data listener, and so does `sluice check --connect`.
    pub async fn wait_connected(&self, within: Duration) -> Result<(), StoreError> {
        let every_lane = async {
            for lane in self.lanes.iter().filter_map(OnceLock::get) {
                lane.pool.wait_for_connect().await?;
            }
            Ok::<(), Error>(())
        };
        match tokio::time::timeout(within, every_lane).await {
            Ok(Ok(())) => match tokio::time::timeout(within, self.load_up_front()).await {
                Ok(Ok(())) => {
                    self.ping().await?;
                    self.not_a_cluster_node().await
                }
                Ok(Err(e)) => Err(store_error(&e)),
                Err(_) => Err(StoreError::Timeout),
            },
            Ok(Err(e)) => Err(store_error(&e)),
            Err(_) => Err(self
                .first()
                .not_connected(&format!("no connection within {within:?}"))),
        }
    }

    /// `mode: standalone` pointed at a Redis Cluster node: it would answer `MOVED` for every
    /// key of another node's slots, and the gateway would limit only some clients. Said at
    /// start (and by `sluice check --connect`), not found out per request.
    async fn not_a_cluster_node(&self) -> Result<(), StoreError> {
        if !matches!(self.cfg.server, ServerConfig::Centralized { .. }) {
            return Ok(());
        }
        let info = CustomCommand::new_static("INFO", ClusterHash::FirstKey, false);
        let client = self.first().pool.next().with_options(&self.opts);
        let info = match client.custom::<String, _>(info, vec!["cluster"]).await {
            Ok(info) => info,
            // An ACL that grants only the commands decisions need (NOPERM): not known to be
            // a Cluster node, and nothing to hold the start up for.
            Err(e) if matches!(store_error(&e), StoreError::Script(_)) => return Ok(()),
            Err(e) => return Err(store_error(&e)),
        };
        if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
            return Err(StoreError::Connection(
                "this Redis is a Cluster node (cluster_enabled:1): set `mode: cluster` and list its nodes".into(),
            ));
        }
        Ok(())
    }

    /// Load the library (on every primary of a cluster), so the first requests need not each
    /// find it missing; where Redis refuses functions, the script for EVALSHA instead.
    async fn load_up_front(&self) -> Result<(), Error> {
        let client = self.first().pool.next();
        if self.functions.load(Ordering::Acquire) {
            match client
                .function_load_cluster::<String, _>(true, self.library.code.as_str())
                .await
            {
                Err(e) if functions_refused(&e) => self.without_functions(&e),
                other => return other.map(drop),
            }
        }
        client
            .script_load_cluster::<String, _>(scripts::SCRIPT)
            .await
            .map(drop)
    }

    /// From now on, call the script with EVALSHA: Redis refused functions (`e`).
    fn without_functions(&self, e: &Error) {
        if self.functions.swap(false, Ordering::AcqRel) {
            tracing::warn!(error = %e, "redis refuses FUNCTION LOAD or FCALL: deciding with EVALSHA of the script instead (grant them for less Redis CPU per decision)");
        }
    }

    /// A connected client of `lane`, or a connection error right away. A
    /// command handed to a client that is still (re)connecting would be queued and sent once
    /// it connects, long after its request was answered by the policy: a late charge for a
    /// request that was never decided. Not sending it at all is the only safe choice.
    ///
    /// The one exception is a lane that has never been connected since the process started,
    /// and whose connections have not failed yet: nothing was ever sent on it, so nothing can
    /// be sent twice, and waiting for it (bounded by the caller's `timeout`) lets the first
    /// requests after a start be decided by Redis instead of by `on_error`. Once a connection
    /// attempt failed (Redis down, a wrong password), waiting would only turn its reason into
    /// a timeout.
    async fn client(&self, lane: &Lane) -> Result<fred::clients::WithOptions<Client>, StoreError> {
        let mut client = lane.pool.next_connected();
        if !client.is_connected()
            && !lane.ever_connected.load(Ordering::Acquire)
            && lane.last_error.lock().is_none()
        {
            let _ = lane.pool.wait_for_connect().await;
            client = lane.pool.next_connected();
        }
        if !client.is_connected() {
            return Err(lane.not_connected("not connected to redis"));
        }
        lane.ever_connected.store(true, Ordering::Release);
        Ok(client.with_options(&self.opts))
    }

    fn nonce(&self, id: u64) -> String {
        format!("{}{id:x}", self.nonce_prefix)
    }

    /// One request's script call (keys all in one slot), through [`RedisStore::script`].
    async fn eval(
        &self,
        lane: &Lane,
        calls: &[LimitCall],
        commit: bool,
        id: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        let nonce = self.nonce(id);
        let client = self.client(lane).await?;
        let slot = calls.first().map_or(0, |c| self.slot_of(&c.key));
        let args = || {
            let mut args: Vec<String> = calls.iter().map(|c| c.key.clone()).collect();
            args.extend(scripts::argv(&nonce, commit, calls));
            args
        };
        let reply: Vec<i64> = self.script(&client, slot, calls.len(), args).await?;
        scripts::decisions(&reply, calls.len()).map_err(StoreError::Script)
    }

    /// Cluster: the hash slot of `key` (what a call declaring it is routed by); 0 elsewhere.
    fn slot_of(&self, key: &str) -> u16 {
        if self.cluster {
            fred::util::redis_keyslot(key.as_bytes())
        } else {
            0
        }
    }

    /// One call of the script: `args` are its KEYS (the first `declared` of them) and its
    /// ARGV. Sent with `custom`, routed by `slot` on Cluster, so that `client`'s per-command
    /// options (timeout, `fail_fast`) apply: fred 10.1's `fcall` and `evalsha` do not take
    /// them from `WithOptions`. An FCALL of a missing function did not run: the library is
    /// loaded on that node and the call sent once more. So is an FCALL Redis refuses, as an
    /// EVALSHA. NOSCRIPT did not run either: the call is sent once more as EVAL, which also
    /// caches the script again.
    async fn script<R: FromValue>(
        &self,
        client: &fred::clients::WithOptions<Client>,
        slot: u16,
        declared: usize,
        args: impl Fn() -> Vec<String>,
    ) -> Result<R, StoreError> {
        let on_slot =
            |cmd: &'static str| CustomCommand::new_static(cmd, ClusterHash::Custom(slot), false);
        let call = |cmd: &'static str, first: &str| {
            let mut all = vec![first.to_owned(), declared.to_string()];
            all.extend(args());
            client.custom::<R, _>(on_slot(cmd), all)
        };
        if self.functions.load(Ordering::Acquire) {
            let fcall = || call("FCALL", &self.library.name);
            let refused = match fcall().await {
                Err(e) if is_no_function(&e) => {
                    let load = ["LOAD", "REPLACE", self.library.code.as_str()];
                    match client
                        .custom::<String, _>(on_slot("FUNCTION"), load.to_vec())
                        .await
                    {
                        Ok(_) => return fcall().await.map_err(|e| store_error(&e)),
                        Err(e) if functions_refused(&e) => e,
                        Err(e) => return Err(store_error(&e)),
                    }
                }
                Err(e) if functions_refused(&e) => e,
                other => return other.map_err(|e| store_error(&e)),
            };
            self.without_functions(&refused);
        }
        match call("EVALSHA", &self.sha).await {
            Err(e) if is_noscript(&e) => call("EVAL", scripts::SCRIPT).await,
            other => other,
        }
        .map_err(|e| store_error(&e))
    }

    /// Redis Cluster, a request whose keys span slots: a dry run of every slot, then a charge
    /// per slot (see the module doc). Requests on one slot are queued instead.
    async fn decide_across_slots(
        &self,
        lane: &Lane,
        calls: &[LimitCall],
        id: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        // Group the calls by hash slot, remembering each call's position.
        let mut slots: BTreeMap<u16, (Vec<LimitCall>, Vec<usize>)> = BTreeMap::new();
        for (i, c) in calls.iter().enumerate() {
            let g = slots
                .entry(fred::util::redis_keyslot(c.key.as_bytes()))
                .or_default();
            g.0.push(c.clone());
            g.1.push(i);
        }
        let groups: Vec<_> = slots.into_values().collect();
        let run = |commit: bool| {
            let groups = &groups;
            async move {
                let answers =
                    try_join_all(groups.iter().map(|(g, _)| self.eval(lane, g, commit, id)))
                        .await?;
                let mut out = vec![None; calls.len()];
                for ((_, at), ds) in groups.iter().zip(answers) {
                    for (&i, d) in at.iter().zip(ds) {
                        out[i] = Some(d);
                    }
                }
                Ok::<Vec<Decision>, StoreError>(out.into_iter().flatten().collect())
            }
        };
        // Charges and lease releases pass whatever the state: no dry run to wait for.
        if !calls.iter().any(|c| c.op.decides()) {
            return run(true).await;
        }
        let dry = run(false).await?;
        if !super::request_allowed(calls, &dry) {
            return Ok(dry);
        }
        let charged = run(true).await?;
        if super::request_allowed(calls, &charged) {
            return Ok(charged);
        }
        // Refused in the charge round after all (another gateway filled a limit on another
        // slot in between): a refused request holds no concurrency slot, so the slots this
        // round took are freed now rather than when their lease runs out.
        let taken: Vec<LimitCall> = calls
            .iter()
            .zip(&charged)
            .filter(|(c, d)| {
                c.op == Op::Decide && c.params.algorithm == Algorithm::Concurrency && d.allowed()
            })
            .map(|(c, _)| LimitCall {
                op: Op::Release,
                ..c.clone()
            })
            .collect();
        if !taken.is_empty() {
            // Boxed: the call is this function again (releases only: no dry run).
            if let Err(e) = Box::pin(self.decide_across_slots(lane, &taken, id)).await {
                tracing::debug!(error = %e, "freeing a refused request's slots failed; their lease ends them");
            }
        }
        Ok(charged)
    }

    /// Connected and not failing: what the deny cache asks before answering for this store
    /// (while Redis is down, requests follow `on_error`, not remembered refusals).
    pub fn healthy(&self) -> bool {
        let lane = self.lane();
        !lane.breaker.is_open() && lane.pool.next_connected().is_connected()
    }

    /// Decide all limits of one request, bounded by `timeout`, behind the breaker.
    pub async fn decide_as(
        self: &Arc<Self>,
        calls: &[LimitCall],
        id: u64,
    ) -> Result<Vec<Decision>, StoreError> {
        let lane = self.lane();
        let slot = if self.cluster {
            match one_slot(calls) {
                Some(slot) => slot,
                // Boxed: fred's call futures are large (kilobytes), and only requests across
                // slots hold one; the queued path's future stays small enough to live in the
                // request's.
                None => {
                    let across = Box::pin(self.decide_across_slots(lane, calls, id));
                    return self.guarded(lane, across).await;
                }
            }
        } else {
            0
        };
        self.guarded(lane, self.queued(lane, calls, id, slot)).await
    }

    /// Queue the request on `lane` for its next script call (see [`batch`]), starting a
    /// sender if fewer than the lane's connections run. `slot`: its keys' slot on Cluster (0
    /// otherwise).
    async fn queued(
        self: &Arc<Self>,
        lane: &Lane,
        calls: &[LimitCall],
        id: u64,
        slot: u16,
    ) -> Result<Vec<Decision>, StoreError> {
        let (answer, rx) = tokio::sync::oneshot::channel();
        let job = Job {
            calls: calls.to_vec(),
            id,
            slot,
            answer,
        };
        if lane.queue.push(job) {
            let (me, at) = (self.clone(), lane.index);
            tokio::spawn(async move { me.send_queued(at).await });
        }
        rx.await
            .unwrap_or_else(|_| Err(StoreError::Connection("decision call dropped".into())))
    }

    /// A sender: one script call for everything queued on lane `at`, over that lane's
    /// connections, until its queue is empty.
    async fn send_queued(self: Arc<Self>, at: usize) {
        let lane = self.lane_at(at);
        loop {
            let jobs = lane.queue.take();
            if jobs.is_empty() {
                if lane.queue.finish() {
                    continue;
                }
                return;
            }
            // Boxed: the call's future (fred's included) is kilobytes; unboxed, the sender's
            // task would be that size, moved whole as each new sender is spawned.
            let call = Box::pin(self.eval_batch(lane, &jobs));
            let answers = tokio::time::timeout(self.timeout, call)
                .await
                .unwrap_or(Err(StoreError::Timeout));
            match answers {
                Ok(answers) => {
                    for (job, a) in jobs.into_iter().zip(answers) {
                        let _ = job.answer.send(a);
                    }
                }
                Err(e) => {
                    for job in jobs {
                        let _ = job.answer.send(Err(e.clone()));
                    }
                }
            }
        }
    }

    /// The next script calls for `jobs`, an answer per job in order; on Cluster, one call per
    /// node. A lone request goes as a batch of one too: the batch form keeps its limits'
    /// parses from call to call, the single-request form does not.
    async fn eval_batch(
        &self,
        lane: &Lane,
        jobs: &[Job],
    ) -> Result<Vec<Result<Vec<Decision>, StoreError>>, StoreError> {
        if self.cluster {
            return self.eval_per_node(lane, jobs).await;
        }
        let client = self.client(lane).await?;
        self.eval_jobs(&client, &jobs.iter().collect::<Vec<_>>(), None)
            .await
    }

    /// Redis Cluster: the requests grouped by the node serving their slot (one client's slot
    /// map, and fred routes that client's calls by the same map), one call per node, all in
    /// flight at once. A request whose key its node does not serve (the slot moved), or that
    /// reached a replica (its node was demoted by a failover), was not charged: the map is
    /// read again and such requests are sent once more, grouped the same way; a second
    /// refusal is their answer.
    async fn eval_per_node(
        &self,
        lane: &Lane,
        jobs: &[Job],
    ) -> Result<Vec<Result<Vec<Decision>, StoreError>>, StoreError> {
        let client = self.client(lane).await?;
        let all: Vec<&Job> = jobs.iter().collect();
        let mut answers = self.eval_grouped(&client, &all).await;
        let moved: Vec<usize> = (0..jobs.len())
            .filter(|&i| stale_route(&answers[i]))
            .collect();
        if !moved.is_empty() {
            let _ = client.sync_cluster().await;
            let again: Vec<&Job> = moved.iter().map(|&i| &jobs[i]).collect();
            let retried = self.eval_grouped(&client, &again).await;
            for (i, answer) in moved.into_iter().zip(retried) {
                answers[i] = answer;
            }
        }
        Ok(answers)
    }

    /// `jobs` grouped by the node `client`'s slot map says serves their slot, one call per
    /// group (routed by a slot of that node), all in flight at once: an answer per job, in
    /// order.
    async fn eval_grouped(
        &self,
        client: &fred::clients::WithOptions<Client>,
        jobs: &[&Job],
    ) -> Vec<Result<Vec<Decision>, StoreError>> {
        let routing = client.cached_cluster_state();
        // Per node (unknown: grouped too, and routed by fred's map as it is then), the
        // positions of its jobs in `jobs`.
        let mut nodes: Vec<(Option<&Server>, Vec<usize>)> = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            let node = routing.as_ref().and_then(|r| r.get_server(job.slot));
            match nodes.iter_mut().find(|(n, _)| *n == node) {
                Some((_, at)) => at.push(i),
                None => nodes.push((node, vec![i])),
            }
        }
        let calls = nodes.iter().map(|(_, at)| async move {
            let group: Vec<&Job> = at.iter().map(|&i| jobs[i]).collect();
            self.eval_jobs(client, &group, Some(group[0].slot))
                .await
                .unwrap_or_else(|e| vec![Err(e); group.len()])
        });
        let mut out: Vec<Option<Result<Vec<Decision>, StoreError>>> = vec![None; jobs.len()];
        for ((_, at), answers) in nodes.iter().zip(join_all(calls).await) {
            for (&i, answer) in at.iter().zip(answers) {
                out[i] = Some(answer);
            }
        }
        out.into_iter()
            .map(|a| a.unwrap_or_else(|| Err(StoreError::Script("no answer".into()))))
            .collect()
    }

    /// One script call deciding `jobs` in order, each request getting its own answer (one
    /// request's script error does not fail the others). `slot`: Cluster, a slot of the node
    /// serving every job's slot; the call is routed by it and the keys go in ARGV, not KEYS
    /// (Redis takes declared keys as one slot's). `None` (standalone and Sentinel): the keys
    /// are declared.
    async fn eval_jobs(
        &self,
        client: &fred::clients::WithOptions<Client>,
        jobs: &[&Job],
        slot: Option<u16>,
    ) -> Result<Vec<Result<Vec<Decision>, StoreError>>, StoreError> {
        let nonces: Vec<String> = jobs.iter().map(|j| self.nonce(j.id)).collect();
        let keys = || {
            jobs.iter()
                .flat_map(|j| j.calls.iter().map(|c| c.key.clone()))
        };
        let argv = || {
            let requests = nonces
                .iter()
                .zip(jobs)
                .map(|(n, j)| (n.as_str(), &j.calls[..]));
            scripts::batch_argv(requests)
        };
        let reply: Vec<fred::types::Value> = match slot {
            // Standalone and Sentinel: no slot to route by.
            None => {
                let declared = jobs.iter().map(|j| j.calls.len()).sum();
                let args = || keys().chain(argv()).collect();
                self.script(client, 0, declared, args).await?
            }
            Some(slot) => {
                let args = || argv().into_iter().chain(keys()).collect();
                self.script(client, slot, 0, args).await?
            }
        };
        let sizes: Vec<usize> = jobs.iter().map(|j| j.calls.len()).collect();
        let answers = scripts::batch_decisions(reply, &sizes).map_err(StoreError::Script)?;
        Ok(answers
            .into_iter()
            .map(|a| a.map_err(StoreError::Script))
            .collect())
    }

    /// [`RedisStore::decide_as`] with a new call id.
    pub async fn decide(
        self: &Arc<Self>,
        calls: &[LimitCall],
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide_as(calls, super::next_id()).await
    }

    /// `fut` (an operation over `lane`), bounded by `timeout`, behind `lane`'s breaker.
    async fn guarded<T>(
        &self,
        lane: &Lane,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let breaker = &lane.breaker;
        breaker.admit()?;
        let r = tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or(Err(StoreError::Timeout));
        lane.record(&r.as_ref().map(|_| ()).map_err(Clone::clone));
        r
    }

    /// The key's state as a cost-0 and a cost-1 request see it, without writing.
    pub async fn peek(
        &self,
        key: &str,
        params: &crate::limiter::algo::Params,
    ) -> Result<Peek, StoreError> {
        let call = |cost| LimitCall {
            key: key.to_owned(),
            params: *params,
            cost,
            shadow: true,
            // Not written (commit false): a cost-1 decision as it would be made.
            op: crate::limiter::algo::Op::Decide,
        };
        let (id, lane) = (super::next_id(), self.lane());
        let d = self
            .guarded(lane, self.eval(lane, &[call(0), call(1)], false, id))
            .await?;
        Ok(Peek {
            now: d[0],
            next: d[1],
        })
    }

    pub async fn reset(&self, key: &str) -> Result<(), StoreError> {
        let lane = self.lane();
        self.guarded(lane, async {
            self.client(lane)
                .await?
                .del::<i64, _>(key)
                .await
                .map(|_| ())
                .map_err(|e| store_error(&e))
        })
        .await
    }

    /// PING over every attached worker's lane at once, each bounded by `timeout`; each also
    /// serves as a probe of that lane's breaker. Every lane: a worker whose connections are
    /// down decides its requests by `on_error`, so the gateway is not ready while any is.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let pings = self.lanes.iter().filter_map(OnceLock::get).map(|lane| {
            let worker = crate::worker::number(lane.index);
            async move {
                let r = tokio::time::timeout(self.timeout, self.ping_lane(lane))
                    .await
                    .unwrap_or(Err(StoreError::Timeout));
                lane.record(&r);
                r.map_err(|e| match e {
                    StoreError::Connection(why) => {
                        StoreError::Connection(format!("worker {worker}: {why}"))
                    }
                    e => e,
                })
            }
        });
        futures_util::future::join_all(pings)
            .await
            .into_iter()
            .collect()
    }

    async fn ping_lane(&self, lane: &Lane) -> Result<(), StoreError> {
        let client = lane.pool.next_connected();
        if !client.is_connected() {
            return Err(lane.not_connected("not connected to redis"));
        }
        client
            .with_options(&self.opts)
            .ping::<String>(None)
            .await
            .map(|_| ())
            .map_err(|e| store_error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::policy::RedisMode;

    fn settings(mode: RedisMode, url: Option<&str>, nodes: &[&str]) -> RedisSettings {
        RedisSettings {
            url: url.map(str::to_owned),
            mode,
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            sentinel_service: Some("mymaster".into()),
            password: Some("from-env".into()),
            pool_size: 2,
            timeout: Duration::from_millis(50),
            key_prefix: "sluice:".into(),
            startup_timeout: Duration::from_secs(5),
            deny_cache: true,
            tls: None,
        }
    }

    #[test]
    fn sentinels_that_answer_go_first_in_their_order() {
        use std::io::{Read, Write};
        // Accepted into the backlog, never answered.
        let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let refused_addr = refused.local_addr().unwrap();
        drop(refused);
        let answering = |reply: &'static [u8]| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            std::thread::spawn(move || {
                for mut c in l.incoming().flatten() {
                    let _ = c.read(&mut [0u8; 64]);
                    let _ = c.write_all(reply);
                }
            });
            addr
        };
        let (pong, noauth) = (answering(b"+PONG\r\n"), answering(b"-NOAUTH x\r\n"));
        let nodes: Vec<String> = [hung.local_addr().unwrap(), refused_addr, pong, noauth]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let mut cfg = fred_config(&settings(RedisMode::Sentinel, None, &nodes)).unwrap();
        let ServerConfig::Sentinel { hosts, .. } = &mut cfg.server else {
            panic!("not sentinel")
        };
        sentinel::answering_first(hosts, Duration::from_millis(300));
        let order: Vec<String> = hosts
            .iter()
            .map(|h| format!("{}:{}", h.host, h.port))
            .collect();
        assert_eq!(order, [nodes[2], nodes[3], nodes[0], nodes[1]]);
    }

    #[test]
    fn transport_failures_are_connection_errors_and_replies_are_script_errors() {
        // (kind, details, is a script error: Redis answered)
        for (kind, details, script) in [
            // A redirection is Redis answering; a cluster client failure is not.
            (ErrorKind::Cluster, "MOVED 11476 127.0.0.1:7002", true),
            (ErrorKind::Cluster, "ASK 11476 127.0.0.1:7002", true),
            (ErrorKind::Cluster, "Failed to read cluster state.", false),
            // fred's own transport failures, reported with the kind of an error reply.
            (ErrorKind::Unknown, "Failed to route command.", false),
            (ErrorKind::Unknown, "Too many failed write attempts.", false),
            // An error reply from the script or from Redis is the store answering.
            (ErrorKind::Unknown, "sluice: bad limit in ARGV[4]", true),
            (ErrorKind::IO, "reset", false),
        ] {
            let e = store_error(&Error::new(kind, details.to_string()));
            match (script, &e) {
                (true, StoreError::Script(_)) | (false, StoreError::Connection(_)) => {}
                _ => panic!("{details}: {e:?}"),
            }
        }
        assert_eq!(
            store_error(&Error::new(ErrorKind::Timeout, "t")),
            StoreError::Timeout
        );
    }

    #[test]
    fn configs_for_each_mode() {
        let c = fred_config(&settings(
            RedisMode::Standalone,
            Some("redis://u:p@10.0.0.1:6380/2"),
            &[],
        ))
        .unwrap();
        assert!(c.server.is_centralized());
        assert_eq!(c.database, Some(2));
        assert_eq!(c.password.as_deref(), Some("from-env"), "password_env wins");
        let c = fred_config(&settings(RedisMode::Cluster, None, &["a:1", "b:2"])).unwrap();
        assert_eq!(c.server.hosts().len(), 2);
        let c = fred_config(&settings(RedisMode::Sentinel, None, &["s:26379"])).unwrap();
        assert!(c.server.is_sentinel());
        assert!(fred_config(&settings(
            RedisMode::Standalone,
            Some("rediss://h:6379"),
            &[]
        ))
        .unwrap()
        .uses_tls());
    }
}
