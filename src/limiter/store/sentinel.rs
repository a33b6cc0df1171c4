//! Following a Sentinel failover as it happens. fred asks a sentinel for the primary only when
//! it connects, and does not listen to Sentinel's events: after a failover whose old primary
//! stays up, a gateway kept deciding there until Sentinel reconfigured it (its periodic check,
//! about 10 s), and what it charged meanwhile was lost with the old primary's data. So one
//! task per gateway, on a sentinel (any that answers, in turn):
//! - asks where the primary is, and has connections that are elsewhere reconnect (a switch
//!   announced while it was not subscribed is caught so);
//! - subscribes to `+switch-master`, and when the service switches, has every connection
//!   reconnect, which asks the sentinels for the new primary;
//! - checks, after each reconnect, that the connections did reach the primary named (a
//!   sentinel that has not heard of the switch yet may still name the old one), and
//!   reconnects again until they do;
//! - PINGs an idle subscription, so a sentinel gone without a word is noticed and another one
//!   asked.
//!
//! And at start, before fred connects, the sentinels that answer go first
//! ([`answering_first`]).

use std::sync::Weak;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;

use fred::types::config::Server;

use super::redis::RedisStore;

/// How long a sentinel gets to connect, and then to answer a PING, at start.
pub(super) const PROBE: Duration = Duration::from_millis(500);

/// How long connecting to a sentinel and each of its answers may take.
const ANSWER_WAIT: Duration = Duration::from_millis(500);
/// The pause before trying the next sentinel.
const RETRY_EVERY: Duration = Duration::from_millis(500);
/// A subscription silent this long is PINGed; one silent twice as long is dropped.
const IDLE: Duration = Duration::from_secs(5);
/// How often, and how many times, a reconnect is checked (and made again) after a switch.
const CHECK_EVERY: Duration = Duration::from_secs(1);
const CHECKS: usize = 10;

/// `args` as a RESP command (an array of bulk strings).
fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Put the sentinels that answer a PING (connected within `within`, answered within `within`
/// more) first, each group in its given order. fred asks them in order, and gives up the
/// whole attempt on one that accepts the connection but never answers (a paused or wedged
/// process), starting the next attempt with it again: a gateway listing it first never
/// connected. Once connected, fred keeps the list the sentinels give, led by the one that
/// answered. Probed in parallel, once, at start: about 2 × `within` more (per address of a
/// name) when a sentinel hangs. A sentinel behind TLS does not answer a plain PING and keeps
/// its place among those that did not.
pub(super) fn answering_first(hosts: &mut Vec<Server>, within: Duration) {
    let pong = |addr: &std::net::SocketAddr| -> bool {
        use std::io::{Read, Write};
        let Ok(mut conn) = std::net::TcpStream::connect_timeout(addr, within) else {
            return false;
        };
        let mut first = [0u8; 1];
        conn.set_read_timeout(Some(within)).is_ok()
            && conn.set_write_timeout(Some(within)).is_ok()
            && conn.write_all(&command(&["PING"])).is_ok()
            && conn.read(&mut first).is_ok_and(|n| n == 1)
            // `+PONG`, or an error such as NOAUTH: either way it answers.
            && matches!(first[0], b'+' | b'-')
    };
    // Each address the name resolves to (`localhost` may give `::1` first).
    let answers = |server: &Server| -> bool {
        use std::net::ToSocketAddrs;
        (&*server.host, server.port)
            .to_socket_addrs()
            .is_ok_and(|mut addrs| addrs.any(|a| pong(&a)))
    };
    let answered: Vec<bool> = std::thread::scope(|scope| {
        let probes: Vec<_> = hosts
            .iter()
            .map(|h| scope.spawn(move || answers(h)))
            .collect();
        probes
            .into_iter()
            .map(|p| p.join().unwrap_or(false))
            .collect()
    });
    let mut ordered: Vec<(bool, Server)> = answered.into_iter().zip(hosts.drain(..)).collect();
    // Stable: the answering ones keep their order, and so do the others.
    ordered.sort_by_key(|(answered, _)| !answered);
    hosts.extend(ordered.into_iter().map(|(_, h)| h));
}

/// Watch `sentinels` (`host:port`) for `service`'s primary while `store` lives.
pub(super) async fn follow(
    store: Weak<RedisStore>,
    sentinels: Vec<(String, u16)>,
    service: String,
) {
    for (host, port) in sentinels.iter().cycle() {
        if store.strong_count() == 0 {
            return;
        }
        match listen(host, *port, &service, &store).await {
            Ok(()) => return,
            Err(e) => {
                tracing::debug!(sentinel = %format!("{host}:{port}"), error = %e, "sentinel events: trying the next sentinel")
            }
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
}

/// One sentinel: where the primary is, then its switches, until the connection ends (an
/// error) or the store is gone (`Ok`).
async fn listen(
    host: &str,
    port: u16,
    service: &str,
    store: &Weak<RedisStore>,
) -> std::io::Result<()> {
    let conn = within(TcpStream::connect((host, port))).await?;
    let (read, mut write) = conn.into_split();
    let mut lines = BufReader::new(read).lines();
    let ask = command(&["SENTINEL", "get-master-addr-by-name", service]);
    write.write_all(&ask).await?;
    let primary = primary_named(&mut lines).await?;
    go_to(store, primary, false);
    write
        .write_all(&command(&["SUBSCRIBE", "+switch-master"]))
        .await?;
    if let Some(refused) = within(lines.next_line())
        .await?
        .filter(|l| l.starts_with('-'))
    {
        return Err(std::io::Error::other(refused));
    }
    // The payload: `<service> <old ip> <old port> <new ip> <new port>`.
    let prefix = format!("{service} ");
    let mut pinged = false;
    loop {
        let line = match tokio::time::timeout(IDLE, lines.next_line()).await {
            Err(_) if store.strong_count() == 0 => return Ok(()),
            Err(_) if pinged => {
                return Err(std::io::Error::other("the sentinel stopped answering"))
            }
            Err(_) => {
                write.write_all(&command(&["PING"])).await?;
                pinged = true;
                continue;
            }
            Ok(line) => line?,
        };
        pinged = false;
        let Some(line) = line else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the sentinel closed the connection",
            ));
        };
        // A bulk string's content is a line of its own; a payload holds no line break.
        let Some(addresses) = line.strip_prefix(&prefix) else {
            continue;
        };
        tracing::warn!(
            switch = addresses,
            "sentinel switched the primary: reconnecting every connection"
        );
        let new: Vec<&str> = addresses.split(' ').collect();
        let primary = match new[..] {
            [_, _, host, port] => port.parse().ok().map(|p| (host.to_owned(), p)),
            _ => None,
        };
        match primary {
            Some(primary) => go_to(store, primary, true),
            None => {
                if let Some(s) = store.upgrade() {
                    s.reconnect_all();
                }
            }
        }
    }
}

