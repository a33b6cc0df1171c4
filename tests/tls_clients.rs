//! The gateway as a TLS client, with real processes and sockets: `https://` upstreams served
//! by a rustls HTTPS server in this file, verified against a private CA given as `ca`, against
//! the system roots when there is none, or not at all with `insecure_skip_verify` (which warns
//! at every load); `server_name` is both the name verified and the SNI sent; a client
//! certificate is presented to an upstream that requires one; `sluice check` places a missing
//! `ca` at its `tls` entry, and resolves relative paths against the config file. And the
//! rate-limit store over TLS: `rediss://` to a real `redis-server` that requires client
//! certificates decides every request exactly, and without a client certificate the store is
//! unreachable and `on_error: deny` answers 503.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{Acceptor, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::LazyConfigAcceptor;

use support::certs::{Ca, Pair};
use support::redis::{redis_server_bin, RedisServer};
use support::*;

// ---------------------------------------------------------------------------------------
// https upstreams
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifies_an_https_upstream_against_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let up = TlsUpstream::start(&ca.leaf(dir.path(), "up", &["127.0.0.1"], 30), None);
    let s = Sluice::start(&proxy_config(up.addr, &tls_map(&[("ca", &ca_pem)])));

    let r = get(&client(), &s.url("/hello/world?x=1"), &[]).await;
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log());
    let body = r.json();
    assert_eq!(body["path"], "/hello/world", "{body}");
    // The client reached the gateway in cleartext: that is what the upstream is told.
    assert_eq!(body["x_forwarded_proto"], "http", "{body}");
    assert_eq!(up.hits(), 1);
    assert_eq!(up.handshakes().len(), 1, "{:?}", up.handshakes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ca_the_upstream_is_verified_against_the_system_roots() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("private CA no system trusts");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let up = TlsUpstream::start(&ca.leaf(dir.path(), "up", &["127.0.0.1"], 30), None);
    let config = proxy_config(up.addr, "");
    let c = client();

    // The system roots do not know the private CA: the handshake is refused, the request
    // never reaches the upstream, and the client gets a 502 problem.
    let s = Sluice::start(&config);
    let r = get(&c, &s.url("/x"), &[]).await;
    assert_bad_gateway(&r, &s);
    wait_handshake_failure(&up).await;
    assert_eq!(up.hits(), 0);
    assert!(up.handshakes().is_empty(), "{:?}", up.handshakes());
    drop(s);

    // The same config once the CA is a system root (rustls-native-certs reads SSL_CERT_FILE
    // instead of the platform store): proof that no `ca` means the system roots.
    let s = Sluice::start_with(&config, &[("SSL_CERT_FILE", &ca_pem.to_string_lossy())]);
    let r = get(&c, &s.url("/x"), &[]).await;
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log());
    assert_eq!(up.hits(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_skip_verify_accepts_any_certificate_and_warns_at_every_load() {
    let dir = tempfile::tempdir().unwrap();
    // Signed by a CA the gateway is never given, for a name that is not the target's.
    let stranger = Ca::new("unknown CA");
    let up = TlsUpstream::start(
        &stranger.leaf(dir.path(), "up", &["elsewhere.example"], 30),
        None,
    );
    let s = Sluice::start(&proxy_config(
        up.addr,
        "    tls: { insecure_skip_verify: true }\n",
    ));
    let c = client();

    let r = get(&c, &s.url("/anything"), &[]).await;
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log());
    assert_eq!(r.json()["path"], "/anything");
    assert_eq!(up.hits(), 1);
    s.wait_log(&["insecure_skip_verify"]);
    assert_eq!(insecure_warnings(&s.log()), 1, "{}", s.log());

    // A reload loads the config again, and warns again.
    s.signal("HUP");
    s.wait_reloads("success", 1.0).await;
    let again = eventually(Duration::from_secs(5), || async {
        insecure_warnings(&s.log()) >= 2
    })
    .await;
    assert!(again, "no warning at the reload:\n{}", s.log());
    let r = get(&c, &s.url("/after-reload"), &[]).await;
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_name_is_the_name_verified_and_the_sni_sent() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    // Valid for backend.internal only, served at 127.0.0.1.
    let up = TlsUpstream::start(&ca.leaf(dir.path(), "up", &["backend.internal"], 30), None);
    let c = client();

    // Verified as 127.0.0.1 (the target): the certificate does not name it.
    let s = Sluice::start(&proxy_config(up.addr, &tls_map(&[("ca", &ca_pem)])));
    let r = get(&c, &s.url("/by-address"), &[]).await;
    assert_bad_gateway(&r, &s);
    wait_handshake_failure(&up).await;
    assert_eq!(up.hits(), 0);
    assert!(up.handshakes().is_empty(), "{:?}", up.handshakes());
    drop(s);

    let tls = format!(
        "    tls: {{ ca: {}, server_name: backend.internal }}\n",
        yaml_str(&ca_pem)
    );
    let s = Sluice::start(&proxy_config(up.addr, &tls));
    let r = get(&c, &s.url("/by-name"), &[]).await;
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log());
    assert_eq!(r.json()["sni"], "backend.internal", "{}", r.text());
    assert_eq!(up.hits(), 1);
    let handshakes = up.handshakes();
    assert!(
        !handshakes.is_empty()
            && handshakes
                .iter()
                .all(|h| h.sni.as_deref() == Some("backend.internal")),
        "{handshakes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_presents_the_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("sluice test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let server = ca.leaf(dir.path(), "up", &["127.0.0.1"], 30);
    let gateway = ca.leaf(dir.path(), "gateway", &["sluice.gateway"], 30);
    let up = TlsUpstream::start(&server, Some(&ca_pem));
    let c = client();

    // No client certificate: the upstream refuses the handshake.
    let s = Sluice::start(&proxy_config(up.addr, &tls_map(&[("ca", &ca_pem)])));
    let r = get(&c, &s.url("/anonymous"), &[]).await;
    assert_bad_gateway(&r, &s);
    wait_handshake_failure(&up).await;
    assert_eq!(up.hits(), 0);
    assert!(up.handshakes().is_empty(), "{:?}", up.handshakes());
    drop(s);

    let s = Sluice::start(&proxy_config(
        up.addr,
        &tls_map(&[
            ("ca", &ca_pem),
            ("client_cert", &gateway.cert),
            ("client_key", &gateway.key),
        ]),
    ));
    let r = get(&c, &s.url("/authenticated"), &[]).await;
    assert_eq!(r.status, 200, "{r:?}\n{}", s.log());
    assert_eq!(r.json()["path"], "/authenticated");
    assert_eq!(up.hits(), 1);
    let handshakes = up.handshakes();
    assert!(
        !handshakes.is_empty()
            && handshakes
                .iter()
                .all(|h| h.client_cert.as_deref() == Some(&gateway.der[..])),
        "the upstream did not see the configured client certificate: {handshakes:?}"
    );
}

#[test]
fn check_reports_a_missing_ca_at_the_upstreams_tls_entry() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.yaml");
    let text = |ca: &str| {
        format!(
            "upstreams:\n\
             \x20 plain:\n\
             \x20   targets: [\"http://127.0.0.1:1\"]\n\
             \x20 secure:\n\
             \x20   targets: [\"https://127.0.0.1:1\"]\n\
             \x20   tls:\n\
             \x20     ca: {ca}\n\
             routes:\n\
             \x20 - name: all\n\
             \x20   match: {{ path_prefix: / }}\n\
             \x20   upstream: secure\n"
        )
    };
    let yaml = text("missing-ca.pem");
    std::fs::write(&config, &yaml).unwrap();
    let tls_line = 1 + yaml.lines().position(|l| l == "    tls:").unwrap();

    let (ok, out) = sluice_check(&config);
    assert!(
        !ok,
        "check accepted a config whose ca does not exist:\n{out}"
    );
    let at = format!("{}:{tls_line}:5:", config.display());
    assert!(out.contains(&at), "expected an error at `{at}`:\n{out}");
    // A relative path is relative to the config file, not to the working directory.
    let missing = dir.path().join("missing-ca.pem");
    assert!(
        out.contains(&*missing.to_string_lossy()),
        "the error does not name {}:\n{out}",
        missing.display()
    );

    // The same relative path, once the file exists next to the config: accepted.
    Ca::new("sluice test CA").write(&dir.path().join("ca.pem"));
    std::fs::write(&config, text("ca.pem")).unwrap();
    let (ok, out) = sluice_check(&config);
    assert!(ok, "check refused a relative ca next to the config:\n{out}");
}

