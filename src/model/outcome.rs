//! The one outcome of each request (the `outcome` label of `sluice_requests_total`).

/// What became of a request, by the precedence of SPEC §5: limited > rejected_identity >
/// store_error_denied > shadow_limited > store_error_allowed > forwarded; a 502/504 from the
/// upstream side is upstream_error; a request refused before or while being read is
/// rejected_request; one whose client went away before it was decided is client_gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Forwarded,
    Limited,
    ShadowLimited,
    StoreErrorAllowed,
    StoreErrorDenied,
    RejectedIdentity,
    NoRoute,
    UpstreamError,
    /// A path that does not normalize safely, a body that cannot be framed, CONNECT.
    RejectedRequest,
    /// The client went away while its limits were being decided (nginx logs it 499): never
    /// forwarded, and charged or not as the store call that was cut off went.
    ClientGone,
}

impl Outcome {
    pub const ALL: [Outcome; 10] = [
        Outcome::Forwarded,
        Outcome::Limited,
        Outcome::ShadowLimited,
        Outcome::StoreErrorAllowed,
        Outcome::StoreErrorDenied,
        Outcome::RejectedIdentity,
        Outcome::NoRoute,
        Outcome::UpstreamError,
        Outcome::RejectedRequest,
        Outcome::ClientGone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::StoreErrorAllowed => "store_error_allowed",
            Outcome::StoreErrorDenied => "store_error_denied",
            Outcome::RejectedIdentity => "rejected_identity",
            Outcome::NoRoute => "no_route",
            Outcome::UpstreamError => "upstream_error",
            Outcome::RejectedRequest => "rejected_request",
            Outcome::ClientGone => "client_gone",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_each_outcome_at_its_own_index() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{o:?}");
        }
    }
}
