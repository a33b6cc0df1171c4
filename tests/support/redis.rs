//! Real Redis servers for tests: a standalone server, a three-primary cluster and a
//! master watched by one sentinel, each on free loopback ports with its files in a
//! tempdir, plus a minimal synchronous RESP2 client ([`Conn`]) to drive and inspect them.
//!
//! Everything here is blocking std code so it works from plain and `#[tokio::test]` tests.
//! A missing binary panics with how to install it: a Redis test never skips silently.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::free_port;

/// Attempts at starting a process before giving up on port races.
const START_ATTEMPTS: u32 = 5;
/// How long a standalone server (or sentinel) gets to answer.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cluster gets to agree on its slots.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Cluster slot ranges, one per primary.
const SLOT_RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

const INSTALL_HINT: &str = "install it with `apt-get install -y redis-server redis-tools redis-sentinel` (or run ./scripts/test.sh, which does)";

/// Path of `redis-server` on PATH; panics with install instructions when absent.
pub fn redis_server_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| find_bin("redis-server"))
}

/// Path of `redis-sentinel` on PATH; panics with install instructions when absent.
pub fn redis_sentinel_bin() -> &'static str {
    static BIN: OnceLock<String> = OnceLock::new();
    BIN.get_or_init(|| find_bin("redis-sentinel"))
}

fn find_bin(name: &str) -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("{name} not found: {INSTALL_HINT}"))
}

// ---------------------------------------------------------------------------------------
// RESP2 client
// ---------------------------------------------------------------------------------------

/// One RESP2 reply.
#[derive(Clone, PartialEq, Eq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// A simple or bulk string as UTF-8; panics (showing the reply) on anything else.
    pub fn as_str(&self) -> String {
        match self {
            Resp::Simple(s) => s.clone(),
            Resp::Bulk(Some(b)) => String::from_utf8(b.clone())
                .unwrap_or_else(|_| panic!("reply is not UTF-8: {self:?}")),
            _ => panic!("expected a string reply, got {self:?}"),
        }
    }

    /// An integer reply, or a simple/bulk string holding one; panics otherwise.
    pub fn as_int(&self) -> i64 {
        match self {
            Resp::Int(n) => *n,
            Resp::Simple(_) | Resp::Bulk(Some(_)) => self
                .as_str()
                .parse()
                .unwrap_or_else(|_| panic!("expected an integer reply, got {self:?}")),
            _ => panic!("expected an integer reply, got {self:?}"),
        }
    }

    /// The elements of a (non-nil) array reply; panics otherwise.
    pub fn as_array(&self) -> Vec<Resp> {
        match self {
            Resp::Array(Some(items)) => items.clone(),
            _ => panic!("expected an array reply, got {self:?}"),
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
}

/// Bulk strings shown as text so panic messages are readable.
impl fmt::Debug for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resp::Simple(s) => write!(f, "Simple({s:?})"),
            Resp::Error(e) => write!(f, "Error({e:?})"),
            Resp::Int(n) => write!(f, "Int({n})"),
            Resp::Bulk(None) | Resp::Array(None) => f.write_str("Nil"),
            Resp::Bulk(Some(b)) => write!(f, "Bulk({:?})", String::from_utf8_lossy(b)),
            Resp::Array(Some(items)) => f.debug_list().entries(items).finish(),
        }
    }
}

/// A blocking connection to one Redis (or sentinel) on 127.0.0.1.
pub struct Conn {
    pub port: u16,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connect to 127.0.0.1:`port`; panics if nothing answers.
    pub fn connect(port: u16) -> Conn {
        Conn::try_connect(port)
            .unwrap_or_else(|e| panic!("cannot connect to redis at 127.0.0.1:{port}: {e}"))
    }