// ---------------------------------------------------------------------------------------
// Redis over TLS
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_decides_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("redis test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (redis, tls_port) = redis_with_tls(
        &ca_pem,
        &ca.leaf(dir.path(), "redis", &["localhost", "127.0.0.1"], 30),
    );
    let gateway = ca.leaf(dir.path(), "gateway", &["sluice.gateway"], 30);
    let up = Upstream::start();
    let s = Sluice::start(&redis_config(
        tls_port,
        &[
            ("ca", &ca_pem),
            ("client_cert", &gateway.cert),
            ("client_key", &gateway.key),
        ],
        "5s",
        &up,
    ));
    s.wait_log(&["store reachable"]);

    let counts = burst(&s, 100).await;
    assert_eq!(
        counts,
        BTreeMap::from([(200, 10), (429, 90)]),
        "{}\n--- redis ---\n{}",
        s.log(),
        redis.log()
    );
    assert_eq!(up.hits(), 10);
    // The counters live in Redis (looked at through the plain port; the gateway only knows
    // the TLS one): the decisions were Redis's.
    let keys: Vec<String> = redis
        .conn()
        .cmd_ok(&["KEYS", "*"])
        .as_array()
        .iter()
        .map(|k| k.as_str())
        .collect();
    assert!(
        keys.iter().any(|k| k.starts_with("sluice:")),
        "no rate-limit key in Redis: {keys:?}\n{}",
        s.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_without_client_certificate_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("redis test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let (redis, tls_port) = redis_with_tls(
        &ca_pem,
        &ca.leaf(dir.path(), "redis", &["localhost", "127.0.0.1"], 30),
    );
    let up = Upstream::start();
    // Redis requires a client certificate and is given none: the store never connects, so
    // startup gives up after `startup_timeout` and serves per `on_error: deny`.
    let s = Sluice::start(&redis_config(tls_port, &[("ca", &ca_pem)], "1s", &up));

    let counts = burst(&s, 20).await;
    assert_eq!(
        counts,
        BTreeMap::from([(503, 20)]),
        "{}\n--- redis ---\n{}",
        s.log(),
        redis.log()
    );
    let r = get(&client(), &s.url("/x"), &[("X-API-Key", "k")]).await;
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_string();
    assert!(
        detail.starts_with("rate-limit store unavailable"),
        "{detail}"
    );
    assert_eq!(up.hits(), 0);
    assert_eq!(redis.conn().cmd_ok(&["DBSIZE"]).as_int(), 0);
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// One route to upstream `secure` at `https://{target}`, with `tls` (YAML lines, or empty).
fn proxy_config(target: SocketAddr, tls: &str) -> String {
    format!(
        "upstreams:\n  secure:\n    targets: [\"https://{target}\"]\n{tls}\
         routes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: secure\n"
    )
}

/// An upstream's `tls:` line with these file entries.
fn tls_map(files: &[(&str, &Path)]) -> String {
    format!("    tls: {}\n", flow_map(files))
}

/// `{ key: "path", ... }`.
fn flow_map(files: &[(&str, &Path)]) -> String {
    let entries: Vec<String> = files
        .iter()
        .map(|(k, p)| format!("{k}: {}", yaml_str(p)))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}

/// A path as a YAML double-quoted string.
fn yaml_str(p: &Path) -> String {
    serde_json::to_string(&p.to_string_lossy()).unwrap()
}

/// A 502 problem from the gateway (the upstream's TLS failed).
fn assert_bad_gateway(r: &Reply, s: &Sluice) {
    assert_eq!(r.status, 502, "{r:?}\n{}", s.log());
    assert_eq!(
        r.header("content-type"),
        Some("application/problem+json"),
        "{r:?}"
    );
}

/// Wait until the upstream has seen a handshake fail (the server learns of it after the
/// gateway has answered).
async fn wait_handshake_failure(up: &TlsUpstream) {
    let failed = eventually(Duration::from_secs(5), || async {
        !up.failures().is_empty()
    })
    .await;
    assert!(
        failed,
        "the upstream saw no failed handshake; handshakes: {:?}",
        up.handshakes()
    );
}

/// Lines of the log that warn about `insecure_skip_verify`.
fn insecure_warnings(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("WARN") && l.contains("insecure_skip_verify"))
        .count()
}

