//! Placeholder: implemented in the algorithms branch.
use super::{Params, Verdict};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State;

pub fn decide(
    _p: &Params,
    _s: &mut Option<State>,
    _now: u64,
    _cost: u64,
    _commit: bool,
) -> Verdict {
    unimplemented!()
}
