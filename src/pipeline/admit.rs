//! Stage 3 — limit: turn the route's limits into one all-or-nothing store call, apply the
//! store-error policy, and say whether the request may pass and which limit to advertise.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;

use crate::limiter::algo::{refusal_after, Algorithm, Code, Decision, Op};
use crate::limiter::deny::DenyCache;
use crate::limiter::key::Material;
use crate::limiter::store;
use crate::limiter::store::memory::MemoryStore;
use crate::limiter::store::Store;
use crate::limiter::store::{LimitCall, StoreError};
use crate::model::consumer::{ConsumerMode, Consumers, PlanOf};
use crate::model::limit::{Charge, Cost, KeyPart, LimitRule};
use crate::model::outcome::Outcome;
use crate::model::policy::{OnError, OnMissing};
use crate::model::route::Route;
use crate::pipeline::headers::ratelimit::retry_after_secs;
use crate::pipeline::identify::{one_field, Identity};
use crate::pipeline::respond::{GatewayError, Refusal};

/// The per-limit label of `sluice_limit_decisions_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionLabel {
    Allowed,
    Limited,
    ShadowLimited,
    Error,
}

impl DecisionLabel {
    pub const ALL: [DecisionLabel; 4] = [
        DecisionLabel::Allowed,
        DecisionLabel::Limited,
        DecisionLabel::ShadowLimited,
        DecisionLabel::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DecisionLabel::Allowed => "allowed",
            DecisionLabel::Limited => "limited",
            DecisionLabel::ShadowLimited => "shadow_limited",
            DecisionLabel::Error => "error",
        }
    }
}

/// Whether the request passes the limit stage.
#[derive(Debug)]
pub enum Verdict {
    /// Forward it; the outcome it counts as if the upstream answers (`forwarded`,
    /// `shadow_limited` or `store_error_allowed`, by precedence).
    Pass(Outcome),
    /// Answer it here (401, 400, 429, 503).
    Refuse(GatewayError),
}

/// What the limit stage decided, kept for the respond and log phases.
#[derive(Debug, Default)]
pub struct Admission {
    /// For each limit that was decided: its index in the route and its label.
    pub decisions: Vec<(usize, DecisionLabel)>,
    /// The limit to advertise in RateLimit headers, with its decision.
    pub headline: Option<(usize, Decision)>,
    /// The store call, if one was made.
    pub store: Option<StoreCall>,
    /// What the admitted request still owes or holds (boxed: most requests have nothing).
    pub after: Option<Box<After>>,
}

/// The limits an admitted request settles after its answer: those charged by the answer
/// (their probe passed) and the concurrency slots it took, with the call id naming the
/// slots and whether the embedded store decided (`on_error: local`).
#[derive(Debug)]
pub struct After {
    pub id: u64,
    pub local: bool,
    /// (limit index, its probe call).
    pub owed: Vec<(usize, LimitCall)>,
    /// (limit index, its call), for each slot taken.
    pub leases: Vec<(usize, LimitCall)>,
    /// Release calls for the slots a failed store call may still take when it runs (see
    /// [`super::settle::release_orphans`]).
    pub orphans: Vec<LimitCall>,
}

impl After {
    fn new(id: u64, local: bool, orphans: Vec<LimitCall>) -> After {
        After {
            id,
            local,
            owed: Vec::new(),
            leases: Vec::new(),
            orphans,
        }
    }
}

/// One store round trip: how long it took, and how it failed.
#[derive(Debug)]
pub struct StoreCall {
    pub took: Duration,
    pub error: Option<StoreError>,
}

/// The identity material of a request for one limit (hashed into its key by
/// [`Material::store_key`]). `None`: the limit does not apply (`on_missing: skip`).
pub fn identity_material(
    rule: &LimitRule,
    who: &Identity<'_>,
) -> Result<Option<Material>, GatewayError> {
    let mut material = Material::default();
    for part in &rule.by {
        let v = match part {
            KeyPart::Ip => Some(who.ip_key.as_str()),
            KeyPart::ApiKey => who.api_key()?,
            KeyPart::User => who.user()?,
            KeyPart::Header(h) => who.header(h)?,
            KeyPart::Route => Some(""),
            KeyPart::Consumer => who.consumer,
        };
        match v {
            Some(v) => material.part(v),
            None => {
                return match rule.on_missing {
                    OnMissing::Skip => Ok(None),
                    OnMissing::Reject => Err(GatewayError::MissingIdentity {
                        limit: rule.name.clone(),
                    }),
                    OnMissing::Ip => Ok(Some(Material::ip_fallback(&who.ip_key))),
                };
            }
        }
    }
    Ok(Some(material))
}

