//! `GET|DELETE /admin/consumers/{name}`: how much of its plan a consumer has used (without
//! consuming), or reset all its plan limits. Keys are derived as requests derive them (the
//! consumer's name hashed under each plan limit's base), so what is shown is what is charged.

use serde_json::json;

use super::limits::{reset_key, state};
use super::{json_reply, no_content, problem, Body};
use crate::limiter::key::Material;
use crate::model::consumer::Consumer;
use crate::pipeline::Gateway;
use http::{Response, StatusCode};

/// The store keys of `c`'s plan limits, with the limits.
fn keys<'t>(
    plans: &'t [crate::model::consumer::Plan],
    c: &Consumer,
) -> impl Iterator<Item = (&'t crate::model::limit::LimitRule, String)> {
    let name = c.name.clone();
    plans[c.plan]
        .limits
        .iter()
        .map(move |rule| (rule, Material::of([&*name]).store_key(&rule.key_base)))
}

pub(crate) async fn peek(gw: &Gateway, name: &str) -> Response<Body> {
    let live = gw.live.load_full();
    let consumers = &live.table.consumers;
    let Some(c) = consumers.by_name(name).map(|i| &consumers.list[i]) else {
        return problem(StatusCode::NOT_FOUND, &format!("no consumer `{name}`"));
    };
    let plan = &consumers.plans[c.plan];
    let mut limits = Vec::with_capacity(plan.limits.len());
    for (rule, key) in keys(&consumers.plans, c) {
        match state(gw, &key, &rule.params).await {
            Ok(mut doc) => {
                // The limit's own name within the plan (its metric label is `plan/limit`).
                let own = rule.name.split_once('/').map_or(&*rule.name, |(_, l)| l);
                doc["limit"] = json!(own);
                limits.push(doc);
            }
            Err(e) => return problem(StatusCode::SERVICE_UNAVAILABLE, &format!("store: {e}")),
        }
    }
    json_reply(
        StatusCode::OK,
        &json!({ "name": &*c.name, "plan": &*plan.name, "limits": limits }),
    )
}

pub(crate) async fn reset(gw: &Gateway, name: &str) -> Response<Body> {
    let live = gw.live.load_full();
    let consumers = &live.table.consumers;
    let Some(c) = consumers.by_name(name).map(|i| &consumers.list[i]) else {
        return problem(StatusCode::NOT_FOUND, &format!("no consumer `{name}`"));
    };
    // Every key, whatever the store says about one: the embedded copies are reset all the
    // same (see `reset_key`), and the first error is the answer.
    let mut failed = None;
    for (_, key) in keys(&consumers.plans, c) {
        if let Err(e) = reset_key(gw, &key).await {
            failed.get_or_insert(e);
        }
    }
    if let Some(e) = failed {
        return problem(StatusCode::SERVICE_UNAVAILABLE, &format!("store: {e}"));
    }
    tracing::info!(consumer = name, "plan limits reset through the admin API");
    no_content()
}
