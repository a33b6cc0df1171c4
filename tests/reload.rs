//! Live reload through the real binary: each trigger, bad edits, state surviving a rate
//! change, and a soak with continuous traffic across 50 reloads.

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;

fn limited(up: &Upstream, rate: &str) -> String {
    format!(
        "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: r\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n      - {{ name: per-ip, by: ip, algorithm: fixed_window, rate: {rate} }}\n",
        up.url()
    )
}

/// Admitted requests out of `n` sent now.
async fn admitted(s: &Sluice, n: usize) -> usize {
    let c = client();
    let mut ok = 0;
    for _ in 0..n {
        let r = get(&c, &s.url("/"), &[]).await;
        assert!(
            r.status == 200 || r.status == 429,
            "unexpected {}",
            r.status
        );
        ok += (r.status == 200) as usize;
    }
    ok
}

#[tokio::test]
async fn in_place_edit_changes_the_limit() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "2/1h"));
    // A fresh route name, so the new limit starts from an empty counter.
    s.rewrite_config(&limited(&up, "5/1h").replace("name: per-ip", "name: per-ip-v2"));
    s.wait_reloads("success", 1.0).await;
    assert_eq!(admitted(&s, 8).await, 5);
}

#[tokio::test]
async fn rename_over_is_seen() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "2/1h"));
    let tmp = s.dir.path().join(".sluice.yaml.swp");
    std::fs::write(
        &tmp,
        format!(
            "listen: {}\nadmin_listen: {}\n{}",
            s.addr,
            s.admin,
            limited(&up, "4/1h").replace("per-ip", "renamed")
        ),
    )
    .unwrap();
    std::fs::rename(&tmp, &s.config_path).unwrap();
    s.wait_reloads("success", 1.0).await;
    assert_eq!(admitted(&s, 6).await, 4);
}

/// A config path that is a symlink into another directory (`/etc/sluice.yaml` linked into a
/// deploy tree): an edit of the file it resolves to, in place or renamed over, is seen, not
/// only an event in the link's own directory.
#[tokio::test]
async fn a_change_behind_a_symlink_into_another_directory_is_seen() {
    let up = Upstream::start();
    let probe = Sluice::start(&limited(&up, "1/1h"));
    let (addr, admin) = (probe.addr, probe.admin);
    drop(probe);
    let dir = tempfile::tempdir().unwrap();
    let (etc, tree) = (dir.path().join("etc"), dir.path().join("tree"));
    std::fs::create_dir(&etc).unwrap();
    std::fs::create_dir(&tree).unwrap();
    let text = |rate: &str, name: &str| {
        format!(
            "listen: {addr}\nadmin_listen: {admin}\n{}",
            limited(&up, rate).replace("per-ip", name)
        )
    };
    std::fs::write(tree.join("real.yaml"), text("1/1h", "a")).unwrap();
    std::os::unix::fs::symlink("../tree/real.yaml", etc.join("sluice.yaml")).unwrap();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let mut child = std::process::Command::new(sluice_bin())
        .arg("run")
        .arg("-c")
        .arg(etc.join("sluice.yaml"))
        .stderr(log)
        .spawn()
        .unwrap();
    let reloads = || async {
        let m = get(&client(), &format!("http://{admin}/metrics"), &[])
            .await
            .text();
        metric(&m, "sluice_config_reloads_total", &[("result", "success")])
    };
    let started = eventually(Duration::from_secs(10), || async {
        std::net::TcpStream::connect(addr).is_ok() && std::net::TcpStream::connect(admin).is_ok()
    })
    .await;
    // In place, then renamed over: each is one reload.
    std::fs::write(tree.join("real.yaml"), text("2/1h", "b")).unwrap();
    let in_place = eventually(Duration::from_secs(5), || async { reloads().await >= 1.0 }).await;
    std::fs::write(tree.join(".tmp"), text("3/1h", "c")).unwrap();
    std::fs::rename(tree.join(".tmp"), tree.join("real.yaml")).unwrap();
    let renamed = eventually(Duration::from_secs(5), || async { reloads().await >= 2.0 }).await;
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(
        started && in_place && renamed,
        "{started} {in_place} {renamed}\n{log}"
    );
}

