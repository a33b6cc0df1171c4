//! Process plumbing shared by `redis-server` and `redis-sentinel`: waiting until the
//! spawned process (and not another test's) answers, port-race detection, stdio capture,
//! log reading and kill-and-reap.

use std::fs::File;
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::resp::{info_field, Conn, Resp};

/// Attempts at starting a process before giving up on port races.
pub(super) const START_ATTEMPTS: u32 = 5;
/// How long a standalone server (or sentinel) gets to answer.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) enum Ready {
    Yes,
    Exited(ExitStatus),
    TimedOut,
}

/// Poll 127.0.0.1:`port` until `ready` holds. The answering process must be `child`
/// (checked by pid through `INFO server`): with free-port races another test's server
/// could otherwise answer our PING.
pub(super) fn wait_ready(
    child: &mut Child,
    port: u16,
    timeout: Duration,
    mut ready: impl FnMut(&mut Conn) -> bool,
) -> Ready {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Ready::Exited(status);
        }
        if let Ok(mut c) = Conn::try_connect(port) {
            if served_by(&mut c, child.id()) && ready(&mut c) {
                return Ready::Yes;
            }
        }
        if Instant::now() > deadline {
            return Ready::TimedOut;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn served_by(c: &mut Conn, pid: u32) -> bool {
    match c.try_cmd(&["INFO", "server"]) {
        Ok(Resp::Bulk(Some(b))) => {
            info_field(&String::from_utf8_lossy(&b), "process_id") == Some(pid.to_string())
        }
        _ => false,
    }
}

pub(super) fn is_pong(c: &mut Conn) -> bool {
    matches!(c.try_cmd(&["PING"]), Ok(Resp::Simple(s)) if s == "PONG")
}

/// Whether a failed start was a lost race for the port (worth retrying on another one).
pub(super) fn port_taken(log: &str) -> bool {
    log.contains("Address already in use")
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The log file `log` of a process, plus anything it printed to stdout/stderr (`stdio.log`
/// in `dir`, see [`stdio_file`]).
pub(super) fn process_log(dir: &Path, log: &Path) -> String {
    let stdio = read_text(&dir.join("stdio.log"));
    let log = read_text(log);
    if stdio.trim().is_empty() {
        log
    } else {
        format!("{log}\n--- stdout/stderr ---\n{stdio}")
    }
}

/// Stdout/stderr of a child: Redis reports argument errors there, before its log file.
pub(super) fn stdio_file(path: &Path) -> (Stdio, Stdio) {
    let f = File::options()
        .create(true)
        .append(true)
        .open(path)
        .expect("open stdio log");
    (f.try_clone().expect("clone stdio log").into(), f.into())
}

pub(super) fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Poll `ready` every 100 ms for up to 30 s (a cluster agreeing, a replica syncing, a
/// sentinel switching); panic naming `what` past that.
pub fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "waited 30 s for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
