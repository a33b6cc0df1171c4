//! Small, separately tested header rules (in the style of rust-rpxy's header modules).

pub mod content_length;
pub mod forwarded;
pub mod h2;
pub mod hop_by_hop;
pub mod host;
pub mod ratelimit;
pub mod request_id;
pub mod underscore;
