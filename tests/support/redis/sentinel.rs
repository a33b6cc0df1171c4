//! Redis Sentinel: [`Sentinel`], a master plus one `redis-sentinel` monitoring it as
//! "mymaster", and the `store.redis` map a gateway needs to reach it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use super::process::{
    port_taken, process_log, stdio_file, wait_for, wait_ready, Ready, READY_TIMEOUT, START_ATTEMPTS,
};
use super::redis_sentinel_bin;
use super::resp::{info_field, Conn, Resp};
use super::server::RedisServer;
use crate::support::free_port;

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

    /// "127.0.0.1:S" for each sentinel.
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
        process_log(self.dir.path(), &self.log_path())
    }

    /// Start a replica of the master, and wait until it is in sync and the sentinel knows it
    /// (the sentinel learns of replicas from the master's INFO, every 10 s).
    pub fn add_replica(&self) -> RedisServer {
        let master = self.master.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master]);
        let mut r = replica.conn();
        let port = replica.port.to_string();
        wait_for("the replica in sync", || {
            let info = r.cmd_ok(&["INFO", "replication"]).as_str();
            info_field(&info, "master_link_status").as_deref() == Some("up")
        });
        let mut s = self.sentinel_conn();
        wait_for("the sentinel to know the replica", || {
            let Ok(Resp::Array(Some(list))) = s.try_cmd(&["SENTINEL", "replicas", SERVICE]) else {
                return false;
            };
            list.iter().any(|fields| {
                let kv = fields.as_array();
                kv.chunks(2)
                    .any(|p| p.len() == 2 && p[0].as_str() == "port" && p[1].as_str() == port)
                    && kv.chunks(2).any(|p| {
                        p.len() == 2 && p[0].as_str() == "flags" && p[1].as_str() == "slave"
                    })
            })
        });
        replica
    }

    /// `SENTINEL FAILOVER`, then wait until the sentinel names `to` the primary.
    pub fn fail_over(&self, to: &RedisServer) {
        let mut s = self.sentinel_conn();
        s.cmd_ok(&["SENTINEL", "FAILOVER", SERVICE]);
        let port = to.port.to_string();
        wait_for("the sentinel to switch the primary", || {
            matches!(s.try_cmd(&["SENTINEL", "get-master-addr-by-name", SERVICE]),
                Ok(Resp::Array(Some(a))) if a.len() == 2 && a[1].as_str() == port)
        });
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
