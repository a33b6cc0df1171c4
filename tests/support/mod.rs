//! Test harness: a real upstream HTTP server, the real `sluice` binary on free loopback
//! ports, and a small HTTP client. Shared by every integration test file.
#![allow(dead_code)]
// Shared by every test crate through `mod support;`: `pub` is how they reach it.
#![allow(unreachable_pub)]

pub mod certs;
pub mod raw;
pub mod redis;
pub mod upstream;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[allow(unused_imports)]
pub use upstream::Upstream;

/// A free TCP port on 127.0.0.1 (bound then released), never one this test process was
/// handed before: the kernel may give a released port out again at once, and two listeners
/// of one gateway on the same port looked ready (the admin listener answered for both) while
/// the data listener waited for a Redis that was down.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !handed.contains(&port) {
            handed.push(port);
            return port;
        }
    }
}

/// Whether process `pid` holds a listening TCP socket on `port` (Linux: the socket inodes of
/// `/proc/net/tcp{,6}` in state LISTEN, against the process's open file descriptors).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let suffix = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() > 9 && f[1].ends_with(&suffix) && f[3] == "0A" {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|l| inodes.iter().any(|i| l.to_str() == Some(i.as_str())))
    })
}

/// The config file for `yaml`: `listen` (the cleartext `addr`) and `admin_listen` are added,
/// unless `yaml` starts with its own `listen:` list, where `{ADDR}` names `addr` (the
/// listener the harness waits for).
pub fn config_text(yaml: &str, addr: SocketAddr, admin_listen: SocketAddr) -> String {
    if yaml.starts_with("listen:") {
        format!(
            "admin_listen: {admin_listen}\n{}",
            yaml.replace("{ADDR}", &addr.to_string())
        )
    } else {
        format!("listen: {addr}\nadmin_listen: {admin_listen}\n{yaml}")
    }
}

/// A running `sluice run` process. SIGTERM on drop.
pub struct Sluice {
    child: Option<Child>,
    pub addr: SocketAddr,
    /// Where tests reach the admin listener (always on 127.0.0.1).
    pub admin: SocketAddr,
    /// The `admin_listen` written in the config (see [`Sluice::start_admin_on`]).
    pub admin_listen: SocketAddr,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    pub dir: tempfile::TempDir,
    /// What it was started with, to start it again on other ports (see `wait_ready`).
    yaml: String,
    env: Vec<(String, String)>,
    admin_ip: String,
    /// The arguments before `-c FILE` (`run` unless started otherwise).
    args: Vec<String>,
    /// A command the binary runs under (`prlimit …`), empty for none.
    wrapper: Vec<String>,
}

pub fn sluice_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sluice")
}

impl Sluice {
    /// Start sluice with `yaml` (everything but `listen`/`admin_listen`, which are added).
    pub fn start(yaml: &str) -> Sluice {
        Sluice::start_with(yaml, &[])
    }

    /// Like [`Sluice::start`], with extra environment variables for the process.
    pub fn start_with(yaml: &str, env: &[(&str, &str)]) -> Sluice {
        Sluice::start_admin_on(yaml, env, "127.0.0.1")
    }

    /// Like [`Sluice::start_with`], with `admin_listen` on `admin_ip` (e.g. `0.0.0.0`, which
    /// is not loopback and so needs `SLUICE_ADMIN_TOKEN` in `env`). Tests still reach the
    /// admin listener at 127.0.0.1.
    pub fn start_admin_on(yaml: &str, env: &[(&str, &str)], admin_ip: &str) -> Sluice {
        let mut s = Sluice::launch(yaml, env, admin_ip);
        s.wait_ready();
        s
    }

    /// Like [`Sluice::start`], with `args` in place of `run` before `-c FILE` (`[]`: the
    /// bare command, which serves as `run` does).
    pub fn start_args(yaml: &str, args: &[&str]) -> Sluice {
        let mut s = Sluice::prepare(yaml, &[], "127.0.0.1");
        s.args = args.iter().map(|a| a.to_string()).collect();
        s.spawn();
        s.wait_ready();
        s
    }