/// `sluice check -c config`, run from `/` so relative paths cannot resolve against the
/// working directory: whether it succeeded, and its stdout and stderr.
fn sluice_check(config: &Path) -> (bool, String) {
    let out = Command::new(sluice_bin())
        .arg("check")
        .arg("-c")
        .arg(config)
        .current_dir("/")
        .output()
        .expect("run sluice check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A `redis-server` that also listens with TLS (on the returned port) and requires client
/// certificates signed by `ca`; its plain port stays for inspection.
fn redis_with_tls(ca: &Path, server: &Pair) -> (RedisServer, u16) {
    require_redis_tls();
    let tls_port = free_port().to_string();
    let (cert, key) = (server.cert.to_string_lossy(), server.key.to_string_lossy());
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca.to_string_lossy(),
        "--tls-auth-clients",
        "yes",
    ]);
    (redis, tls_port.parse().unwrap())
}

/// Panics with what to do when `redis-server` (found, else the support module panics with
/// the install command) was built without TLS.
fn require_redis_tls() {
    // With both ports 0 a TLS-capable server exits at once ("not listen anywhere"); one
    // without TLS rejects the directive.
    let out = Command::new(redis_server_bin())
        .args(["--port", "0", "--tls-port", "0"])
        .output()
        .expect("run redis-server");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("Bad directive") && !text.contains("FATAL CONFIG"),
        "{} does not support TLS (`tls-port` is rejected): install a build with TLS, such as \
         Debian's (`apt-get install -y redis-server`)\n{text}",
        redis_server_bin()
    );
}