    /// Like [`Conn::connect`], for polling a server that may not be up (yet, or any more).
    pub fn try_connect(port: u16) -> io::Result<Conn> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        // A wedged server fails the test instead of hanging it.
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            port,
            reader: BufReader::new(stream),
        })
    }

    /// Send `args` as one command and read its reply (which may be a `Resp::Error`);
    /// panics on I/O errors.
    pub fn cmd(&mut self, args: &[&str]) -> Resp {
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("redis 127.0.0.1:{} {args:?}: {e}", self.port))
    }

    /// Like [`Conn::cmd`], but panics on an error reply too.
    pub fn cmd_ok(&mut self, args: &[&str]) -> Resp {
        let reply = self.cmd(args);
        if let Resp::Error(e) = &reply {
            panic!("redis 127.0.0.1:{} {args:?} failed: {e}", self.port);
        }
        reply
    }

    /// Like [`Conn::cmd`], returning I/O errors (for polling).
    pub fn try_cmd(&mut self, args: &[&str]) -> io::Result<Resp> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a.as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        self.reader.get_mut().write_all(&buf)?;
        read_resp(&mut self.reader)
    }
}

fn bad_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_resp<R: BufRead>(r: &mut R) -> io::Result<Resp> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    line.truncate(line.len() - 2);
    let Some((&kind, rest)) = line.split_first() else {
        return Err(bad_data("empty reply line".into()));
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    let int = || {
        text.parse::<i64>()
            .map_err(|_| bad_data(format!("bad integer {text:?}")))
    };
    Ok(match kind {
        b'+' => Resp::Simple(text.clone()),
        b'-' => Resp::Error(text.clone()),
        b':' => Resp::Int(int()?),
        b'$' => match usize::try_from(int()?) {
            Err(_) => Resp::Bulk(None),
            Ok(len) => {
                let mut data = vec![0; len + 2];
                r.read_exact(&mut data)?;
                data.truncate(len);
                Resp::Bulk(Some(data))
            }
        },
        b'*' => match usize::try_from(int()?) {
            Err(_) => Resp::Array(None),
            Ok(n) => Resp::Array(Some(
                (0..n)
                    .map(|_| read_resp(r))
                    .collect::<io::Result<Vec<_>>>()?,
            )),
        },
        other => return Err(bad_data(format!("unknown reply type {:?}", other as char))),
    })
}

/// `field` from an `INFO`/`CLUSTER INFO` text (`field:value` lines).
pub fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
}

// ---------------------------------------------------------------------------------------
// Process plumbing shared by servers and sentinels
// ---------------------------------------------------------------------------------------

enum Ready {
    Yes,
    Exited(ExitStatus),
    TimedOut,
}

