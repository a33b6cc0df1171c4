//! Stage 5 — settle: what an admitted request owes once it is answered (SPEC §11).
//!
//! * [`Owed`]: the limits charged by the answer. Their probe let the request through; when
//!   the upstream's response head is in, one store call charges each what the answer says
//!   (`count_when`, a `response_header` cost), even past the limit. No answer is charged too:
//!   a 502/504 the gateway made as that status, a client gone before the head as 499 (nginx's
//!   "client closed request"), both with a `response_header` cost's `default`.
//! * [`Leases`]: the concurrency slots the request took. Released when the response body
//!   ends or is dropped (the client went away, the upstream failed), renewed meanwhile every
//!   half lease (by one task for the process, `Renewer`) so a long stream keeps its slot; a
//!   gateway that dies leaves them to expire.
//!
//! Both settle from `Drop` as well, on a spawned task, so a request whose future hyper drops
//! still pays and frees.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use prometheus::IntGauge;

use super::live::Live;
use crate::limiter::algo::{Decision, Op};
use crate::limiter::store::{next_id, LimitCall, Store, StoreError};
use crate::model::limit::Charge;
use crate::telemetry::metrics::StoreMetrics;

/// A request the gateway answered itself after admitting it (the upstream failed: 502,
/// 504): charge its answer-charged limits as that status and free its slots, before the
/// answer goes out.
pub async fn unanswered(ctx: &mut super::context::Ctx, status: u16) {
    if let Some(owed) = ctx.owed.take() {
        let charged = owed.settle(status, None).await;
        advertise(ctx, charged);
    }
    if let Some(leases) = ctx.leases.take() {
        leases.release().await;
    }
}

/// The answer advertises the state after its own charge, where that is tighter than what
/// the admission showed (the upstream's answer and the gateway's own 502/504 alike).
pub fn advertise(ctx: &mut super::context::Ctx, charged: Vec<(usize, Decision)>) {
    let rules = ctx.route.map(|r| &ctx.live.table.routes[r].limits);
    for (i, d) in charged {
        let shown = rules.is_some_and(|l| l[i].headers && !l[i].shadow);
        let adm = &mut ctx.admission;
        if shown && adm.headline.is_none_or(|(_, h)| d.tighter_than(&h)) {
            adm.headline = Some((i, d));
        }
    }
}

/// The status a request is charged as when its client went away before the answer.
pub const CLIENT_GONE: u16 = 499;

/// The limits of one admitted request charged by its answer (their probe calls).
pub struct Owed {
    live: Arc<Live>,
    route: usize,
    calls: Vec<(usize, LimitCall)>,
    store: Store,
    metrics: StoreMetrics,
    settled: bool,
}

impl Owed {
    pub fn new(
        live: Arc<Live>,
        route: usize,
        calls: Vec<(usize, LimitCall)>,
        store: Store,
        metrics: StoreMetrics,
    ) -> Owed {
        Owed {
            live,
            route,
            calls,
            store,
            metrics,
            settled: false,
        }
    }

    /// Charge each limit for an answer of `status` with `headers` (`None`: no answer), in one
    /// store call. Returns each charged limit's decision after the charge, by limit index. A
    /// store failure is counted and logged; the answer goes out whatever happens here.
    pub async fn settle(
        mut self,
        status: u16,
        headers: Option<&HeaderMap>,
    ) -> Vec<(usize, Decision)> {
        self.settled = true;
        let Some(charging) = self.charging(status, headers) else {
            return Vec::new();
        };
        if matches!(self.store, Store::Memory(_)) {
            return charging.await;
        }
        // On its own task: a client that leaves now drops this future, and a store call
        // whose caller is gone is never sent (a queued decision must not run for nobody).
        // The charge must be made all the same.
        counted(charging).await.unwrap_or_default()
    }

    /// The one store call that charges an answer of `status` with `headers`, owning what it
    /// needs; `None` when the answer charges nothing.
    fn charging(
        &self,
        status: u16,
        headers: Option<&HeaderMap>,
    ) -> Option<impl std::future::Future<Output = Vec<(usize, Decision)>> + Send + 'static> {
        let (which, calls) = self.bill(status, headers);
        if calls.is_empty() {
            return None;
        }
        let (store, metrics, live, route) = (
            self.store.clone(),
            self.metrics.clone(),
            self.live.clone(),
            self.route,
        );
        Some(async move { charge(&store, &metrics, &live, route, which, calls).await })
    }

    /// The charge calls: cost by the answer, nothing for limits it does not concern.
    fn bill(&self, status: u16, headers: Option<&HeaderMap>) -> (Vec<usize>, Vec<LimitCall>) {
        let rules = &self.live.table.routes[self.route].limits;
        let mut which = Vec::with_capacity(self.calls.len());
        let mut calls = Vec::with_capacity(self.calls.len());
        for (i, probe) in &self.calls {
            let Charge::Answer { when, cost } = &rules[*i].charge else {
                continue;
            };
            if when.as_ref().is_some_and(|w| !w.contains(status)) {
                continue;
            }
            let cost = cost.of(headers);
            if cost == 0 {
                continue;
            }
            which.push(*i);
            calls.push(LimitCall {
                cost,
                op: Op::Charge,
                ..probe.clone()
            });
        }
        (which, calls)
    }
}