#[tokio::test]
async fn kubernetes_symlink_swap_is_seen() {
    let up = Upstream::start();
    // Start normally to get ports, then restart on a ConfigMap-style layout:
    // dir/sluice.yaml -> ..data/sluice.yaml, ..data -> ..v1 (swapped atomically to ..v2).
    let probe = Sluice::start(&limited(&up, "1/1h"));
    let (addr, admin) = (probe.addr, probe.admin);
    drop(probe);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = |rate: &str, name: &str| {
        format!(
            "listen: {addr}\nadmin_listen: {admin}\n{}",
            limited(&up, rate).replace("per-ip", name)
        )
    };
    std::fs::create_dir(d.join("..v1")).unwrap();
    std::fs::write(d.join("..v1/sluice.yaml"), text("1/1h", "a")).unwrap();
    std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/sluice.yaml", d.join("sluice.yaml")).unwrap();
    let log = std::fs::File::create(d.join("log")).unwrap();
    let mut child = std::process::Command::new(sluice_bin())
        .arg("run")
        .arg("-c")
        .arg(d.join("sluice.yaml"))
        .stderr(log)
        .spawn()
        .unwrap();
    let up_ok = eventually(Duration::from_secs(10), || async {
        std::net::TcpStream::connect(addr).is_ok()
    })
    .await;
    assert!(up_ok);
    let s_url = format!("http://{addr}/");
    let c = client();
    assert_eq!(get(&c, &s_url, &[]).await.status, 200);
    assert_eq!(get(&c, &s_url, &[]).await.status, 429);

    std::fs::create_dir(d.join("..v2")).unwrap();
    std::fs::write(d.join("..v2/sluice.yaml"), text("3/1h", "b")).unwrap();
    std::os::unix::fs::symlink("..v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    let swapped = eventually(Duration::from_secs(5), || async {
        let m = get(&client(), &format!("http://{admin}/metrics"), &[])
            .await
            .text();
        metric(&m, "sluice_config_reloads_total", &[("result", "success")]) >= 1.0
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get(&c, &s_url, &[]).await.status.as_u16());
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        swapped,
        "{}",
        std::fs::read_to_string(d.join("log")).unwrap()
    );
    assert_eq!(
        statuses,
        [200, 200, 200, 429],
        "the new limit (3/h, fresh name) serves"
    );
}

#[tokio::test]
async fn sighup_reloads_even_unchanged_content() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "2/1h"));
    s.signal("HUP");
    s.wait_reloads("success", 1.0).await;
    s.wait_log(&["Signal"]);
    // A file event with identical content is ignored and not counted.
    s.rewrite_config(&limited(&up, "2/1h"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(s.reloads("success").await, 1.0);
}

#[tokio::test]
async fn bad_edit_keeps_the_old_config_until_fixed() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "3/1h"));
    assert_eq!(admitted(&s, 1).await, 1);
    s.rewrite_config(&limited(&up, "3/1h").replace("fixed_window", "fixed_windw"));
    s.wait_reloads("error", 1.0).await;
    let path = s.config_path.display().to_string();
    s.wait_log(&[&format!("{path}:10:"), "unknown algorithm `fixed_windw`"]);
    // Still the old config, with its state: 2 of 3 left.
    assert_eq!(admitted(&s, 4).await, 2);
    // Fixing the file makes the next reload succeed.
    s.rewrite_config(&limited(&up, "5/1h"));
    s.wait_reloads("success", 1.0).await;
    assert_eq!(s.reloads("error").await, 1.0);
    assert_eq!(
        admitted(&s, 4).await,
        2,
        "5 per hour, 3 already used: the counter survived"
    );
}

/// A writer that truncates the file and writes it in parts with a pause between them (a
/// script, `cat > sluice.yaml` from a slow pipe): what it wrote first is a valid config that
/// lacks the catch-all route. The reload waits for the writer to close the file: the old
/// config serves meanwhile, then the whole new one.
#[tokio::test]
async fn a_file_written_in_parts_is_read_once_closed() {
    let up = Upstream::start();
    let yaml = |rate: &str| {
        format!(
            "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: api\n    match: {{ path_prefix: /api }}\n    upstream: up\n    limits:\n      - {{ name: per-ip, by: ip, algorithm: fixed_window, rate: {rate} }}\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: up\n",
            up.url()
        )
    };
    let s = Sluice::start(&yaml("100/1h"));
    let text = config_text(&yaml("99/1h"), s.addr, s.admin_listen);
    let cut = text.find("  - name: all").expect("the catch-all route");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&s.config_path)
        .unwrap();
    f.write_all(&text.as_bytes()[..cut]).unwrap();
    f.flush().unwrap();

    let c = client();
    let until = Instant::now() + Duration::from_millis(800);
    while Instant::now() < until {
        let r = get(&c, &s.url("/plain"), &[]).await;
        assert_eq!(r.status, 200, "the half-written config was served: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        s.reloads("success").await + s.reloads("error").await,
        0.0,
        "reloaded before the writer closed the file\n{}",
        s.log()
    );

    f.write_all(&text.as_bytes()[cut..]).unwrap();
    drop(f);
    s.wait_reloads("success", 1.0).await;
    assert_eq!(get(&c, &s.url("/plain"), &[]).await.status, 200);
    let r = get(&c, &s.url("/api"), &[]).await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"api/per-ip\";q=99;w=3600"),
        "{r:?}"
    );
}

