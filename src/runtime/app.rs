//! Process wiring for `sluice run`: store, gateway, listeners, reload, signals, drain.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_rustls::TlsAcceptor;

use super::spread::{Share, Spread};
use super::Runtime;
use super::{reload, server};
use crate::admin;
use crate::config::Loaded;
use crate::limiter::deny::DenyCache;
use crate::limiter::store::memory::{Clock, MemoryStore};
use crate::limiter::store::redis::RedisStore;
use crate::limiter::store::Store;
use crate::model::policy::StoreKind;
use crate::pipeline::context::{ConnInfo, Drain, Phase};
use crate::pipeline::live::Live;
use crate::pipeline::Gateway;
use crate::telemetry::metrics::Metrics;
use crate::tls;
use crate::worker;

/// Build the gateway for a loaded table (stores connected, metrics registered).
pub async fn gateway(loaded: Loaded, config_path: PathBuf) -> Arc<Runtime> {
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    let Loaded {
        boot,
        table,
        file,
        tls,
        ..
    } = loaded;
    let local = Arc::new(MemoryStore::new(boot.store.memory_max_keys, Clock::System));
    let store = match boot.store.kind {
        StoreKind::Memory => Store::Memory(local.clone()),
        StoreKind::Redis => {
            let redis = RedisStore::connect_for(&boot.store.redis, tls.redis.clone(), boot.workers);
            match redis {
                Ok(r) => {
                    let r = Arc::new(r);
                    r.follow_failovers();
                    Store::Redis(r)
                }
                // Config loading already ran these settings through fred
                // (store::redis::validate), so this is not expected; if it happens, say so
                // loudly and keep serving on the embedded store rather than not at all.
                Err(e) => {
                    tracing::error!(error = %e, "cannot create the Redis client; using the embedded store");
                    Store::Memory(local.clone())
                }
            }
        }
    };
    let deny =
        (matches!(store, Store::Redis(_)) && boot.store.redis.deny_cache).then(DenyCache::default);
    let metrics = Metrics::new();
    metrics.set_config_version(None, &table.version);
    let live = Live::new(table, file, &tls.upstreams, None, &metrics, boot.workers);
    let gateway = Gateway {
        live: ArcSwap::from_pointee(live),
        store_metrics: metrics.store(store.label()),
        deny,
        store,
        local,
        metrics,
    };
    Arc::new(Runtime::new(gateway, boot, config_path, tls.listeners))
}