impl Drop for Owed {
    /// Never settled: the client went away before the answer (hyper dropped the request).
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(charging) = self.charging(CLIENT_GONE, None) {
            spawn(async move {
                charging.await;
            });
        }
    }
}

/// One charge call, measured like every store call; the charged limits' decisions.
async fn charge(
    store: &Store,
    metrics: &StoreMetrics,
    live: &Live,
    route: usize,
    which: Vec<usize>,
    calls: Vec<LimitCall>,
) -> Vec<(usize, Decision)> {
    if calls.is_empty() {
        return Vec::new();
    }
    let result = measured(store, metrics, &calls, next_id()).await;
    let handles = &live.routes[route];
    match result {
        Ok(decisions) => {
            for (i, c) in which.iter().zip(&calls) {
                handles.charged(*i, c.cost);
            }
            which.into_iter().zip(decisions).collect()
        }
        Err(e) => {
            let r = &live.table.routes[route];
            tracing::warn!(route = %r.name, error = %e, "charging limits by the answer failed");
            Vec::new()
        }
    }
}

/// A store call made after the request's decision (a charge, a release, a renewal), counted
/// in the store's metrics like the decision itself.
async fn measured(
    store: &Store,
    metrics: &StoreMetrics,
    calls: &[LimitCall],
    id: u64,
) -> Result<Vec<Decision>, StoreError> {
    let started = Instant::now();
    let result = store.decide_as(calls, id).await;
    let failed = result.as_ref().err();
    metrics.call(started.elapsed().as_secs_f64(), failed.map(|e| e.kind()));
    result
}

/// Free the slots a failed decision call (`id`) may still take: one that timed out, or whose
/// reply was lost, still runs when Redis reads it, and its slots would then be held by no
/// request until their lease ran out. A release of a slot never taken changes nothing. It is
/// sent at once and once more after [`ORPHAN_RECHECK`]: Redis runs a stalled connection's
/// calls in no set order against the others' once it resumes, so the first release may run
/// before the decision. A stall longer than that leaves them to their lease.
pub fn release_orphans(store: Store, metrics: StoreMetrics, calls: Vec<LimitCall>, id: u64) {
    spawn(async move {
        for wait in [Duration::ZERO, ORPHAN_RECHECK] {
            tokio::time::sleep(wait).await;
            if let Err(e) = measured(&store, &metrics, &calls, id).await {
                tracing::warn!(error = %e, "freeing the slots of a failed decision failed; their lease ends them");
            }
        }
    });
}

/// When the slots of a failed decision are released the second time.
pub const ORPHAN_RECHECK: Duration = Duration::from_secs(1);

/// The concurrency slots one admitted request holds, freed when this is dropped.
pub struct Leases {
    store: Store,
    metrics: StoreMetrics,
    /// Release calls, one per slot.
    calls: Arc<[LimitCall]>,
    id: u64,
    gauges: Vec<IntGauge>,
    released: bool,
}

impl Leases {
    /// Hold the slots `calls` took as call `id`, counted in `gauges`; renewed every half of
    /// the shortest lease until dropped.
    pub fn hold(
        store: Store,
        metrics: StoreMetrics,
        calls: Vec<LimitCall>,
        id: u64,
        gauges: Vec<IntGauge>,
    ) -> Leases {
        for g in &gauges {
            g.inc();
        }
        let calls: Arc<[LimitCall]> = calls
            .into_iter()
            .map(|c| LimitCall {
                op: Op::Release,
                ..c
            })
            .collect();
        Renewer::get().add(id, &store, &metrics, &calls);
        Leases {
            store,
            metrics,
            calls,
            id,
            gauges,
            released: false,
        }
    }
}

impl Leases {
    /// Free the slots now; done when the store has them back (or failed to: then they
    /// free themselves when their lease runs out). Bounded by the store's timeout.
    pub async fn release(mut self: Box<Self>) {
        if let Some(release) = self.release_now() {
            // On its own task, as [`Owed::settle`]'s charge: the release must not go with
            // a client that leaves while it waits.
            let _ = counted(release).await;
        }
    }