#[tokio::test]
async fn limit_state_survives_a_rate_change() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "3/1h"));
    assert_eq!(admitted(&s, 5).await, 3);
    s.rewrite_config(&limited(&up, "4/1h"));
    s.wait_reloads("success", 1.0).await;
    assert_eq!(admitted(&s, 3).await, 1, "3 used of the new 4");
    // Changing the algorithm starts fresh, by design (it is part of the key).
    s.rewrite_config(&limited(&up, "4/1h").replace("fixed_window", "sliding_log"));
    s.wait_reloads("success", 2.0).await;
    assert_eq!(admitted(&s, 6).await, 4);
}

/// Tightening a GCRA limit keeps what each client has used: exhausted at `6/1m`, a client
/// is still exhausted at `6/1h` (the 60 s it owed were read at the new interval, 10 min a
/// unit, and gave it 5 of 6 back). Loosening keeps the units too: back at `6/1m` it owes 6
/// units of 10 s, not 6 hours.
#[tokio::test]
async fn tightening_a_gcra_limit_gives_no_quota_back() {
    let up = Upstream::start();
    let gcra = |rate: &str| limited(&up, rate).replace("fixed_window", "gcra");
    let s = Sluice::start(&gcra("6/1m"));
    assert_eq!(admitted(&s, 7).await, 6);
    s.rewrite_config(&gcra("6/1h"));
    s.wait_reloads("success", 1.0).await;
    assert_eq!(
        admitted(&s, 6).await,
        0,
        "an exhausted client was given quota back"
    );
    s.rewrite_config(&gcra("6/1m"));
    s.wait_reloads("success", 2.0).await;
    let r = get(&client(), &s.url("/"), &[]).await;
    assert_eq!(r.status, 429);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(retry <= 11, "still owes hours: Retry-After {retry}");
}

#[tokio::test]
async fn store_changes_wait_for_a_restart_and_keys_keep_their_prefix() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "3/1h"));
    assert_eq!(admitted(&s, 3).await, 3);
    s.rewrite_config(&format!(
        "store: {{ redis: {{ key_prefix: \"other:\" }} }}\n{}",
        limited(&up, "4/1h")
    ));
    s.wait_reloads("success", 1.0).await;
    s.wait_log(&["store settings changed but need a restart"]);
    assert_eq!(admitted(&s, 3).await, 1, "same keys: 3 used of the new 4");

    // A store section that would not start is refused now, at its position, rather than
    // kept aside until the next restart fails on it; the running config keeps serving.
    s.rewrite_config(&format!(
        "store: {{ redis: {{ pool_size: 0, timeout: banana }} }}\n{}",
        limited(&up, "5/1h")
    ));
    s.wait_reloads("error", 1.0).await;
    let log = s.wait_log(&["config reload rejected"]);
    let at = format!("{}:", s.config_path.display());
    for says in ["pool_size must be", "invalid duration `banana`"] {
        let line = log.lines().find(|l| l.contains(says));
        assert!(line.is_some_and(|l| l.contains(&at)), "{says}: {log}");
    }
    assert_eq!(admitted(&s, 3).await, 0, "still the limit of 4");
}

#[tokio::test]
async fn restart_only_settings_are_kept_and_logged() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "100/1h"));
    let other = free_port();
    let text = format!(
        "listen: 127.0.0.1:{other}\nadmin_listen: {}\n{}",
        s.admin,
        limited(&up, "100/1h")
    );
    std::fs::write(&s.config_path, text).unwrap();
    s.wait_reloads("success", 1.0).await;
    s.wait_log(&["need a restart"]);
    assert_eq!(
        get(&client(), &s.url("/"), &[]).await.status,
        200,
        "still serving on the old address"
    );
}