/// A gateway on Redis over TLS at 127.0.0.1:`tls_port` with these `store.redis.tls` files,
/// `on_error: deny`, and 10 requests per API key per hour (`sliding_log`: no window edge).
fn redis_config(
    tls_port: u16,
    tls: &[(&str, &Path)],
    startup_timeout: &str,
    up: &Upstream,
) -> String {
    format!(
        "identities: {{ api_key: {{ header: X-API-Key }} }}\n\
         store:\n  kind: redis\n  on_error: deny\n  redis:\n\
         \x20   url: \"rediss://127.0.0.1:{tls_port}/0\"\n\
         \x20   timeout: 2s\n\
         \x20   startup_timeout: {startup_timeout}\n\
         \x20   tls: {}\n\
         upstreams:\n  up: {{ targets: [\"{}\"] }}\n\
         routes:\n  - name: api\n    match: {{ path_prefix: / }}\n    upstream: up\n    limits:\n\
         \x20     - {{ name: per-key, by: api_key, algorithm: sliding_log, rate: 10/1h }}\n",
        flow_map(tls),
        up.url()
    )
}

/// `n` concurrent requests with the same API key: the count of each status.
async fn burst(s: &Sluice, n: usize) -> BTreeMap<u16, usize> {
    let c = client();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (c, url) = (c.clone(), s.url("/limited"));
            tokio::spawn(async move {
                get(&c, &url, &[("X-API-Key", "tls-key")])
                    .await
                    .status
                    .as_u16()
            })
        })
        .collect();
    let mut counts = BTreeMap::new();
    for t in tasks {
        *counts.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    counts
}

