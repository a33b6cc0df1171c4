//! What serves a loaded table: the compiled [`Table`] (plain data) together with the runtime
//! resources resolved for it once, when it is applied: the upstream clients, the metric
//! handles of every route and each limit's 429 body. Compiling builds none of them, so a
//! config that is checked or rejected touches nothing, and a reload reuses every upstream
//! client whose settings did not change (its warm keep-alive connections and its round-robin
//! position survive).

use std::sync::Arc;

use crate::config::file::File;
use crate::model::consumer::ANONYMOUS;
use crate::model::table::Table;
use crate::pipeline::respond::Refusal;
use crate::pipeline::upstream::Upstream;
use crate::telemetry::metrics::{Metrics, PlanMetrics, RouteMetrics};

pub struct Live {
    pub table: Table,
    /// The file `table` was compiled from (for `/admin/config` and reload comparisons).
    pub file: File,
    /// By index of [`Table::upstreams`].
    pub upstreams: Vec<Arc<Upstream>>,
    /// By index of [`Table::routes`].
    pub routes: Vec<RouteMetrics>,
    /// By index of [`Table::routes`], then of the route's limits: each limit's 429.
    pub refusals: Vec<Vec<Arc<Refusal>>>,
    /// Route `_none`.
    pub no_route: RouteMetrics,
    /// By index of `Consumers::plans`.
    pub plans: Vec<PlanMetrics>,
    /// Requests on `anonymous_plan` (label `_anonymous`).
    pub anonymous: Option<PlanMetrics>,
}

impl Live {
    /// Resolve `table`'s runtime resources, taking over `previous`'s upstream clients where
    /// the settings are equal. `tls` holds the loaded client configuration of each https
    /// upstream, by index of [`Table::upstreams`]; `workers` is the process's worker count.
    pub fn new(
        table: Table,
        file: File,
        tls: &[Option<Arc<rustls::ClientConfig>>],
        previous: Option<&Live>,
        metrics: &Metrics,
        workers: usize,
    ) -> Live {
        let upstreams = table
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                previous
                    .and_then(|p| p.upstreams.iter().find(|u| u.spec() == spec))
                    .cloned()
                    .unwrap_or_else(|| {
                        let tls = tls.get(i).cloned().flatten();
                        Arc::new(Upstream::new(spec, tls, workers))
                    })
            })
            .collect();
        let routes = table.routes.iter().map(|r| metrics.route(r)).collect();
        let refusals = table.routes.iter().map(Refusal::all).collect();
        let consumers = &table.consumers;
        Live {
            upstreams,
            routes,
            refusals,
            no_route: metrics.no_route(),
            plans: consumers
                .plans
                .iter()
                .map(|p| metrics.plan(&p.name))
                .collect(),
            anonymous: consumers.anonymous.map(|_| metrics.plan(ANONYMOUS)),
            table,
            file,
        }
    }
}