/// Poll 127.0.0.1:`port` until `ready` holds. The answering process must be `child`
/// (checked by pid through `INFO server`): with free-port races another test's server
/// could otherwise answer our PING.
fn wait_ready(
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

fn is_pong(c: &mut Conn) -> bool {
    matches!(c.try_cmd(&["PING"]), Ok(Resp::Simple(s)) if s == "PONG")
}

/// Whether a failed start was a lost race for the port (worth retrying on another one).
fn port_taken(log: &str) -> bool {
    log.contains("Address already in use")
}

fn read_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Stdout/stderr of a child: Redis reports argument errors there, before its log file.
fn stdio_file(path: &Path) -> (Stdio, Stdio) {
    let f = File::options()
        .create(true)
        .append(true)
        .open(path)
        .expect("open stdio log");
    (f.try_clone().expect("clone stdio log").into(), f.into())
}

fn kill_child(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

// ---------------------------------------------------------------------------------------
// Standalone server
// ---------------------------------------------------------------------------------------

/// A `redis-server` on a free port with no persistence, its files in `dir`. Killed on drop.
pub struct RedisServer {
    pub port: u16,
    pub dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Start with extra `redis-server` arguments (e.g. `&["--maxmemory", "1mb"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::launch(|_| extra.iter().map(|s| s.to_string()).collect())
    }

    /// Start on a fresh port and tempdir, retrying on another port when the chosen one
    /// was taken between [`free_port`] and Redis binding it. `extra` gets the tempdir.
    fn launch(extra: impl Fn(&Path) -> Vec<String>) -> RedisServer {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = tempfile::tempdir().expect("tempdir");
            let port = free_port();
            let d = dir.path();
            let mut args: Vec<String> = [
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--enable-debug-command",
                "yes",
                "--dir",
                &d.to_string_lossy(),
                "--logfile",
                &d.join("redis.log").to_string_lossy(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra(d));
            let mut server = RedisServer {
                port,
                dir,
                args,
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(log) if port_taken(&log) && attempt < START_ATTEMPTS => continue,
                Err(log) => panic!("redis-server on port {port} failed to start:\n{log}"),
            }
        }
    }

    /// Spawn with `self.args` and wait for PONG. `Err(log)` if the process exited.
    fn spawn(&mut self) -> Result<(), String> {
        let (out, err) = stdio_file(&self.dir.path().join("stdio.log"));
        let child = Command::new(redis_server_bin())
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn redis-server");
        // Owned by `self` before waiting, so a panic below still kills it (Drop).
        self.child = Some(child);
        let port = self.port;
        match wait_ready(self.child.as_mut().unwrap(), port, READY_TIMEOUT, is_pong) {
            Ready::Yes => Ok(()),
            Ready::Exited(status) => {
                self.child = None;
                Err(format!("exited with {status}\n{}", self.log()))
            }
            Ready::TimedOut => panic!(
                "redis-server on port {port} did not answer PING within {READY_TIMEOUT:?}:\n{}",
                self.log()
            ),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn conn(&self) -> Conn {
        Conn::connect(self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL (no shutdown, no save) and reap. A no-op if not running.
    pub fn kill(&mut self) {
        kill_child(&mut self.child);
    }

    /// Start again on the same port and dir (killing it first if running); waits for PONG.
    pub fn restart(&mut self) {
        self.kill();
        if let Err(log) = self.spawn() {
            panic!(
                "redis-server failed to restart on port {}:\n{log}",
                self.port
            );
        }
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            Some(_) => {
                kill_child(&mut self.child);
                false
            }
            None => false,
        }
    }

    /// The server's log file, plus anything it printed to stdout/stderr.
    pub fn log(&self) -> String {
        let stdio = read_text(&self.dir.path().join("stdio.log"));
        let log = read_text(&self.dir.path().join("redis.log"));
        if stdio.trim().is_empty() {
            log
        } else {
            format!("{log}\n--- stdout/stderr ---\n{stdio}")
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        kill_child(&mut self.child);
    }
}

// ---------------------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------------------

/// CRC16/XMODEM (poly 0x1021, init 0), as Redis Cluster uses for key slots.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= (b as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster hash slot of `key`: only the first non-empty `{tag}` is hashed if present.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % 16384
}

/// Three cluster primaries (no replicas) owning all 16384 slots. Killed on drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start three nodes, assign slot ranges, introduce them with CLUSTER MEET, then wait
    /// until every node says `cluster_state:ok` and maps all slots.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::launch(|dir| {
                    let conf = dir.join("nodes.conf");
                    // An explicit bus port: the default (port + 10000) overflows for
                    // ephemeral ports above 55535.
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf.to_string_lossy(),
                        "--cluster-node-timeout",
                        "2000",
                        "--cluster-port",
                        &free_port().to_string(),
                    ]
                    .iter()
                    .map(|s| s.to_string())
                    .collect()
                })
            })
            .collect();
        let cluster = RedisCluster { nodes };
        // Done by hand rather than `redis-cli --cluster create`: deterministic, and no
        // dependence on redis-cli knowing about custom bus ports.
        for (i, (node, (first, last))) in cluster.nodes.iter().zip(SLOT_RANGES).enumerate() {
            let mut c = node.conn();
            // Distinct epochs up front, as redis-cli does, so no collision to resolve.
            c.cmd_ok(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()]);
            c.cmd_ok(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ]);
        }
        let mut first = cluster.nodes[0].conn();
        for node in &cluster.nodes[1..] {
            let bus = node
                .conn()
                .cmd_ok(&["CONFIG", "GET", "cluster-port"])
                .as_array()[1]
                .as_str();
            first.cmd_ok(&["CLUSTER", "MEET", "127.0.0.1", &node.port.to_string(), &bus]);
        }
        cluster.wait_converged();
        cluster
    }

    fn wait_converged(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let problems: Vec<String> = self
                .nodes
                .iter()
                .filter_map(|n| self.node_problem(n.port))
                .collect();
            if problems.is_empty() {
                return;
            }
            if Instant::now() > deadline {
                let logs: String = self
                    .nodes
                    .iter()
                    .map(|n| format!("--- node {} log ---\n{}\n", n.port, n.log()))
                    .collect();
                panic!(
                    "redis cluster not ready after {CLUSTER_TIMEOUT:?}:\n{}\n{logs}",
                    problems.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Why the node on `port` is not ready yet, or `None` if it is.
    fn node_problem(&self, port: u16) -> Option<String> {
        let mut c = match Conn::try_connect(port) {
            Ok(c) => c,
            Err(e) => return Some(format!("node {port}: connect: {e}")),
        };
        let info = match c.try_cmd(&["CLUSTER", "INFO"]) {
            Ok(Resp::Bulk(Some(b))) => String::from_utf8_lossy(&b).into_owned(),
            other => return Some(format!("node {port}: CLUSTER INFO: {other:?}")),
        };
        if info_field(&info, "cluster_state").as_deref() != Some("ok") {
            return Some(format!("node {port}: CLUSTER INFO:\n{info}"));
        }
        let map = match c.try_cmd(&["CLUSTER", "SLOTS"]) {
            Ok(r @ Resp::Array(Some(_))) => slot_map(&r),
            other => return Some(format!("node {port}: CLUSTER SLOTS: {other:?}")),
        };
        let covered: u32 = map.iter().map(|&(a, b, _)| (b - a) as u32 + 1).sum();
        let strangers = map
            .iter()
            .any(|(_, _, p)| !self.nodes.iter().any(|n| n.port == *p));
        if covered != 16384 || strangers {
            return Some(format!(
                "node {port}: CLUSTER SLOTS covers {covered} slots: {map:?}"
            ));
        }
        None
    }

    /// "127.0.0.1:P" for every node.
    /// The `store.redis` map of a gateway on this cluster, plus `extra` settings.
    pub fn store_map(&self, extra: &str) -> String {
        let nodes: Vec<String> = self.seeds().iter().map(|n| format!("\"{n}\"")).collect();
        format!(
            "{{ mode: cluster, nodes: [{}], {extra} }}",
            nodes.join(", ")
        )
    }

    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr()).collect()
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.nodes[0].port)
    }

    /// Port of the primary owning `slot`, per CLUSTER SLOTS on the first running node.
    pub fn port_for_slot(&self, slot: u16) -> u16 {
        let mut c = self
            .nodes
            .iter()
            .find_map(|n| Conn::try_connect(n.port).ok())
            .expect("no cluster node is reachable");
        let map = slot_map(&c.cmd_ok(&["CLUSTER", "SLOTS"]));
        map.iter()
            .find(|&&(a, b, _)| (a..=b).contains(&slot))
            .map(|&(_, _, port)| port)
            .unwrap_or_else(|| panic!("slot {slot} is not served: {map:?}"))
    }

    /// A connection to the primary owning `key`'s slot.
    pub fn conn_for_key(&self, key: &str) -> Conn {
        Conn::connect(self.port_for_slot(key_slot(key.as_bytes())))
    }

    /// Run `f` on a fresh connection to each running node, in order.
    pub fn for_each_node(&self, mut f: impl FnMut(&mut Conn)) {
        for node in &self.nodes {
            if let Ok(mut c) = Conn::try_connect(node.port) {
                f(&mut c);
            }
        }
    }
}

/// `(first slot, last slot, primary port)` for each range of a CLUSTER SLOTS reply.
fn slot_map(reply: &Resp) -> Vec<(u16, u16, u16)> {
    reply
        .as_array()
        .iter()
        .map(|range| {
            let r = range.as_array();
            let primary = r[2].as_array();
            (
                r[0].as_int() as u16,
                r[1].as_int() as u16,
                primary[1].as_int() as u16,
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------------

/// A master plus one `redis-sentinel` monitoring it as "mymaster". Killed on drop.
pub struct Sentinel {
    pub master: RedisServer,
    /// `(port, process)` of each sentinel.
    pub sentinels: Vec<(u16, Child)>,
    /// Sentinel config (rewritten by the sentinel itself) and logs.
    pub dir: tempfile::TempDir,
}

const SERVICE: &str = "mymaster";

impl Sentinel {
    /// Start the master and a sentinel; wait until the sentinel reports the master's
    /// address and has connected to it.
    pub fn start() -> Sentinel {
        let bin = redis_sentinel_bin();
        let master = RedisServer::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Sentinel {
            master,
            sentinels: Vec::new(),
            dir,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_port();
            let conf = s.dir.path().join("sentinel.conf");
            let log = s.log_path();
            let _ = std::fs::remove_file(&log);
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
                 sentinel monitor {SERVICE} 127.0.0.1 {master} 1\n\
                 sentinel down-after-milliseconds {SERVICE} 1000\n\
                 sentinel failover-timeout {SERVICE} 3000\n",
                dir = s.dir.path().display(),
                log = log.display(),
                master = s.master.port,
            );
            std::fs::write(&conf, text).expect("write sentinel.conf");
            let (out, err) = stdio_file(&s.dir.path().join("stdio.log"));
            let child = Command::new(bin)
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("spawn redis-sentinel");
            s.sentinels.push((port, child));
            let master_port = s.master.port.to_string();
            let ready = |c: &mut Conn| {
                let addr = c.try_cmd(&["SENTINEL", "get-master-addr-by-name", SERVICE]);
                let knows_master = matches!(&addr, Ok(Resp::Array(Some(a)))
                    if a.len() == 2 && a[1] == Resp::Bulk(Some(master_port.clone().into_bytes())));
                knows_master && sentinel_flags(c).as_deref() == Some("master")
            };
            let child = &mut s.sentinels.last_mut().unwrap().1;
            match wait_ready(child, port, READY_TIMEOUT, ready) {
                Ready::Yes => return s,
                Ready::Exited(status) => {
                    s.sentinels.pop();
                    let log = s.log();
                    if !(port_taken(&log) && attempt < START_ATTEMPTS) {
                        panic!("redis-sentinel on port {port} exited with {status}:\n{log}");
                    }
                }
                Ready::TimedOut => panic!(
                    "redis-sentinel on port {port} did not report master {} within {READY_TIMEOUT:?}:\n{}",
                    s.master.port,
                    s.log()
                ),
            }
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.log")
    }

    /// "127.0.0.1:S" for each sentinel.
    /// The `store.redis` map of a gateway on this Sentinel setup, plus `extra` settings.
    pub fn store_map(&self, extra: &str) -> String {
        let nodes: Vec<String> = self
            .sentinel_nodes()
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect();
        format!(
            "{{ mode: sentinel, nodes: [{}], sentinel_service: {}, {extra} }}",
            nodes.join(", "),
            self.service()
        )
    }

    pub fn sentinel_nodes(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// The monitored service name.
    pub fn service(&self) -> &str {
        SERVICE
    }

    /// A connection to the first sentinel.
    pub fn sentinel_conn(&self) -> Conn {
        Conn::connect(self.sentinels[0].0)
    }

    /// The sentinel's log, plus anything it printed to stdout/stderr.
    pub fn log(&self) -> String {
        let stdio = read_text(&self.dir.path().join("stdio.log"));
        format!("{}{stdio}", read_text(&self.log_path()))
    }
}

/// The `flags` of "mymaster" as the sentinel sees it ("master" once connected and up).
fn sentinel_flags(c: &mut Conn) -> Option<String> {
    let Ok(Resp::Array(Some(kv))) = c.try_cmd(&["SENTINEL", "master", SERVICE]) else {
        return None;
    };
    kv.chunks(2)
        .find(|p| p.len() == 2 && p[0] == Resp::Bulk(Some(b"flags".to_vec())))
        .map(|p| p[1].as_str())
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