/// A completed TLS handshake, as the upstream saw it.
#[derive(Clone, Debug)]
struct Handshake {
    sni: Option<String>,
    /// The client's end-entity certificate (DER), if it sent one.
    client_cert: Option<Vec<u8>>,
}

/// What the HTTPS upstream has seen.
#[derive(Default)]
struct Seen {
    hits: AtomicUsize,
    handshakes: Mutex<Vec<Handshake>>,
    /// Errors of failed handshakes.
    failures: Mutex<Vec<String>>,
}

/// An HTTPS (HTTP/1.1) upstream on its own thread and runtime, serving `leaf`, requiring a
/// client certificate signed by `client_ca` if given. Answers 200 with a JSON echo of the
/// path, `x-forwarded-proto` and the SNI it received. Stopped on drop.
struct TlsUpstream {
    addr: SocketAddr,
    seen: Arc<Seen>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsUpstream {
    fn start(leaf: &Pair, client_ca: Option<&Path>) -> TlsUpstream {
        let config = server_config(leaf, client_ca);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Seen::default());
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let s = seen.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut rx => break,
                        a = listener.accept() => {
                            let Ok((tcp, _)) = a else { continue };
                            tokio::spawn(serve_tls(tcp, config.clone(), s.clone()));
                        }
                    }
                }
            });
        });
        TlsUpstream {
            addr,
            seen,
            shutdown: Some(tx),
            thread: Some(thread),
        }
    }

    fn hits(&self) -> usize {
        self.seen.hits.load(Ordering::SeqCst)
    }

    fn handshakes(&self) -> Vec<Handshake> {
        self.seen.handshakes.lock().unwrap().clone()
    }

    fn failures(&self) -> Vec<String> {
        self.seen.failures.lock().unwrap().clone()
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One connection: the TLS handshake (recorded either way), then HTTP/1.1.
async fn serve_tls(tcp: tokio::net::TcpStream, config: Arc<ServerConfig>, seen: Arc<Seen>) {
    let fail = |e: std::io::Error| seen.failures.lock().unwrap().push(e.to_string());
    let start = match LazyConfigAcceptor::new(Acceptor::default(), tcp).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    let tls = match start.into_stream(config).await {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let conn = tls.get_ref().1;
    let sni = conn.server_name().map(str::to_owned);
    let client_cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.to_vec());
    seen.handshakes.lock().unwrap().push(Handshake {
        sni: sni.clone(),
        client_cert,
    });
    let svc = service_fn(move |req: Request<Incoming>| {
        seen.hits.fetch_add(1, Ordering::SeqCst);
        let body = serde_json::json!({
            "path": req.uri().path(),
            "x_forwarded_proto": req
                .headers()
                .get("x-forwarded-proto")
                .and_then(|v| v.to_str().ok()),
            "sni": sni,
        });
        let res = Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        async move { Ok::<_, Infallible>(res) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), svc)
        .await;
}

/// A rustls server configuration (ring) for `leaf`, verifying client certificates against
/// `client_ca` when given.
fn server_config(leaf: &Pair, client_ca: Option<&Path>) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&leaf.cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&leaf.key).unwrap();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).unwrap() {
                roots.add(c.unwrap()).unwrap();
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Arc::new(builder.with_single_cert(chain, key).unwrap())
}