    /// Stop renewing and counting, once; free the slots at once when the store needs no
    /// wait for it (the embedded store), or return the call that frees them (Redis).
    pub fn release_now(
        &mut self,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        if std::mem::replace(&mut self.released, true) {
            return None;
        }
        Renewer::get().remove(self.id);
        for g in &self.gauges {
            g.dec();
        }
        let (calls, id) = (self.calls.clone(), self.id);
        match &self.store {
            Store::Memory(m) => {
                m.decide_as(&calls, id);
                None
            }
            store => {
                let (store, metrics) = (store.clone(), self.metrics.clone());
                Some(async move {
                    if let Err(e) = measured(&store, &metrics, &calls, id).await {
                        tracing::warn!(error = %e, "releasing concurrency leases failed");
                    }
                })
            }
        }
    }
}

impl Drop for Leases {
    /// Dropped unreleased: the client went away, or the request ended without a body.
    fn drop(&mut self) {
        if let Some(release) = self.release_now() {
            spawn(release);
        }
    }
}

/// The leases this process holds, renewed by one task: every quarter second it renews those
/// last renewed half a lease ago or more (one store call per request). One task for all,
/// rather than a timer task per request, keeps a slot's cost to two map operations.
struct Renewer {
    held: parking_lot::Mutex<HashMap<u64, Held>>,
}

struct Held {
    store: Store,
    metrics: StoreMetrics,
    calls: Arc<[LimitCall]>,
    every: Duration,
    renewed: Instant,
}

impl Renewer {
    const TICK: Duration = Duration::from_millis(250);

    /// The process's renewer; its task starts with the first lease (on the serving runtime).
    fn get() -> &'static Renewer {
        static RENEWER: std::sync::OnceLock<Renewer> = std::sync::OnceLock::new();
        RENEWER.get_or_init(|| {
            // Not a settling call: it runs for the process's life.
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(Renewer::run());
            }
            Renewer {
                held: parking_lot::Mutex::new(HashMap::new()),
            }
        })
    }

    fn add(&self, id: u64, store: &Store, metrics: &StoreMetrics, calls: &Arc<[LimitCall]>) {
        let lease = calls.iter().map(|c| c.params.window_us).min().unwrap_or(0);
        let held = Held {
            store: store.clone(),
            metrics: metrics.clone(),
            calls: calls.clone(),
            every: Duration::from_micros(lease / 2),
            renewed: Instant::now(),
        };
        self.held.lock().insert(id, held);
    }

    fn remove(&self, id: u64) {
        self.held.lock().remove(&id);
    }

    async fn run() {
        let mut tick = tokio::time::interval(Renewer::TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = Instant::now();
            let due: Vec<(u64, Store, StoreMetrics, Vec<LimitCall>)> = {
                let mut held = Renewer::get().held.lock();
                held.iter_mut()
                    .filter(|(_, h)| now.duration_since(h.renewed) >= h.every)
                    .map(|(id, h)| {
                        h.renewed = now;
                        let renew = h.calls.iter().map(|c| LimitCall {
                            op: Op::Renew,
                            ..c.clone()
                        });
                        (*id, h.store.clone(), h.metrics.clone(), renew.collect())
                    })
                    .collect()
            };
            for (id, store, metrics, calls) in due {
                spawn(async move {
                    if let Err(e) = measured(&store, &metrics, &calls, id).await {
                        tracing::warn!(error = %e, "renewing concurrency leases failed");
                    }
                });
            }
        }
    }
}

/// Run `fut` on the current runtime, if there is one (there always is while serving),
/// counted in [`settled`] until it ends.
fn spawn(fut: impl std::future::Future<Output = ()> + Send + 'static) {
    if tokio::runtime::Handle::try_current().is_ok() {
        counted(fut);
    }
}

/// Spawn a settling call on the current runtime, counted in [`settled`] until it ends.
pub fn counted<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let pending = Pending::new();
    tokio::spawn(async move {
        let out = fut.await;
        drop(pending);
        out
    })
}

/// Settling calls spawned and not yet ended, in the whole process.
static PENDING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static NONE_PENDING: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// One settling call in flight (dropped with its task, ended or cancelled).
struct Pending;

impl Pending {
    fn new() -> Pending {
        PENDING.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Pending
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if PENDING.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            NONE_PENDING.notify_waiters();
        }
    }
}

/// Until every charge and release spawned so far has ended, at most `limit`: a worker that
/// drains waits for them before its runtime goes, so a graceful shutdown neither skips a
/// charge nor leaves a slot held until its lease ends (only a gateway that dies does).
/// Whether they all ended.
pub async fn settled(limit: Duration) -> bool {
    let all = async {
        loop {
            let none = NONE_PENDING.notified();
            let mut none = std::pin::pin!(none);
            none.as_mut().enable();
            if PENDING.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return;
            }
            none.await;
        }
    };
    tokio::time::timeout(limit, all).await.is_ok()
}
