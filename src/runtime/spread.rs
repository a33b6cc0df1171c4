//! Spreading connections over the workers: the worker that accepts a connection keeps it
//! unless another holds fewer open connections, which is then handed it (HAProxy's threads
//! balance the same way).
//!
//! Every worker waits on the same accept queue, and the kernel wakes all of them for a new
//! connection; the first one awake accepts everything queued before the others run. Without
//! spreading, a client pool opening its connections at once (wrk, a load balancer, a mesh
//! sidecar after a restart) lands mostly on one worker: measured with two workers and 64
//! connections, one worker served 324 CPU ticks and the other 122 in the same 5 s, and the
//! busy one set the throughput and the tail latency.
//!
//! Counts are per worker over all data listeners and are also the
//! `sluice_connections_open{worker}` gauge. A handed-over connection is moved as a plain
//! socket (deregistered from the accepting worker's poller, registered in the receiver's)
//! before any PROXY header or TLS byte is read.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus::IntGauge;
use tokio::sync::mpsc;

/// One listener's connections, spread over the workers serving it.
#[derive(Clone)]
pub struct Spread {
    /// Open connections per worker (every data listener's), indexed from 0.
    open: Arc<[IntGauge]>,
    /// Each worker's inbox of connections handed to it on this listener.
    inbox: Arc<[mpsc::UnboundedSender<Handover>]>,
}

/// A connection accepted by one worker for another.
pub struct Handover {
    pub stream: std::net::TcpStream,
    pub peer: SocketAddr,
    /// Counted on the receiving worker already, so a burst of accepts sees it.
    pub open: Open,
}

/// One open connection on a worker's count; uncounted when dropped (the connection's task
/// ended, or a handover was never received).
pub struct Open(IntGauge);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// What one worker needs to take part: the listener's spread, its own index and inbox.
pub struct Share {
    pub spread: Spread,
    pub worker: usize,
    pub inbox: mpsc::UnboundedReceiver<Handover>,
}

impl Spread {
    /// A spread over the workers whose open-connection gauges are `open` (one per worker,
    /// shared by every listener's spread), and each worker's [`Share`] of it, in order.
    pub fn shares(open: Arc<[IntGauge]>) -> Vec<Share> {
        let (tx, rx): (Vec<_>, Vec<_>) = open.iter().map(|_| mpsc::unbounded_channel()).unzip();
        let spread = Spread {
            open,
            inbox: tx.into(),
        };
        rx.into_iter()
            .enumerate()
            .map(|(worker, inbox)| Share {
                spread: spread.clone(),
                worker,
                inbox,
            })
            .collect()
    }

    /// The worker that should serve a connection `me` just accepted: `me`, unless another
    /// still receiving holds fewer open connections (then the one holding fewest; ties go
    /// to `me`, then to the lower index). The connection is counted on it.
    pub fn assign(&self, me: usize) -> (usize, Open) {
        let mut to = me;
        let mut least = self.open[me].get();
        for (i, g) in self.open.iter().enumerate() {
            let n = g.get();
            if n < least && !self.inbox[i].is_closed() {
                (to, least) = (i, n);
            }
        }
        (to, self.count(to))
    }

    /// Count one more open connection on `worker`.
    pub fn count(&self, worker: usize) -> Open {
        let g = self.open[worker].clone();
        g.inc();
        Open(g)
    }

    /// Hand a connection to `worker`; given back if that worker has stopped receiving.
    pub fn hand(&self, worker: usize, h: Handover) -> Result<(), Handover> {
        self.inbox[worker].send(h).map_err(|e| e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges(n: usize) -> Arc<[IntGauge]> {
        (0..n)
            .map(|i| IntGauge::new(format!("open_{i}"), "test").unwrap())
            .collect()
    }

    #[test]
    fn a_burst_accepted_by_one_worker_ends_up_even() {
        let open = gauges(3);
        let shares = Spread::shares(open.clone());
        let spread = &shares[0].spread;
        // Worker 0 accepts all 10: it keeps one whenever no other holds fewer.
        let held: Vec<_> = (0..10).map(|_| spread.assign(0)).collect();
        let on: Vec<usize> = held.iter().map(|(w, _)| *w).collect();
        assert_eq!(on, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        let counts: Vec<i64> = open.iter().map(IntGauge::get).collect();
        assert_eq!(counts, [4, 3, 3]);
        // Closing connections uncounts them; the next goes to the emptiest worker.
        drop(held);
        assert!(open.iter().all(|g| g.get() == 0));
        open[0].add(2);
        open[2].add(1);
        assert_eq!(spread.assign(0).0, 1);
    }

    #[test]
    fn ties_stay_with_the_accepting_worker() {
        let shares = Spread::shares(gauges(2));
        let (a, _a) = shares[1].spread.assign(1);
        assert_eq!(a, 1);
        let (b, _b) = shares[0].spread.assign(0);
        assert_eq!(b, 0);
    }

    #[test]
    fn a_worker_that_stopped_receiving_is_never_chosen() {
        let open = gauges(2);
        let mut shares = Spread::shares(open.clone());
        open[0].add(5);
        shares[1].inbox.close();
        let (to, _open) = shares[0].spread.assign(0);
        assert_eq!(to, 0);
        assert_eq!(open[0].get(), 6);
    }

    #[test]
    fn a_handover_never_received_is_uncounted() {
        let open = gauges(2);
        let shares = Spread::shares(open.clone());
        let spread = shares[0].spread.clone();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let connect = || std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let handover = |open| {
            let stream = connect();
            let peer = stream.local_addr().unwrap();
            Handover { stream, peer, open }
        };
        let sent = spread.hand(1, handover(spread.count(1)));
        assert!(sent.is_ok(), "worker 1 is receiving");
        assert_eq!(open[1].get(), 1, "counted while in the inbox");
        drop(shares);
        assert_eq!(open[1].get(), 0, "the inbox's drop uncounted it");
        // With the inbox gone, a handover is given back, still counted until dropped.
        let back = spread.hand(1, handover(spread.count(1)));
        assert_eq!(open[1].get(), 1);
        drop(back);
        assert_eq!(open[1].get(), 0);
    }
}
