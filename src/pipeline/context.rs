//! One request's context, carried through every phase (in the manner of Pingora's per-request
//! `CTX`): what was read from the request once, what each phase decided, and what the log
//! phase needs at the end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;
use http::request::Parts;
use http::Uri;

use super::admit::Admission;
use super::headers::request_id;
use super::live::Live;
use super::settle::{Leases, Owed};
use crate::model::consumer::PlanOf;
use crate::model::identity::IpText;
use crate::model::outcome::Outcome;

/// What the listener knows about the connection a request came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The TCP peer.
    pub peer: Peer,
    /// The client a PROXY header named (believed only from `trusted_proxies`).
    pub proxied: Option<Peer>,
    /// A PROXY header that named no client (`LOCAL`: the proxy's own health check;
    /// `UNKNOWN`, or an address family without one, such as a unix socket front end). A
    /// proxy that speaks PROXY works below HTTP and writes no forwarding headers, so those on
    /// this connection are the client's own: not believed, however trusted the peer.
    pub unnamed: bool,
    /// Whether the connection is TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
    /// Its listener's phase; held by whatever outlives the connection's requests (an
    /// upgraded tunnel), so the drain waits for that too and the cut ends it. `None`: a
    /// connection no drain concerns (tests).
    pub drain: Option<Drain>,
}

/// Where a listener is in its life, as its connections see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Serving,
    /// No new requests: each connection finishes what it has begun, then closes.
    Draining,
    /// The drain deadline passed: whatever is still open is closed now.
    Cut,
}

/// A listener's phase, watched; the listener's drain ends once every holder has let go.
pub type Drain = tokio::sync::watch::Receiver<Phase>;

impl ConnInfo {
    /// The client: the one the PROXY header named when it is `believed`, else the TCP peer.
    pub fn client(&self, believed: bool) -> &Peer {
        match &self.proxied {
            Some(client) if believed => client,
            _ => &self.peer,
        }
    }

    /// A connection from `peer`; `proxied`: the client its PROXY header named.
    pub fn new(peer: SocketAddr, proxied: Option<SocketAddr>, tls: bool) -> ConnInfo {
        ConnInfo {
            peer: Peer::new(peer),
            proxied: proxied.map(Peer::new),
            unnamed: false,
            tls,
            drain: None,
        }
    }

    /// A cleartext connection from `peer` (the admin listener, tests).
    pub fn plain(peer: SocketAddr) -> ConnInfo {
        ConnInfo::new(peer, None, false)
    }
}

/// A client's address, and its IP as the text `X-Forwarded-For` carries upstream. The text is
/// written once per connection: each request's copy of it is a reference count, where
/// formatting it would cost a copy and an allocation per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The IP (an IPv4-mapped IPv6 one as IPv4), as `to_string` writes it.
    pub text: HeaderValue,
}

impl Peer {
    pub fn new(addr: SocketAddr) -> Peer {
        let text = IpText::of(addr.ip().to_canonical());
        let text = HeaderValue::from_maybe_shared(Bytes::copy_from_slice(text.as_bytes()))
            .expect("an IP's text is a valid header value");
        Peer { addr, text }
    }
}

pub struct Ctx {
    /// The table this request runs on, start to end, whatever reloads happen meanwhile.
    pub live: Arc<Live>,
    pub started: Instant,
    /// The connection the request came on (shared by its requests).
    pub conn: Arc<ConnInfo>,
    /// Whether the client a PROXY header named is believed: the peer is a trusted proxy.
    pub proxied: bool,
    /// Whether the forwarding headers (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`) are
    /// believed: the peer (after PROXY) is a trusted proxy, and no PROXY header said the
    /// connection named no client ([`ConnInfo::unnamed`]).
    pub forwarding_believed: bool,
    pub rid: HeaderValue,
    /// The request head, without its target (read once into `uri`).
    pub parts: Parts,
    pub uri: Uri,
    /// The request's host ([`headers::host`](super::headers::host)), set by the request
    /// filter; the upstream gets that same host.
    pub host: Option<HeaderValue>,
    /// The normalized path, when it differs from the target's.
    pub normalized: Option<String>,
    /// Index of the matched route in the table.
    pub route: Option<usize>,
    pub admission: Admission,
    /// On a route with `consumers:`, whose plan the request was decided on.
    pub plan: Option<PlanOf>,
    /// The outcome so far (set by the phase that answers or forwards).
    pub outcome: Outcome,
    /// The upstream target that answered.
    pub upstream: Option<std::sync::Arc<str>>,
    /// Seconds to the upstream's response head, and its `STATUS_CLASSES` index.
    pub upstream_time: Option<(f64, usize)>,
    /// Limits charged by the answer, until it is in (dropped unsettled: the client left).
    /// (Boxed, as `leases`: every request's future holds the context, and most have neither.)
    pub owed: Option<Box<Owed>>,
    /// Concurrency slots held, until the response body is done with them.
    pub leases: Option<Box<Leases>>,
}

impl Ctx {
    pub fn new(live: Arc<Live>, mut parts: Parts, conn: Arc<ConnInfo>) -> Ctx {
        // A PROXY header is only believed from a proxy the operator trusts; from anyone else
        // it would let a client pick the address its `by: ip` limits count.
        let proxied = conn.proxied.is_some()
            && live
                .table
                .client_ip
                .is_trusted(conn.peer.addr.ip().to_canonical());
        let forwarding_believed = !conn.unnamed
            && live
                .table
                .client_ip
                .is_trusted(conn.client(proxied).addr.ip().to_canonical());
        let uri = std::mem::take(&mut parts.uri);
        Ctx {
            live,
            started: Instant::now(),
            conn,
            proxied,
            forwarding_believed,
            rid: request_id::get_or_make(&parts.headers),
            parts,
            uri,
            host: None,
            normalized: None,
            route: None,
            admission: Admission::default(),
            plan: None,
            // What a request dropped before any phase set its outcome is: its client left
            // while it was being decided (every earlier phase is synchronous).
            outcome: Outcome::ClientGone,
            upstream: None,
            upstream_time: None,
            owed: None,
            leases: None,
        }
    }

    /// The peer the request counts as from: the TCP peer, or the client a trusted proxy named
    /// in a PROXY header.
    pub fn peer(&self) -> &Peer {
        self.conn.client(self.proxied)
    }

    /// The path that is matched, limited, logged and forwarded.
    pub fn path(&self) -> &str {
        self.normalized
            .as_deref()
            .unwrap_or_else(|| self.uri.path())
    }
}
