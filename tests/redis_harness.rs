//! The real-Redis test harness itself: standalone kill/restart, a converged three-node
//! cluster with key routing, a sentinel reporting its master, and cluster key slots.

mod support;

use std::collections::BTreeMap;

use support::redis::*;

#[test]
fn standalone_set_get_pttl_and_restart_on_same_port() {
    let mut r = RedisServer::start();
    assert_eq!(r.url(), format!("redis://127.0.0.1:{}/0", r.port));
    let mut c = r.conn();
    assert_eq!(c.cmd_ok(&["SET", "k", "v", "PX", "60000"]).as_str(), "OK");
    assert_eq!(c.cmd_ok(&["GET", "k"]).as_str(), "v");
    let pttl = c.cmd_ok(&["PTTL", "k"]).as_int();
    assert!((1..=60_000).contains(&pttl), "PTTL {pttl}");
    assert_eq!(c.cmd(&["GET", "missing"]), Resp::Bulk(None));
    assert!(c.cmd(&["NOSUCHCOMMAND"]).is_error());

    let port = r.port;
    r.kill();
    assert!(!r.is_running());
    assert!(
        Conn::try_connect(port).is_err(),
        "still listening after kill"
    );

    r.restart();
    assert!(r.is_running());
    assert_eq!(r.port, port);
    let mut c = r.conn();
    // No persistence: a restarted server starts empty.
    assert_eq!(c.cmd_ok(&["GET", "k"]), Resp::Bulk(None));
    c.cmd_ok(&["SET", "k", "again"]);
    assert_eq!(c.cmd_ok(&["GET", "k"]).as_str(), "again");
}

#[test]
fn cluster_converges_and_routes_keys_to_their_owner() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.seeds().len(), 3);
    cluster.for_each_node(|c| {
        let info = c.cmd_ok(&["CLUSTER", "INFO"]).as_str();
        assert_eq!(info_field(&info, "cluster_state").as_deref(), Some("ok"));
        assert_eq!(
            info_field(&info, "cluster_known_nodes").as_deref(),
            Some("3")
        );
    });

    let mut per_node: BTreeMap<u16, usize> = BTreeMap::new();
    for i in 0..50 {
        let key = format!("key:{i}");
        let mut c = cluster.conn_for_key(&key);
        let server_slot = c.cmd_ok(&["CLUSTER", "KEYSLOT", &key]).as_int();
        assert_eq!(key_slot(key.as_bytes()) as i64, server_slot, "{key}");
        assert_eq!(
            c.cmd(&["SET", &key, "v"]),
            Resp::Simple("OK".into()),
            "{key}"
        );
        assert_eq!(c.cmd_ok(&["GET", &key]).as_str(), "v");
        *per_node.entry(c.port).or_default() += 1;

        // Any other node redirects: routing is what made the SET above land.
        let other = cluster.nodes.iter().find(|n| n.port != c.port).unwrap();
        let moved = other.conn().cmd(&["SET", &key, "v"]);
        assert!(
            matches!(&moved, Resp::Error(e) if e.starts_with("MOVED")),
            "{moved:?}"
        );
    }
    assert_eq!(
        per_node.len(),
        3,
        "keys not spread over all nodes: {per_node:?}"
    );
}

#[test]
fn sentinel_reports_master() {
    let s = Sentinel::start();
    assert_eq!(s.service(), "mymaster");
    let nodes = s.sentinel_nodes();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0], format!("127.0.0.1:{}", s.sentinels[0].0));
    let addr = s
        .sentinel_conn()
        .cmd_ok(&["SENTINEL", "get-master-addr-by-name", s.service()])
        .as_array();
    assert_eq!(addr[0].as_str(), "127.0.0.1");
    assert_eq!(addr[1].as_int(), s.master.port as i64);
    assert_eq!(s.master.conn().cmd_ok(&["PING"]).as_str(), "PONG");
}

#[test]
fn key_slot_known_vectors() {
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(key_slot(b"123456789"), 12739);
    assert_eq!(key_slot(b"foo"), 12182);
    assert_eq!(key_slot(b"bar"), 5061);
    assert_eq!(key_slot(b"hello"), 866);
    assert_eq!(key_slot(b""), 0);
    assert_eq!(
        key_slot(b"{user1000}.following"),
        key_slot(b"{user1000}.followers")
    );
    assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
    // Only the first complete, non-empty tag counts.
    assert_eq!(key_slot(b"foo{}{bar}"), 8363);
    assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
    assert_ne!(key_slot(b"{}foo"), key_slot(b"foo"));
}