/// Serve until SIGTERM/SIGINT, then drain. Returns the process exit code.
pub async fn run(loaded: Loaded, config_path: PathBuf, mut signals: Signals) -> i32 {
    let boot = &loaded.boot;
    let admin_listen = boot.admin_listen;
    let drain = boot.drain_timeout;
    let timeouts = server::Timeouts {
        header: boot.client_header_timeout,
        send: boot.send_timeout,
    };
    let startup_timeout = boot.store.redis.startup_timeout;
    match super::fd_limit::raise() {
        Ok((before, after)) if after > before => {
            tracing::info!(before, after, "open file limit raised to the hard limit");
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open file limit"),
    }
    let gw = gateway(loaded, config_path).await;
    if let Err(e) = reload::spawn_watchers(gw.clone()) {
        tracing::warn!(error = %e, "cannot watch the config file; reload with SIGHUP or POST /admin/reload");
    }

    // The admin listener opens first, so probes see `/readyz` answer 503 while the store
    // connects.
    let admin = match TcpListener::bind(admin_listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%admin_listen, error = %e, "cannot listen (admin)");
            return 1;
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(Phase::Serving);
    let g = gw.clone();
    let admin_task = tokio::spawn(server::serve(
        admin,
        server::Accept::default(),
        move |req, conn: Arc<ConnInfo>| admin::handle(g.clone(), req, conn.peer.addr),
        |_| {},
        timeouts,
        stop_rx.clone(),
        Duration::from_secs(1),
        None,
    ));

    // Workers 2..N start now, so that what each needs of its own before it serves (its Redis
    // connections, `store::redis`) is part of what startup waits for below; they get their
    // listeners once those are bound.
    let serving = Serving {
        gw: gw.clone(),
        timeouts,
        drain,
        stop: stop_rx.clone(),
    };
    let mut workers = Vec::with_capacity(gw.boot.workers.saturating_sub(1));
    for index in 1..gw.boot.workers {
        match serving.clone().spawn_worker(index) {
            Ok(w) => workers.push(w),
            Err(e) => {
                tracing::error!(worker = worker::number(index), error = %e, "cannot start a worker");
                return 1;
            }
        }
    }
    for w in &mut workers {
        let _ = (&mut w.attached).await;
    }

    // The data listener opens only once the store is ready (connected, script loaded): a
    // request that arrives the instant the port accepts is decided by the store like every
    // other, instead of by `on_error` (SPEC §3 "Startup"). Bounded by `startup_timeout`.
    let (label, policy) = (gw.store.label(), gw.boot.store.on_error);
    let ready = tokio::select! {
        ready = gw.store.wait_ready(startup_timeout) => ready,
        signal = signals.next() => {
            tracing::info!(signal, "stopped while waiting for the store; nothing was served");
            let _ = stop_tx.send(Phase::Draining);
            let _ = admin_task.await;
            return 0;
        }
    };
    match ready {
        Ok(()) => tracing::info!(store = label, "store reachable"),
        Err(e) => tracing::warn!(
            store = label,
            error = %e,
            on_error = ?policy,
            ?startup_timeout,
            "store not ready within startup_timeout: serving per on_error, reconnecting in the background"
        ),
    }

    // Every data listener binds before any serves: one that cannot bind fails the start.
    let mut data = Vec::with_capacity(gw.boot.listeners.len());
    for (l, certs) in gw.boot.listeners.iter().zip(&gw.certificates) {
        let socket = match TcpListener::bind(l.address).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(listen = %l.address, error = %e, "cannot listen");
                return 1;
            }
        };
        let tls = match (&l.tls, certs) {
            (Some(t), Some(resolver)) => match tls::server::config(resolver.clone(), t.min_version)
            {
                Ok(cfg) => Some(TlsAcceptor::from(Arc::new(cfg))),
                Err(e) => {
                    tracing::error!(listen = %l.address, error = %e, "cannot set up TLS");
                    return 1;
                }
            },
            _ => None,
        };
        tracing::info!(
            listen = %socket.local_addr().map_or(l.address, |a| a),
            tls = tls.is_some(),
            proxy_protocol = l.proxy_protocol,
            "listening"
        );
        let accept = server::Accept {
            tls,
            proxy_protocol: l.proxy_protocol,
        };
        data.push((socket, accept));
    }
    tracing::info!(admin = %admin_listen, version = %gw.live.load().table.version, "sluice serving");

    let sweeper = gw.gateway.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            sweeper.local.sweep();
            if let Some(deny) = &sweeper.deny {
                deny.sweep(std::time::Instant::now());
            }
        }
    });

    // Workers 2..N serve clones of the same listening sockets, and every listener's
    // connections are spread over the workers.
    let open = gw.metrics.connections(gw.boot.workers);
    let mut shares: Vec<_> = data
        .iter()
        .map(|_| Spread::shares(open.clone()).into_iter())
        .collect();
    let mut take_shares =
        || -> Vec<Share> { shares.iter_mut().filter_map(Iterator::next).collect() };
    let first = take_shares();
    let mut others = Vec::with_capacity(workers.len());
    for (w, index) in workers.into_iter().zip(1..) {
        match clone_listeners(&data) {
            Ok(l) => {
                let _ = w.listeners.send((l, take_shares()));
                others.push(w.done);
            }
            Err(e) => {
                tracing::error!(worker = worker::number(index), error = %e, "cannot start a worker");
                return 1;
            }
        }
    }
    let data_tasks = serving.serve(data, first);
    drop(stop_rx);

    let signal = signals.next().await;
    tracing::info!(
        signal,
        ?drain,
        "shutting down: no new connections, draining in-flight requests"
    );
    let _ = stop_tx.send(Phase::Draining);
    // A second signal is someone who will not wait for the drain: what is open is closed
    // now, and what it leaves to settle is settled as at the deadline.
    let stop_tx = Arc::new(stop_tx);
    let cut = stop_tx.clone();
    tokio::spawn(async move {
        let signal = signals.next().await;
        tracing::warn!(signal, "second signal: closing every connection now");
        let _ = cut.send(Phase::Cut);
    });
    for t in data_tasks {
        let _ = t.await;
    }
    settle(worker::number(0)).await;
    for done in others {
        let _ = done.await;
    }
    let _ = admin_task.await;
    tracing::info!("bye");
    0
}

/// What each worker needs to serve the data listeners.
#[derive(Clone)]
struct Serving {
    gw: Arc<Runtime>,
    timeouts: server::Timeouts,
    drain: Duration,
    stop: Drain,
}