fn cost(rule: &LimitRule, headers: &HeaderMap) -> Result<u64, GatewayError> {
    match &rule.cost {
        Cost::Static(c) => Ok(*c),
        // Given twice, the gateway would charge one value while the upstream may act on the
        // other.
        Cost::Header { name, default, max } => match one_field(headers, name)? {
            None => Ok(*default),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .filter(|c| (1..=*max).contains(c))
                .ok_or_else(|| GatewayError::BadCost {
                    header: name.to_string(),
                    max: *max,
                }),
        },
    }
}

/// The store calls of one request: built synchronously from its identity, before any await.
pub struct Plan {
    calls: Vec<LimitCall>,
    /// For each call, the index of its limit in the route.
    which: Vec<usize>,
    /// Shadow limits that would have refused the request before any call (a missing identity
    /// with `on_missing: reject`, a bad cost header): counted `shadow_limited`, never refused.
    shadowed: Vec<usize>,
}

/// Which plan a request on a route with `consumers:` gets: its consumer's, else the anonymous
/// plan, else none (`optional`) or 401 (`required`).
pub fn plan_of(
    mode: ConsumerMode,
    consumers: &Consumers,
    api_key: Option<&str>,
) -> Result<Option<PlanOf>, GatewayError> {
    if let Some(i) = api_key.and_then(|k| consumers.find(k)) {
        return Ok(Some(PlanOf::Consumer(i)));
    }
    match (consumers.anonymous, mode) {
        (Some(p), _) => Ok(Some(PlanOf::Anonymous(p))),
        (None, ConsumerMode::Optional) => Ok(None),
        (None, ConsumerMode::Required) => Err(GatewayError::UnknownConsumer {
            key_present: api_key.is_some(),
        }),
    }
}