/// 8 clients send continuously while the config is reloaded 50 times: no failed or 5xx
/// response, and no growth in open file descriptors or memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn soak_50_reloads_under_load() {
    let up = Upstream::start();
    let cfg = |i: usize| {
        format!(
            "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: r{}\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n      - {{ name: wide, by: ip, algorithm: gcra, rate: {}/1s }}\n",
            up.url(),
            i % 3,
            1_000_000 + i
        )
    };
    let s = Arc::new(Sluice::start(&cfg(0)));
    // Warm up connections and allocator before taking the baseline.
    for _ in 0..50 {
        get(&client(), &s.url("/"), &[]).await;
    }
    let (fds0, rss0) = (s.open_fds(), s.rss_kib());
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let bad = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (s, stop, sent, bad) = (s.clone(), stop.clone(), sent.clone(), bad.clone());
        clients.push(tokio::spawn(async move {
            let c = client();
            while !stop.load(Ordering::Relaxed) {
                let req = http::Request::get(s.url("/"))
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                match c.request(req).await {
                    Ok(r) if r.status().is_success() => {
                        let _ = http_body_util::BodyExt::collect(r.into_body()).await;
                    }
                    _ => {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // Atomic replacements: an in-place rewrite can be read between its truncation and its
    // write (a rejected reload, by design), which is not what this test is about.
    for i in 1..=50 {
        s.replace_config(&cfg(i));
        s.wait_reloads("success", i as f64).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    assert_eq!(
        bad.load(Ordering::Relaxed),
        0,
        "failed or non-2xx responses during reloads"
    );
    assert!(
        sent.load(Ordering::Relaxed) > 500,
        "too little traffic to mean anything"
    );
    assert_eq!(
        s.reloads("error").await,
        0.0,
        "{}",
        s.log()
            .lines()
            .filter(|l| l.contains("rejected"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (fds1, rss1) = (s.open_fds(), s.rss_kib());
    assert!(fds1 <= fds0 + 16, "open fds grew from {fds0} to {fds1}");
    assert!(
        rss1 < rss0 + 32 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB"
    );
}

/// A reload keeps every upstream client whose settings did not change: 20 reloads editing an
/// unrelated limit while 8 keep-alive clients send requests cost (almost) no new upstream
/// connection, and no request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_keep_warm_upstream_connections() {
    let up = Upstream::start();
    let s = Sluice::start(&limited(&up, "1000000/1h"));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    // 8 clients, each with one keep-alive connection to the gateway.
    let clients: Vec<_> = (0..8)
        .map(|_| {
            let (stop, sent, url) = (stop.clone(), sent.clone(), s.url("/"));
            tokio::spawn(async move {
                let c = client();
                let mut failed = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = get(&c, &url, &[]).await;
                    if r.status != 200 {
                        failed.push(r.status.as_u16());
                    }
                    sent.fetch_add(1, Ordering::Relaxed);
                    // Paced, so the test does not starve the others on a 2-core machine.
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                failed
            })
        })
        .collect();
    // Warm up: every client has had answers, so the gateway's upstream pool is full.
    assert!(
        eventually(Duration::from_secs(5), || async {
            sent.load(Ordering::Relaxed) > 200
        })
        .await
    );
    let warm = up.conns();
    for i in 0..20 {
        let rate = format!("{}/1h", 1_000_001 + i);
        s.rewrite_config(&limited(&up, &rate));
        s.wait_reloads("success", f64::from(i + 1)).await;
        let at = sent.load(Ordering::Relaxed);
        assert!(
            eventually(Duration::from_secs(5), || async {
                sent.load(Ordering::Relaxed) > at + 16
            })
            .await
        );
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        assert_eq!(c.await.unwrap(), Vec::<u16>::new(), "requests failed");
    }
    let new = up.conns() - warm;
    assert!(
        new <= 2,
        "20 reloads opened {new} new upstream connections ({warm} when warm)"
    );
}

/// A route removed while a request on it is in flight: once that request ends, none of the
/// route's series is left in /metrics (the request counts into handles the reload detached).
#[tokio::test]
async fn a_removed_route_leaves_no_series_behind_its_in_flight_requests() {
    let up = Upstream::start();
    let two_routes = format!(
        "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: gone\n    match: {{ path_prefix: /slow }}\n    upstream: up\n    limits:\n      - {{ name: lim, by: ip, algorithm: gcra, rate: 100/1s }}\n  - name: stays\n    match: {{ path_prefix: / }}\n    upstream: up\n",
        up.url()
    );
    let s = Sluice::start(&two_routes);
    let c = client();
    let url = s.url("/slow?ms=1500");
    let slow = tokio::spawn(async move { get(&client(), &url, &[]).await.status });
    assert!(
        eventually(Duration::from_secs(5), || async {
            metric(
                &s.metrics(&c).await,
                "sluice_inflight_requests",
                &[("route", "gone")],
            ) == 1.0
        })
        .await
    );
    let one_route = two_routes
        .split("  - name: stays")
        .nth(1)
        .map(|rest| {
            format!(
                "upstreams:\n  up: {{ targets: [{}] }}\nroutes:\n  - name: stays{rest}",
                up.url()
            )
        })
        .unwrap();
    s.rewrite_config(&one_route);
    s.wait_reloads("success", 1.0).await;
    assert_eq!(slow.await.unwrap(), 200, "the in-flight request finished");
    let m = s.metrics(&c).await;
    let left: Vec<&str> = m
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("route=\"gone\""))
        .collect();
    assert!(left.is_empty(), "series of the removed route: {left:#?}");
    assert!(m.contains("route=\"stays\""), "{m}");
}
