//! A log reader that stops reading must not stop the gateway: stderr goes to a pipe nobody
//! reads (its 64 KiB buffer fills after a few hundred access-log lines), and every request
//! still gets its answer. Before the writer was made non-blocking, the flusher blocked in
//! `write(2)` holding the log lock and every request waited on it. The lines it then drops
//! are told by a log line of their own, in the log's format.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::{client, free_port, get, sluice_bin, Upstream};

#[tokio::test]
async fn a_stalled_stderr_reader_never_stalls_requests() {
    let up = Upstream::start();
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = dir.path().join("sluice.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin}\n\
             upstreams: {{ up: {{ targets: [{}] }} }}\n\
             routes:\n  - {{ name: all, match: {{ path_prefix: / }}, upstream: up }}\n",
            up.url()
        ),
    )
    .unwrap();
    let mut child = Command::new(sluice_bin())
        .args(["run", "--log-format", "json", "-c"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held, never read, until the end.
    let stderr = child.stderr.take().unwrap();
    let child = KillOnDrop(child);
    let url = format!("http://127.0.0.1:{port}/x");
    assert!(
        support::eventually(Duration::from_secs(10), || async {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await
    );
    let c = client();
    // ~250 bytes per access-log line: 3000 lines are far past the pipe's 64 KiB.
    for i in 0..3000 {
        let r = tokio::time::timeout(Duration::from_secs(5), get(&c, &url, &[]))
            .await
            .unwrap_or_else(|_| panic!("request {i} hung behind the stalled log pipe"));
        assert_eq!(r.status, 200);
    }
    // Lines of 40 KB (the path): past the 8 MiB the gateway holds for a stalled reader.
    let long = format!("{url}/{}", "p".repeat(40_000));
    for i in 0..250 {
        let r = tokio::time::timeout(Duration::from_secs(5), get(&c, &long, &[]))
            .await
            .unwrap_or_else(|_| panic!("long request {i} hung behind the stalled log pipe"));
        assert_eq!(r.status, 200);
    }
    // Draining the pipe lets the writer catch up: the lines it had to drop are counted.
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = std::io::Read::read_to_string(&mut { stderr }, &mut all);
        all
    });
    std::thread::sleep(Duration::from_millis(500));
    terminate(child.0.id());
    let _ = child.wait();
    let log = reader.join().unwrap();
    assert!(
        log.contains("sluice serving"),
        "{}",
        &log[..log.len().min(2000)]
    );
    // Every line is JSON, the notice of the dropped ones too (it was a bare text line).
    let mut dropped = 0;
    for line in log.lines().filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", &line[..line.len().min(300)]));
        if v["message"]
            .as_str()
            .is_some_and(|m| m.contains("log lines dropped"))
        {
            dropped += v["dropped"].as_u64().expect("a count");
        }
    }
    assert!(dropped > 0, "no dropped lines told");
}

/// The gateway process, killed if the test fails before stopping it.
struct KillOnDrop(std::process::Child);

impl KillOnDrop {
    fn wait(mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// SIGTERM, so the gateway drains and flushes its log before exiting.
fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}