/// Resolve each limit's identity and cost. A missing identity with `on_missing: reject`, a bad
/// cost header, or (on a `consumers: required` route) no known consumer answers the request
/// right away; for a shadow limit the first two are only counted and logged. Whose plan
/// applies is set in `whose` as soon as it is known, so that a request refused after that
/// (a bad cost header) counts on its plan too.
pub fn plan<'a>(
    route: &Route,
    who: &mut Identity<'a>,
    headers: &HeaderMap,
    consumers: &'a Consumers,
    whose: &mut Option<PlanOf>,
) -> Result<Plan, GatewayError> {
    let plan_of = match route.consumers {
        Some(mode) => plan_of(mode, consumers, who.api_key()?)?,
        None => None,
    };
    *whose = plan_of;
    let plan = plan_of.map(|p| p.plan(consumers));
    if let Some(PlanOf::Consumer(i)) = plan_of {
        who.consumer = Some(&consumers.list[i].name);
    }
    let mut calls = Vec::with_capacity(route.limits.len());
    let mut which = Vec::with_capacity(route.limits.len());
    let mut shadowed = Vec::new();
    for (i, rule) in route.limits.iter().enumerate() {
        match limit_call(rule, plan, plan_of, who, headers) {
            Ok(Some(call)) => {
                calls.push(call);
                which.push(i);
            }
            Ok(None) => {}
            // An identity given twice is a malformed request, shadow limit or not.
            Err(e) if rule.shadow && !matches!(e, GatewayError::AmbiguousIdentity(_)) => {
                tracing::info!(route = %route.name, limit = %rule.name, refusal = %e.status(), "shadow limit would have refused this request");
                shadowed.push(i);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Plan {
        calls,
        which,
        shadowed,
    })
}

/// The store call of one limit for this request (`None`: the limit does not apply to it).
fn limit_call(
    rule: &LimitRule,
    plan: Option<usize>,
    plan_of: Option<PlanOf>,
    who: &Identity<'_>,
    headers: &HeaderMap,
) -> Result<Option<LimitCall>, GatewayError> {
    let material = match (rule.plan, plan_of) {
        (None, _) => identity_material(rule, who)?,
        // Another plan's limit, or no plan at all: not this request's.
        (Some(p), _) if Some(p) != plan => None,
        (Some(_), Some(PlanOf::Anonymous(_))) => Some(Material::anonymous(&who.ip_key)),
        (Some(_), _) => identity_material(rule, who)?,
    };
    let Some(material) = material else {
        return Ok(None);
    };
    // A limit charged by the answer passes while a cost-1 request would; a concurrency
    // limit takes one slot.
    let (op, cost) = match rule.charge {
        Charge::Request => (Op::Decide, cost(rule, headers)?),
        Charge::Answer { .. } => (Op::Probe, 1),
        Charge::InFlight => (Op::Decide, 1),
    };
    Ok(Some(LimitCall {
        key: material.store_key(&rule.key_base),
        params: rule.params,
        cost,
        shadow: rule.shadow,
        op,
    }))
}

/// The stores a decision may use: the configured one, the embedded one for `on_error: local`,
/// and the deny cache in front of a remote store.
pub struct Stores<'a> {
    pub store: &'a Store,
    pub local: &'a MemoryStore,
    pub deny: Option<&'a DenyCache>,
}

/// Decide the planned limits in one store call and apply the route's store-error policy.
/// `refusals`: the route's 429s, by index of its limits.
pub async fn decide(
    route: &Route,
    refusals: &[Arc<Refusal>],
    plan: Plan,
    stores: Stores<'_>,
) -> (Admission, Verdict) {
    let mut adm = Admission::default();
    let Plan {
        calls,
        which,
        shadowed,
        ..
    } = plan;
    // shadow_limited outranks store_error_allowed and forwarded.
    let (allowed_as, error_allowed_as) = if shadowed.is_empty() {
        (Outcome::Forwarded, Outcome::StoreErrorAllowed)
    } else {
        (Outcome::ShadowLimited, Outcome::ShadowLimited)
    };
    adm.decisions = shadowed
        .into_iter()
        .map(|i| (i, DecisionLabel::ShadowLimited))
        .collect();
    if calls.is_empty() {
        return (adm, Verdict::Pass(allowed_as));
    }

    let started = Instant::now();
    // Certainly refused, as the store said a moment ago: answer without asking again. Only
    // the refusing limit counts a decision (the others were not decided). Not for
    // concurrency limits: a slot may free at any moment.
    let cacheable = |c: &LimitCall| !c.shadow && c.params.algorithm != Algorithm::Concurrency;
    if let Some(deny) = stores.deny {
        let mut hit: Option<(usize, Decision)> = None;
        for (k, c) in calls.iter().enumerate().filter(|(_, c)| cacheable(c)) {
            if let Some(d) = deny.check(&c.key, c.cost, started) {
                if hit.is_none_or(|(_, h)| d.retry_after_us > h.retry_after_us) {
                    hit = Some((which[k], d));
                }
            }
        }
        if let Some((i, d)) = hit.filter(|_| stores.store.healthy()) {
            adm.decisions.push((i, DecisionLabel::Limited));
            adm.headline = route.limits[i].headers.then_some((i, d));
            return (adm, refuse(refusals, i, d));
        }
    }
    let id = store::next_id();
    let result = stores.store.decide_as(&calls, id).await;
    let mut call = StoreCall {
        took: started.elapsed(),
        error: None,
    };
    let mut passes_as = allowed_as;
    let mut local = false;
    let mut orphans = Vec::new();
    let decisions = match result {
        Ok(d) => {
            adm.store = Some(call);
            if let Some(deny) = stores.deny {
                // Remember a refusal, and an admission that used the last unit when the
                // request passed (so it was charged): until a unit is back, the store refuses.
                // An admission's entries answer with their own wait, which is the request's
                // only if no other limit it emptied waits longer by an amount its reply does
                // not say (a sliding algorithm's): then none are kept.
                let charged = store::request_allowed(&calls, &d);
                let said = |(c, dec): &(&LimitCall, &Decision)| {
                    !cacheable(c) || dec.remaining > 0 || refusal_after(&c.params, dec).is_some()
                };
                let exact = charged && calls.iter().zip(&d).all(|p| said(&p));
                for (c, dec) in calls.iter().zip(&d).filter(|(c, _)| cacheable(c)) {
                    if dec.code == Code::Limited {
                        deny.refused(&c.key, c.cost, *dec, started);
                    } else if exact && c.op == Op::Decide {
                        if let Some(next) = refusal_after(&c.params, dec) {
                            deny.refused(&c.key, 1, next, started);
                        }
                    }
                }
            }
            d
        }
        Err(e) => {
            call.error = Some(e.clone());
            adm.store = Some(call);
            // A call that was sent may still run when Redis reads it: free the slots it would
            // take. (Nothing passes an open breaker.)
            if e != StoreError::BreakerOpen {
                orphans = calls
                    .iter()
                    .filter(|c| c.params.algorithm == Algorithm::Concurrency && c.op == Op::Decide)
                    .map(|c| LimitCall {
                        op: Op::Release,
                        ..c.clone()
                    })
                    .collect();
            }
            if route.on_store_error == OnError::Local {
                passes_as = error_allowed_as;
                local = true;
                stores.local.decide_as(&calls, id)
            } else {
                let verdict = match route.on_store_error {
                    OnError::Deny => Verdict::Refuse(GatewayError::StoreUnavailable(e)),
                    _ => Verdict::Pass(error_allowed_as),
                };
                adm.decisions
                    .extend(which.iter().map(|&i| (i, DecisionLabel::Error)));
                if !orphans.is_empty() {
                    adm.after = Some(Box::new(After::new(id, false, orphans)));
                }
                return (adm, verdict);
            }
        }
    };

    // Among refusing enforced limits, the longest wait is the one to report; otherwise the
    // most constraining enforced limit: lowest remaining, ties broken by the longest reset.
    let mut refused: Option<(usize, Decision)> = None;
    let mut tightest: Option<(usize, Decision)> = None;
    for (k, d) in decisions.iter().enumerate() {
        let i = which[k];
        let rule = &route.limits[i];
        let label = match (d.code, rule.shadow) {
            (Code::Allowed, _) => DecisionLabel::Allowed,
            (_, true) => DecisionLabel::ShadowLimited,
            (_, false) => DecisionLabel::Limited,
        };
        adm.decisions.push((i, label));
        if rule.shadow {
            if label == DecisionLabel::ShadowLimited {
                // shadow_limited outranks store_error_allowed.
                passes_as = Outcome::ShadowLimited;
                tracing::info!(route = %route.name, limit = %rule.name, "shadow limit would have refused this request");
            }
            continue;
        }
        if d.code != Code::Allowed
            && refused.is_none_or(|(_, r)| d.retry_after_us > r.retry_after_us)
        {
            refused = Some((i, *d));
        }
        if rule.headers && tightest.is_none_or(|(_, t)| d.tighter_than(&t)) {
            tightest = Some((i, *d));
        }
    }
    if let Some((i, d)) = refused {
        // A hidden limit (`headers: false`) still gives its Retry-After, but no fields.
        adm.headline = route.limits[i].headers.then_some((i, d));
        // Refused by the embedded store after Redis failed: the failed call's slots are
        // still freed in Redis, as on any other failure.
        if !orphans.is_empty() {
            adm.after = Some(Box::new(After::new(id, local, orphans)));
        }
        return (adm, refuse(refusals, i, d));
    }
    adm.headline = tightest;
    let mut after = After::new(id, local, orphans);
    for ((c, d), &i) in calls.into_iter().zip(&decisions).zip(&which) {
        match route.limits[i].charge {
            Charge::Answer { .. } => after.owed.push((i, c)),
            Charge::InFlight if d.allowed() => after.leases.push((i, c)),
            _ => {}
        }
    }
    if !after.owed.is_empty() || !after.leases.is_empty() || !after.orphans.is_empty() {
        adm.after = Some(Box::new(after));
    }
    (adm, Verdict::Pass(passes_as))
}

/// Refused by limit `i` with decision `d` (which the answer advertises).
fn refuse(refusals: &[Arc<Refusal>], i: usize, d: Decision) -> Verdict {
    Verdict::Refuse(GatewayError::Limited {
        refusal: refusals[i].clone(),
        retry_after: retry_after_secs(d.retry_after_us),
    })
}