/// `fut`, or a timeout error after [`ANSWER_WAIT`].
async fn within<T>(
    fut: impl std::future::Future<Output = std::io::Result<T>>,
) -> std::io::Result<T> {
    tokio::time::timeout(ANSWER_WAIT, fut)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer"))?
}

/// The reply to `SENTINEL get-master-addr-by-name`: `*2`, then the host and the port as bulk
/// strings (each a length line and a content line).
async fn primary_named(
    lines: &mut Lines<BufReader<OwnedReadHalf>>,
) -> std::io::Result<(String, u16)> {
    let mut reply = Vec::with_capacity(5);
    while reply.len() < 5 {
        let line = within(lines.next_line()).await?;
        reply
            .push(line.ok_or_else(|| std::io::Error::other("the sentinel closed the connection"))?);
        if reply[0] != "*2" {
            return Err(std::io::Error::other(format!(
                "no primary named: {}",
                reply[0]
            )));
        }
    }
    let port = reply[4]
        .parse()
        .map_err(|_| std::io::Error::other(format!("not a port: {}", reply[4])))?;
    Ok((reply[2].clone(), port))
}

/// Have `store`'s connections go to `primary`: reconnect them if `force` or if any is
/// elsewhere, then check they got there (see [`CHECKS`]).
fn go_to(store: &Weak<RedisStore>, primary: (String, u16), force: bool) {
    let Some(s) = store.upgrade() else { return };
    if !force && !s.connected_elsewhere(&primary) {
        return;
    }
    s.reconnect_all();
    let store = store.clone();
    tokio::spawn(async move {
        for _ in 0..CHECKS {
            tokio::time::sleep(CHECK_EVERY).await;
            let Some(s) = store.upgrade() else { return };
            if !s.connected_elsewhere(&primary) {
                return;
            }
            tracing::info!(
                primary = %format!("{}:{}", primary.0, primary.1),
                "connections are not on the primary the sentinels named yet: reconnecting again"
            );
            s.reconnect_all();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(command(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(
            command(&["SUBSCRIBE", "+switch-master"]),
            b"*2\r\n$9\r\nSUBSCRIBE\r\n$14\r\n+switch-master\r\n"
        );
        assert_eq!(
            command(&["SENTINEL", "get-master-addr-by-name", "mymaster"]),
            b"*3\r\n$8\r\nSENTINEL\r\n$23\r\nget-master-addr-by-name\r\n$8\r\nmymaster\r\n"
        );
    }
}
