//! Redis Cluster: key slots ([`crc16`], [`key_slot`]) and [`RedisCluster`], three
//! primaries owning all 16384 slots, with routing of a key to the node that owns it.

use std::time::{Duration, Instant};

use super::process::wait_for;
use super::resp::{info_field, Conn, Resp};
use super::server::RedisServer;
use crate::support::free_port;

/// How long a new cluster gets to agree on its slots.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
/// Cluster slot ranges, one per primary.
const SLOT_RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

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

/// Three cluster primaries owning all 16384 slots (replicas added on demand). Killed on
/// drop.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start three nodes, assign slot ranges, introduce them with CLUSTER MEET, then wait
    /// until every node says `cluster_state:ok` and maps all slots.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3).map(|_| cluster_node()).collect();
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
            meet(&mut first, node);
        }
        cluster.wait_converged();
        cluster
    }

    /// Add a replica of the primary on `primary_port`, and wait until it is in sync. Its
    /// index in `nodes`.
    pub fn add_replica(&mut self, primary_port: u16) -> usize {
        let replica = cluster_node();
        let mut primary = Conn::connect(primary_port);
        let id = primary.cmd_ok(&["CLUSTER", "MYID"]).as_str();
        meet(&mut primary, &replica);
        let mut r = replica.conn();
        wait_for(&format!("node {} to learn of {id}", replica.port), || {
            r.cmd_ok(&["CLUSTER", "NODES"]).as_str().contains(&id)
        });
        r.cmd_ok(&["CLUSTER", "REPLICATE", &id]);
        wait_for(&format!("replica {} in sync", replica.port), || {
            let info = r.cmd_ok(&["INFO", "replication"]).as_str();
            info_field(&info, "master_link_status").as_deref() == Some("up")
        });
        self.nodes.push(replica);
        self.wait_converged();
        self.nodes.len() - 1
    }

    /// `CLUSTER FAILOVER` on replica `nodes[i]`: it takes its primary's slots while the old
    /// primary stays up, as its replica. Waits until every node maps the slots to it.
    pub fn fail_over_to(&self, i: usize) {
        let port = self.nodes[i].port;
        self.nodes[i].conn().cmd_ok(&["CLUSTER", "FAILOVER"]);
        wait_for(&format!("node {port} to serve slots on every node"), || {
            self.nodes.iter().all(|n| {
                Conn::try_connect(n.port)
                    .ok()
                    .and_then(|mut c| c.try_cmd(&["CLUSTER", "SLOTS"]).ok())
                    .is_some_and(|r| slot_map(&r).iter().any(|&(_, _, p)| p == port))
            })
        });
        self.wait_converged();
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

    /// The `store.redis` map of a gateway on this cluster, plus `extra` settings.
    pub fn store_map(&self, extra: &str) -> String {
        let nodes: Vec<String> = self.seeds().iter().map(|n| format!("\"{n}\"")).collect();
        format!(
            "{{ mode: cluster, nodes: [{}], {extra} }}",
            nodes.join(", ")
        )
    }

    /// "127.0.0.1:P" for every node.
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

    /// Every key on every running node (`KEYS *`).
    pub fn keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        self.for_each_node(|conn| {
            keys.extend(
                conn.cmd_ok(&["KEYS", "*"])
                    .as_array()
                    .iter()
                    .map(|k| k.as_str()),
            );
        });
        keys
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

/// A cluster-enabled `redis-server`, in no cluster yet.
fn cluster_node() -> RedisServer {
    RedisServer::launch(|dir| {
        let conf = dir.join("nodes.conf");
        // An explicit bus port: the default (port + 10000) overflows for ephemeral ports
        // above 55535.
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
}

/// Introduce `node` to the cluster `via` belongs to.
fn meet(via: &mut Conn, node: &RedisServer) {
    let bus = node
        .conn()
        .cmd_ok(&["CONFIG", "GET", "cluster-port"])
        .as_array()[1]
        .as_str();
    via.cmd_ok(&["CLUSTER", "MEET", "127.0.0.1", &node.port.to_string(), &bus]);
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
