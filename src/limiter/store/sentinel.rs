//! Following a Sentinel failover as it happens. fred asks a sentinel for the primary only when
//! it connects, and does not listen to Sentinel's events: after a failover whose old primary
//! stays up, a gateway kept deciding there until Sentinel reconfigured it (its periodic check,
//! about 10 s), and what it charged meanwhile was lost with the old primary's data. So one
//! task per gateway subscribes to `+switch-master` on a sentinel (any that answers, in turn)
//! and, when the service it serves switched, has every connection reconnect, which asks the
//! sentinels for the new primary.

use std::sync::Weak;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::redis::RedisStore;

/// How long connecting to a sentinel and its answer to SUBSCRIBE may take.
const CONNECT_WAIT: Duration = Duration::from_millis(500);
/// The pause before trying the next sentinel.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Watch `sentinels` (`host:port`) for `+switch-master` of `service` while `store` lives.
pub(super) async fn follow(
    store: Weak<RedisStore>,
    sentinels: Vec<(String, u16)>,
    service: String,
) {
    // The payload: `<service> <old ip> <old port> <new ip> <new port>`.
    let prefix = format!("{service} ");
    for (host, port) in sentinels.iter().cycle() {
        if store.strong_count() == 0 {
            return;
        }
        match listen(host, *port, &prefix, &store).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(sentinel = %format!("{host}:{port}"), error = %e, "sentinel events: trying the next sentinel")
            }
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

/// Subscribe on one sentinel and reconnect `store` at each switch of the service, until the
/// connection ends (an error) or the store is gone (`Ok`).
async fn listen(
    host: &str,
    port: u16,
    prefix: &str,
    store: &Weak<RedisStore>,
) -> std::io::Result<()> {
    let timed_out = || std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer");
    let conn = tokio::time::timeout(CONNECT_WAIT, TcpStream::connect((host, port)))
        .await
        .map_err(|_| timed_out())??;
    let (read, mut write) = conn.into_split();
    write
        .write_all(b"*2\r\n$9\r\nSUBSCRIBE\r\n$14\r\n+switch-master\r\n")
        .await?;
    let mut lines = BufReader::new(read).lines();
    // The subscription's confirmation first: a sentinel that takes the connection and never
    // answers is passed over.
    let first = tokio::time::timeout(CONNECT_WAIT, lines.next_line())
        .await
        .map_err(|_| timed_out())??;
    if let Some(refused) = first.filter(|l| l.starts_with('-')) {
        return Err(std::io::Error::other(refused));
    }
    loop {
        // Polled with a bound, so a gateway that stopped is noticed without an event.
        let line = match tokio::time::timeout(Duration::from_secs(5), lines.next_line()).await {
            Err(_) => {
                if store.strong_count() == 0 {
                    return Ok(());
                }
                continue;
            }
            Ok(line) => line?,
        };
        let Some(line) = line else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the sentinel closed the connection",
            ));
        };
        // A bulk string's content is a line of its own; a payload holds no line break.
        if let Some(addresses) = line.strip_prefix(prefix) {
            let Some(store) = store.upgrade() else {
                return Ok(());
            };
            tracing::warn!(
                switch = addresses,
                "sentinel switched the primary: reconnecting every connection"
            );
            store.reconnect_all();
        }
    }
}