impl Serving {
    /// Serve every listener on the current runtime until `stop` flips and they have drained.
    fn serve(
        self,
        data: Vec<(TcpListener, server::Accept)>,
        shares: Vec<Share>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        data.into_iter()
            .zip(shares)
            .map(|((socket, accept), share)| {
                let g = self.gw.gateway.clone();
                let r = self.gw.gateway.clone();
                tokio::spawn(server::serve(
                    socket,
                    accept,
                    // Boxed here, once: every layer above (panic guard, hyper's in-flight
                    // slot) then moves a pointer, not the whole request state.
                    move |req, conn| Box::pin(g.clone().handle(req, conn)),
                    move |status| r.refused_head(status),
                    self.timeouts,
                    self.stop.clone(),
                    self.drain,
                    Some(share),
                ))
            })
            .collect()
    }

    /// Worker `index` (1 and up: index 0 is the first worker, the calling thread; operators
    /// see `worker::number`): a thread running a single-threaded runtime of its own. It
    /// first attaches its own Redis connections (then `attached` completes), and once handed
    /// its `listeners` (clones of the first worker's sockets: every worker accepts from the
    /// same queue, as nginx's workers do without `reuseport`) serves them with its own idle
    /// upstream connections. Everything else (admin, reload, the embedded store's sweeps)
    /// stays on the first worker.
    fn spawn_worker(self, index: usize) -> std::io::Result<Worker> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (attached_tx, attached) = oneshot::channel();
        let (listeners, handed) = oneshot::channel::<Handed>();
        let (done_tx, done) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("sluice-worker-{}", worker::number(index)))
            .spawn(move || {
                worker::set(index);
                rt.block_on(async move {
                    if let Store::Redis(r) = &self.gw.gateway.store {
                        r.attach_worker();
                    }
                    let _ = attached_tx.send(());
                    // Dropped unsent when the start fails: nothing to serve.
                    let Ok((listeners, shares)) = handed.await else {
                        return;
                    };
                    let mut data = Vec::with_capacity(listeners.len());
                    for (l, accept) in listeners {
                        match TcpListener::from_std(l) {
                            Ok(l) => data.push((l, accept)),
                            Err(e) => {
                                let worker = worker::number(index);
                                tracing::error!(worker, error = %e, "cannot serve");
                            }
                        }
                    }
                    for t in self.serve(data, shares) {
                        let _ = t.await;
                    }
                    settle(worker::number(index)).await;
                });
                let _ = done_tx.send(());
            })?;
        Ok(Worker {
            attached,
            listeners,
            done,
        })
    }
}

/// A worker's listening sockets and its share of each one's connections.
type Handed = (Vec<(std::net::TcpListener, server::Accept)>, Vec<Share>);

/// A started worker thread (`Serving::spawn_worker`).
struct Worker {
    /// Completes once its own Redis connections are attached (connecting).
    attached: oneshot::Receiver<()>,
    /// Hands it what to serve.
    listeners: oneshot::Sender<Handed>,
    /// Completes when it has drained.
    done: oneshot::Receiver<()>,
}

/// Each data listener's socket again (same accept queue), for another worker's runtime.
fn clone_listeners(
    data: &[(TcpListener, server::Accept)],
) -> std::io::Result<Vec<(std::net::TcpListener, server::Accept)>> {
    data.iter()
        .map(|(l, accept)| {
            let fd = std::os::fd::AsFd::as_fd(l).try_clone_to_owned()?;
            Ok((std::net::TcpListener::from(fd), accept.clone()))
        })
        .collect()
}

/// How long a drained worker waits for the charges and releases its requests left running
/// (`pipeline::settle`): each is one store call, bounded by the store's own timeout.
const SETTLE_WAIT: Duration = Duration::from_secs(2);

/// Wait for what the worker's requests left to settle, and say if some never did.
async fn settle(worker: usize) {
    if !crate::pipeline::settle::settled(SETTLE_WAIT).await {
        tracing::warn!(
            worker,
            wait = ?SETTLE_WAIT,
            "charges or lease releases still running at exit; released slots expire with their lease"
        );
    }
}

/// The process's signal handlers, installed before the config is read: a SIGHUP or SIGTERM
/// that arrives while it loads, or the moment a port accepts, reloads or drains instead of
/// killing the process by the default action.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Install them (within a runtime). SIGHUP's handler stays installed for the process;
    /// `reload` listens to it once serving, and one sent before is ignored.
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        drop(signal(SignalKind::hangup())?);
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM or SIGINT (one sent since `install` counts), by name.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}