    /// Like [`Sluice::start`], the binary run by `wrapper` (a command and its arguments, the
    /// binary and its own arguments after them), e.g. `prlimit --nofile=256:1024 --`.
    pub fn start_under(yaml: &str, wrapper: &[&str]) -> Sluice {
        let mut s = Sluice::prepare(yaml, &[], "127.0.0.1");
        s.wrapper = wrapper.iter().map(|a| a.to_string()).collect();
        s.spawn();
        s.wait_ready();
        s
    }

    /// Start several gateways at the same moment (all spawned before any is waited for);
    /// each is returned once both its ports accept, and not a moment later.
    pub fn start_together(yamls: &[String]) -> Vec<Sluice> {
        let mut all: Vec<Sluice> = yamls
            .iter()
            .map(|y| Sluice::launch(y, &[], "127.0.0.1"))
            .collect();
        for s in &mut all {
            s.wait_ready();
        }
        all
    }

    /// Write the config and spawn the process, without waiting for it.
    fn launch(yaml: &str, env: &[(&str, &str)], admin_ip: &str) -> Sluice {
        let mut s = Sluice::prepare(yaml, env, admin_ip);
        s.spawn();
        s
    }

    /// Write the config on free ports; nothing spawned yet.
    fn prepare(yaml: &str, env: &[(&str, &str)], admin_ip: &str) -> Sluice {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sluice {
            child: None,
            addr: "127.0.0.1:0".parse().unwrap(),
            admin: "127.0.0.1:0".parse().unwrap(),
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            log_path: dir.path().join("sluice.log"),
            config_path: dir.path().join("sluice.yaml"),
            dir,
            yaml: yaml.to_string(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            admin_ip: admin_ip.to_string(),
            args: vec!["run".into()],
            wrapper: Vec::new(),
        };
        s.pick_ports();
        s
    }

    /// Free ports for the data and admin listeners, written into the config.
    fn pick_ports(&mut self) {
        self.addr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let port = free_port();
        self.admin = format!("127.0.0.1:{port}").parse().unwrap();
        self.admin_listen = format!("{}:{port}", self.admin_ip).parse().unwrap();
        let text = config_text(&self.yaml, self.addr, self.admin_listen);
        std::fs::write(&self.config_path, text).unwrap();
    }

    /// Spawn `sluice run` on this config (see [`Sluice::launch`]).
    fn spawn(&mut self) {
        let log = std::fs::File::create(&self.log_path).unwrap();
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(sluice_bin());
                cmd
            }
            None => Command::new(sluice_bin()),
        };
        cmd.args(&self.args)
            .arg("-c")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn sluice"));
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut retries = 3;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                // Another test took a port between `free_port` and the bind: other ports.
                if retries > 0 && self.log().contains("cannot listen") {
                    retries -= 1;
                    self.pick_ports();
                    self.spawn();
                    continue;
                }
                panic!("sluice exited early ({status}):\n{}", self.log());
            }
            // Accepting, and by this process: a port from `free_port` may have been taken by
            // another test's process meanwhile, which would accept in our place.
            let pid = self.pid();
            if std::net::TcpStream::connect(self.admin).is_ok()
                && std::net::TcpStream::connect(self.addr).is_ok()
                && listens_on(pid, self.admin.port())
                && listens_on(pid, self.addr.port())
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("sluice did not start listening:\n{}", self.log());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The log once it contains every one of `needles` (sluice flushes its log buffer every
    /// 100 ms); panics with the whole log after 5 s.
    pub fn wait_log(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log();
            if needles.iter().all(|n| log.contains(n)) {
                return log;
            }
            if Instant::now() > deadline {
                panic!("log never contained {needles:?}:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Replace the config file's content (keeping the listen addresses) in place.
    pub fn rewrite_config(&self, yaml: &str) {
        let text = config_text(yaml, self.addr, self.admin_listen);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&self.config_path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    /// The version the gateway gives its config file as it reads now: its text and the files
    /// it reads (certificates, a `consumers_file`).
    pub fn config_version(&self) -> String {
        let name = self.config_path.display().to_string();
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        match sluice::config::parse(&name, &text) {
            Ok(file) => {
                let reads = sluice::config::compile::watched_files(&name, &file);
                sluice::config::version_of(&text, &reads)
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Replace the config file atomically (write a sibling, rename over), as editors and
    /// config-management tools do: a reload never sees a half-written file.
    pub fn replace_config(&self, yaml: &str) {
        let text = config_text(yaml, self.addr, self.admin_listen);
        let tmp = self.dir.path().join(".sluice.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.config_path).unwrap();
    }

    /// `sluice_config_reloads_total{result}` right now.
    pub async fn reloads(&self, result: &str) -> f64 {
        let m = self.metrics(&client()).await;
        metric(&m, "sluice_config_reloads_total", &[("result", result)])
    }

    /// Wait (up to 10 s) until `sluice_config_reloads_total{result}` reaches `at_least`.
    pub async fn wait_reloads(&self, result: &str, at_least: f64) {
        let ok = eventually(Duration::from_secs(10), || async {
            self.reloads(result).await >= at_least
        })
        .await;
        assert!(ok, "no {result} reload seen:\n{}", self.log());
    }

    /// The admin listener's `/metrics` text.
    pub async fn metrics(&self, c: &HttpClient) -> String {
        let r = get(c, &self.admin_url("/metrics"), &[]).await;
        assert_eq!(r.status, 200, "{}", self.log());
        r.text()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig} failed");
    }

    /// SIGTERM and wait for the exit status (panics after 40 s).
    pub fn stop(&mut self) -> std::process::ExitStatus {
        self.stop_with("TERM")
    }

    /// Send `sig` and wait for the exit status (panics after 40 s).
    pub fn stop_with(&mut self, sig: &str) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("sluice did not exit after SIG{sig}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory of the process in KiB (from /proc).
    pub fn rss_kib(&self) -> u64 {
        proc_status_kib(self.pid(), "VmRSS:")
    }

    /// Open file descriptors of the process.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

pub fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not json ({e}): {:?}", self.body))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Send one request with optional headers and body; read the whole answer.
pub async fn send(
    c: &HttpClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut b = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(Bytes::copy_from_slice(body))).unwrap();
    let res = tokio::time::timeout(Duration::from_secs(30), c.request(req))
        .await
        .expect("request timed out")
        .expect("request failed");
    let (parts, body) = res.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn get(c: &HttpClient, url: &str, headers: &[(&str, &str)]) -> Reply {
    send(c, Method::GET, url, headers, b"").await
}

/// Poll `f` until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The value of one Prometheus sample (`name{labels}`, labels in any order), 0 if absent.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            continue;
        }
        let rest = rest.trim_end_matches('}');
        let ok = labels
            .iter()
            .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        if ok {
            return value.parse().unwrap();
        }
    }
    0.0
}

/// `config/NAME` from the repository as a test runs it: its listeners removed (the harness
/// adds its own) and the demo upstream it names (`http://127.0.0.1:3000`) replaced by `up`.
pub fn example_config(name: &str, up: &Upstream) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("config").join(name)).unwrap();
    text.lines()
        .filter(|l| !l.starts_with("listen:") && !l.starts_with("admin_listen:"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        .replace("http://127.0.0.1:3000", &up.url())
}

/// `sluice check -c` on `yaml`, written to `dir/sluice.yaml`: (exit ok, stdout, stderr).
pub fn check_config(dir: &std::path::Path, yaml: &str) -> (bool, String, String) {
    let path = dir.join("sluice.yaml");
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new(sluice_bin())
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}
