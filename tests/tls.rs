//! TLS listeners through the real binary: curl over HTTP/1.1 and HTTP/2, `openssl s_client`
//! for SNI, ALPN and versions, certificates rotated under load (rename-over and Kubernetes
//! symlink swaps) with zero failed requests, pairs that do not load refused at their entry,
//! the expiry gauge, and PROXY protocol in front of cleartext and TLS.

mod support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use rustls::pki_types::{CertificateDer, ServerName};
use support::certs::{Ca, Pair};
use support::{client, eventually, free_port, metric, Sluice, Upstream};

/// A gateway with a cleartext listener (`{ADDR}`) and a TLS one on `tls_port`.
fn config(up: &Upstream, tls_port: u16, tls: &str, extra: &str) -> String {
    format!(
        "listen:
  - address: {{ADDR}}
  - address: 127.0.0.1:{tls_port}
    tls:
{tls}
upstreams:
  up: {{ targets: [\"{}\"] }}
routes:
  - name: all
    match: {{ path_prefix: / }}
    upstream: up
{extra}",
        up.url()
    )
}

fn certificates(pairs: &[&Pair]) -> String {
    let mut s = String::from("      certificates:\n");
    for p in pairs {
        s += &format!(
            "        - {{ cert: {}, key: {} }}\n",
            p.cert.display(),
            p.key.display()
        );
    }
    s
}

fn need(tool: &str, package: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "`{tool}` is needed: apt-get install -y {package}");
}

/// curl through the TLS listener: `(status, http_version, body)`.
fn curl(args: &[&str], url: &str) -> (String, String, String) {
    need("curl", "curl");
    let out = Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code} %{http_version}",
        ])
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, tail) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (code, version) = tail.split_once(' ').unwrap_or((tail, ""));
    assert!(
        out.status.success(),
        "curl {args:?} {url} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code.to_string(), version.to_string(), body.to_string())
}

#[test]
fn https_over_http1_and_http2_beside_cleartext() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let api = ca.leaf(dir.path(), "api", &["localhost"], 90);
    let up = Upstream::start();
    let port = free_port();
    let gw = Sluice::start(&config(&up, port, &certificates(&[&api]), ""));
    let url = format!("https://localhost:{port}/hello");
    let resolve = format!("localhost:{port}:127.0.0.1");
    let ca_arg = ca_pem.to_str().unwrap();

    let (code, version, body) = curl(
        &["--http1.1", "--cacert", ca_arg, "--resolve", &resolve],
        &url,
    );
    assert_eq!((code.as_str(), version.as_str()), ("200", "1.1"));
    let echoed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        echoed["headers"]["x-forwarded-proto"][0], "https",
        "{echoed}"
    );

    let (code, version, body) = curl(
        &["--http2", "--cacert", ca_arg, "--resolve", &resolve],
        &url,
    );
    assert_eq!((code.as_str(), version.as_str()), ("200", "2"), "ALPN h2");
    let echoed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echoed["headers"]["x-forwarded-proto"][0], "https");

    // An HTTP/1.0 client offers ALPN `http/1.0` only: served (it got a fatal alert before).
    let (code, version, _) = curl(
        &["--http1.0", "--cacert", ca_arg, "--resolve", &resolve],
        &url,
    );
    assert_eq!(
        (code.as_str(), version.as_str()),
        ("200", "1"),
        "ALPN http/1.0 (curl writes HTTP/1.0 as `1`)"
    );

    // The cleartext listener beside it says http, and a client that does not trust the CA
    // is refused by its own TLS stack.
    let (code, _, body) = curl(&[], &gw.url("/plain"));
    assert_eq!(code, "200");
    let echoed: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(echoed["headers"]["x-forwarded-proto"][0], "http");
    let untrusting = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--resolve", &resolve, &url])
        .output()
        .unwrap();
    assert!(
        !untrusting.status.success(),
        "curl without the CA must fail"
    );
    assert_eq!(up.hits(), 4);
}

/// `openssl s_client` against the TLS listener: its stdout and whether it connected.
fn s_client(port: u16, args: &[&str]) -> (String, bool) {
    need("openssl", "openssl");
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // s_client holds the connection until stdin closes.
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let connected = text.contains("BEGIN CERTIFICATE") && !text.contains("alert");
    (text, connected)
}

#[test]
fn sni_alpn_and_versions_seen_by_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let api = ca.leaf(dir.path(), "api", &["api.example.test"], 90);
    let other = ca.leaf(
        dir.path(),
        "other",
        &["other.example.test", "*.wild.test"],
        90,
    );
    let up = Upstream::start();
    let port = free_port();
    let strict = free_port();
    let yaml = config(&up, port, &certificates(&[&api, &other]), "").replacen(
        "upstreams:",
        &format!(
            "  - address: 127.0.0.1:{strict}\n    tls:\n{}      min_version: \"1.3\"\nupstreams:",
            certificates(&[&api])
        ),
        1,
    );
    let _gw = Sluice::start(&yaml);
    let ca_arg = ca_pem.to_str().unwrap();
    let subject = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("subject="))
            .unwrap_or("")
            .to_string()
    };

    for (sni, expect) in [
        ("api.example.test", "api.example.test"),
        ("other.example.test", "other.example.test"),
        ("x.wild.test", "other.example.test"),
        ("nobody.test", "api.example.test"),
    ] {
        let (text, ok) = s_client(port, &["-servername", sni, "-CAfile", ca_arg]);
        assert!(ok, "{text}");
        assert!(
            subject(&text).contains(expect),
            "SNI {sni}: {}",
            subject(&text)
        );
        assert!(text.contains("Verify return code: 0 (ok)"), "{text}");
    }
    let (text, _) = s_client(port, &["-noservername", "-CAfile", ca_arg]);
    assert!(
        subject(&text).contains("api.example.test"),
        "no SNI: the default pair"
    );

    let (text, ok) = s_client(port, &["-alpn", "h2,http/1.1"]);
    assert!(ok && text.contains("ALPN protocol: h2"), "{text}");
    let (text, ok) = s_client(port, &["-alpn", "http/1.1"]);
    assert!(ok && text.contains("ALPN protocol: http/1.1"), "{text}");

    let (text, ok) = s_client(port, &["-tls1_2"]);
    assert!(
        ok && text.contains("TLSv1.2"),
        "1.2 allowed by default: {text}"
    );
    let (text, ok) = s_client(port, &["-tls1_3"]);
    assert!(ok && text.contains("TLSv1.3"), "{text}");
    let (text, ok) = s_client(port, &["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"]);
    assert!(!ok, "TLS 1.1 must be refused: {text}");
    let (text, ok) = s_client(strict, &["-tls1_2"]);
    assert!(!ok, "min_version 1.3 refuses 1.2: {text}");
    let (text, ok) = s_client(strict, &["-tls1_3"]);
    assert!(ok, "{text}");
}

/// A self-signed RSA pair for `name` made by openssl (rcgen on *ring* makes no RSA keys).
fn rsa_pair(dir: &Path, name: &str) -> Pair {
    need("openssl", "openssl");
    let (cert, key) = (dir.join("rsa.crt"), dir.join("rsa.key"));
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
        ])
        .args(["-subj", &format!("/CN={name}")])
        .args(["-addext", &format!("subjectAltName=DNS:{name}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    Pair {
        cert,
        key,
        not_after: 0,
        der: vec![],
    }
}

/// An RSA and an ECDSA pair for one name, as nginx serves with two `ssl_certificate` lines:
/// each client gets the one it can use. The second pair was never served, and a client
/// taking only ECDSA got a handshake_failure alert.
#[test]
fn an_rsa_and_an_ecdsa_pair_for_one_name_each_serve_their_clients() {
    let dir = tempfile::tempdir().unwrap();
    let rsa = rsa_pair(dir.path(), "dual.test");
    let ecdsa = Ca::new("test CA").leaf(dir.path(), "ec", &["dual.test"], 30);
    let up = Upstream::start();
    let port = free_port();
    let _gw = Sluice::start(&config(&up, port, &certificates(&[&rsa, &ecdsa]), ""));
    let key = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("Server public key is"))
            .unwrap_or("")
            .to_string()
    };
    for (args, want) in [
        (&["-servername", "dual.test"][..], "2048 bit"),
        (
            &["-servername", "dual.test", "-sigalgs", "ECDSA+SHA256"][..],
            "256 bit",
        ),
        (
            &["-noservername", "-sigalgs", "ECDSA+SHA256"][..],
            "256 bit",
        ),
        (
            &[
                "-servername",
                "dual.test",
                "-tls1_2",
                "-cipher",
                "ECDHE-ECDSA-AES128-GCM-SHA256",
            ][..],
            "256 bit",
        ),
        (
            &[
                "-servername",
                "dual.test",
                "-tls1_2",
                "-cipher",
                "ECDHE-RSA-AES128-GCM-SHA256",
            ][..],
            "2048 bit",
        ),
        (
            &["-servername", "dual.test", "-sigalgs", "RSA-PSS+SHA256"][..],
            "2048 bit",
        ),
    ] {
        let (text, ok) = s_client(port, args);
        assert!(ok, "{args:?}: {text}");
        assert!(key(&text).contains(want), "{args:?}: {}", key(&text));
    }
}

/// The bytes after the handshake must be the protocol ALPN settled (RFC 9113 §3.2, RFC 7301
/// §3.2): an HTTP/1.1 request after `h2` was chosen, or the HTTP/2 preface after `http/1.1`,
/// is not served, so a front end that allows one protocol by ALPN is not gone around.
#[test]
fn the_first_bytes_must_be_the_protocol_alpn_chose() {
    need("openssl", "openssl");
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let api = ca.leaf(dir.path(), "api", &["api.example.test"], 90);
    let up = Upstream::start();
    let port = free_port();
    let _gw = Sluice::start(&config(&up, port, &certificates(&[&api]), ""));
    let speak = |alpn: &str, bytes: &[u8]| {
        let mut child = Command::new("openssl")
            .args(["s_client", "-quiet", "-ign_eof", "-alpn", alpn])
            .args(["-connect", &format!("127.0.0.1:{port}")])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let request = b"GET /x HTTP/1.1\r\nHost: api.example.test\r\nConnection: close\r\n\r\n";
    let served = speak("http/1.1", request);
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    let refused = speak("h2", request);
    assert!(
        refused.is_empty(),
        "HTTP/1.1 served after ALPN h2: {refused}"
    );
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";
    let refused = speak("http/1.1", preface);
    assert!(
        refused.is_empty(),
        "HTTP/2 served after ALPN http/1.1: {refused:?}"
    );
}

/// A TLS client of the gateway (rustls, trusting `ca`).
#[derive(Clone)]
struct Client {
    connector: tokio_rustls::TlsConnector,
    addr: SocketAddr,
}

impl Client {
    fn new(ca: &Path, addr: SocketAddr) -> Client {
        let mut roots = rustls::RootCertStore::empty();
        let pem = std::fs::read(ca).unwrap();
        for c in rustls_pemfile_certs(&pem) {
            roots.add(c).unwrap();
        }
        let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        // Every connection a full handshake: a resumed session shows the certificate of the
        // session it resumes, not the one the listener serves now.
        cfg.resumption = rustls::client::Resumption::disabled();
        Client {
            connector: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
            addr,
        }
    }

    /// A new connection (full handshake): the certificate served, and a request sender.
    async fn connect(
        &self,
        sni: &str,
    ) -> Result<
        (
            CertificateDer<'static>,
            hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
        ),
        String,
    > {
        let tcp = tokio::net::TcpStream::connect(self.addr)
            .await
            .map_err(|e| e.to_string())?;
        let name = ServerName::try_from(sni.to_string()).unwrap();
        let tls = self
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        let cert = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok((cert, send))
    }

    /// One request on `send`: its status.
    async fn request(
        send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    ) -> Result<u16, String> {
        let req = http::Request::get("/r")
            .header("host", "localhost")
            .body(Empty::new())
            .unwrap();
        let res = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = res.status().as_u16();
        res.into_body().collect().await.map_err(|e| e.to_string())?;
        Ok(status)
    }
}

fn rustls_pemfile_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .map(|c| c.unwrap())
        .collect()
}

/// The leaf certificate a handshake for `localhost` on `port` gets, unverified (openssl: a
/// verifying client refuses an expired one before it could be looked at).
fn served_unverified(port: u16) -> Vec<u8> {
    need("openssl", "openssl");
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
        .args(["-servername", "localhost", "-showcerts"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let certs = rustls_pemfile_certs(&out.stdout);
    let leaf = certs.first();
    leaf.unwrap_or_else(|| panic!("no certificate: {out:?}"))
        .to_vec()
}

/// Which pair a new handshake gets now.
async fn served(c: &Client) -> Vec<u8> {
    c.connect("localhost").await.unwrap().0.to_vec()
}

/// Whether new handshakes on every one of `clients` get the certificate `want` within 10 s.
async fn serves_eventually(clients: &[&Client], want: &[u8]) -> bool {
    let clients: Vec<Client> = clients.iter().map(|c| (*c).clone()).collect();
    let want = want.to_vec();
    eventually(Duration::from_secs(10), move || {
        let (clients, want) = (clients.clone(), want.clone());
        async move {
            for c in &clients {
                if served(c).await != want {
                    return false;
                }
            }
            true
        }
    })
    .await
}

/// Replace `dst` with a copy of `src` the way deploy tools do: write a sibling, rename over.
fn rename_over(src: &Path, dst: &Path) {
    let tmp = dst.with_extension("tmp-rename");
    std::fs::copy(src, &tmp).unwrap();
    std::fs::rename(&tmp, dst).unwrap();
}

/// Clients that open a new TLS connection per request, as fast as they can, until `stop`.
/// Returns (ok, failures with their errors).
fn load(c: &Client, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    let c = c.clone();
    tokio::spawn(async move {
        let ok = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (c, stop, ok, failures) =
                    (c.clone(), stop.clone(), ok.clone(), failures.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let result = match c.connect("localhost").await {
                            Ok((_, mut send)) => Client::request(&mut send).await,
                            Err(e) => Err(e),
                        };
                        match result {
                            Ok(200) => {
                                ok.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(s) => failures.lock().push(format!("status {s}")),
                            Err(e) => failures.lock().push(e),
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let f = failures.lock().clone();
        (ok.load(Ordering::SeqCst), f)
    })
}

/// Kubernetes mounts a Secret as `dir/..data -> ..TIMESTAMP/` with `dir/tls.crt ->
/// ..data/tls.crt`; an update writes a new `..TIMESTAMP2/` and renames a new `..data` link
/// over the old one, then removes the old `..TIMESTAMP/`.
fn k8s_publish(dir: &Path, generation: usize, pair: &Pair) {
    let versioned = dir.join(format!("..2026_{generation}"));
    std::fs::create_dir(&versioned).unwrap();
    std::fs::copy(&pair.cert, versioned.join("tls.crt")).unwrap();
    std::fs::copy(&pair.key, versioned.join("tls.key")).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..2026_{generation}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        let link = dir.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), &link).unwrap();
        }
    }
    if let Some(previous) = generation.checked_sub(1) {
        let _ = std::fs::remove_dir_all(dir.join(format!("..2026_{previous}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_under_load_with_zero_failures() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let gens: Vec<Pair> = (0..4)
        .map(|i| ca.leaf(dir.path(), &format!("gen{i}"), &["localhost"], 90))
        .collect();

    // One listener reads a Kubernetes-style secret mount, the other plain files that are
    // replaced by rename-over.
    let secret = dir.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    k8s_publish(&secret, 0, &gens[0]);
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    std::fs::copy(&gens[0].cert, plain.join("tls.crt")).unwrap();
    std::fs::copy(&gens[0].key, plain.join("tls.key")).unwrap();

    let up = Upstream::start();
    let (k8s_port, plain_port) = (free_port(), free_port());
    let yaml = format!(
        "listen:
  - address: {{ADDR}}
  - address: 127.0.0.1:{k8s_port}
    tls:
      certificates:
        - {{ cert: {s}/tls.crt, key: {s}/tls.key }}
  - address: 127.0.0.1:{plain_port}
    tls:
      certificates:
        - {{ cert: {p}/tls.crt, key: {p}/tls.key }}
upstreams:
  up: {{ targets: [\"{}\"] }}
routes:
  - name: all
    match: {{ path_prefix: / }}
    upstream: up
",
        up.url(),
        s = secret.display(),
        p = plain.display(),
    );
    let gw = Sluice::start(&yaml);
    let k8s = Client::new(&ca_pem, format!("127.0.0.1:{k8s_port}").parse().unwrap());
    let files = Client::new(&ca_pem, format!("127.0.0.1:{plain_port}").parse().unwrap());
    assert_eq!(served(&k8s).await, gens[0].der);
    assert_eq!(served(&files).await, gens[0].der);

    // A keep-alive connection opened before the rotations.
    let (old_cert, mut kept) = files.connect("localhost").await.unwrap();
    assert_eq!(Client::request(&mut kept).await, Ok(200));

    let stop = Arc::new(AtomicBool::new(false));
    let load_k8s = load(&k8s, stop.clone());
    let load_files = load(&files, stop.clone());
    for (g, pair) in gens.iter().enumerate().skip(1) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        k8s_publish(&secret, g, pair);
        // Rename-over, the key first: for a moment the pair does not match (that reload is
        // refused and the previous pair keeps serving), then the certificate follows.
        rename_over(&pair.key, &plain.join("tls.key"));
        rename_over(&pair.cert, &plain.join("tls.crt"));
        let rotated = serves_eventually(&[&k8s, &files], &pair.der).await;
        assert!(rotated, "generation {g} never served:\n{}", gw.log());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for (name, task) in [("k8s", load_k8s), ("rename-over", load_files)] {
        let (ok, failures) = task.await.unwrap();
        assert!(ok > 20, "{name}: only {ok} requests went through");
        assert!(
            failures.is_empty(),
            "{name}: {} failed: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
    }
    // The connection opened before keeps its pair and keeps serving.
    assert_eq!(Client::request(&mut kept).await, Ok(200));
    assert_eq!(old_cert.to_vec(), gens[0].der);
    // The file watcher's note about a watch on a directory already swapped away is its own
    // business, not a line per rotation in the gateway's log.
    let log = gw.log();
    assert!(!log.contains("unable to remove watch descriptor"), "{log}");
    let c = client();
    let text = gw.metrics(&c).await;
    assert_eq!(
        metric(
            &text,
            "sluice_tls_certificate_expiry_timestamp_seconds",
            &[
                ("listener", &format!("127.0.0.1:{plain_port}")),
                ("cert", "localhost")
            ]
        ),
        gens[3].not_after as f64
    );
}

/// `sluice check` on a config: (exit ok, stdout, stderr).
fn check(path: &Path) -> (bool, String, String) {
    let out = Command::new(support::sluice_bin())
        .args(["check", "-c"])
        .arg(path)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn pairs_that_do_not_load_are_refused_at_their_entry() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let good = ca.leaf(dir.path(), "good", &["good.test"], 90);
    let other = ca.leaf(dir.path(), "other", &["other.test"], 90);
    let expired = ca.leaf(dir.path(), "expired", &["expired.test"], -2);
    let soon = ca.leaf(dir.path(), "soon", &["soon.test"], 7);
    let up = Upstream::start();
    let write = |name: &str, pairs: &str| -> (PathBuf, String) {
        let text = config(&up, 8443, pairs, "").replace("{ADDR}", "127.0.0.1:8080")
            + "admin_listen: 127.0.0.1:9090\n";
        let path = dir.path().join(name);
        std::fs::write(&path, &text).unwrap();
        (path, text)
    };
    let entry = |cert: &Path, key: &Path| {
        format!(
            "      certificates:\n        - {{ cert: {}, key: {} }}\n",
            cert.display(),
            key.display()
        )
    };

    // `sluice check` fails on the pair `cert`/`key`, at the line naming `cert`, saying every
    // one of `says`; its stderr.
    let refused = |name: &str, cert: &Path, key: &Path, says: &[&str]| -> String {
        let (path, text) = write(name, &entry(cert, key));
        let (ok, _, err) = check(&path);
        assert!(!ok, "{err}");
        let file = cert.file_name().unwrap().to_str().unwrap();
        let at = format!("{}:{}:", path.display(), line_of(&text, file));
        assert!(err.starts_with(&at), "{err}");
        for s in says {
            assert!(err.contains(s), "{s}: {err}");
        }
        err
    };

    // Mismatched: other's key with good's certificate.
    refused(
        "mismatch.yaml",
        &good.cert,
        &other.key,
        &["do not belong together: the certificate's public key is not this key's"],
    );
    // An expired pair loads, with a warning at its entry (as nginx and Envoy serve one):
    // refusing it would stop every reload and a restart until it is renewed.
    let warned = |name: &str, cert: &Path, key: &Path, says: &[&str]| {
        let (path, text) = write(name, &entry(cert, key));
        let (ok, _, err) = check(&path);
        assert!(ok, "{err}");
        let file = cert.file_name().unwrap().to_str().unwrap();
        let at = format!("{}:{}:", path.display(), line_of(&text, file));
        assert!(err.starts_with(&at) && err.contains("warning"), "{err}");
        for s in says {
            assert!(err.contains(s), "{s}: {err}");
        }
    };
    warned(
        "expired.yaml",
        &expired.cert,
        &expired.key,
        &[
            "(expired.test) expired 2 days ago",
            "served anyway; renew it",
        ],
    );

    // A valid leaf whose chain holds an expired certificate: every verifying client would
    // fail, so the pair is warned about as expired, naming the chain's certificate.
    let chained = dir.path().join("chained.crt");
    let chain = std::fs::read_to_string(&good.cert).unwrap()
        + &std::fs::read_to_string(&expired.cert).unwrap();
    std::fs::write(&chained, chain).unwrap();
    warned(
        "chain.yaml",
        &chained,
        &good.key,
        &["(good.test's chain: expired.test) expired"],
    );

    // A file cut short: its error says so in words.
    let cut = dir.path().join("cut.crt");
    let pem = std::fs::read_to_string(&good.cert).unwrap();
    std::fs::write(&cut, &pem[..pem.len() / 2]).unwrap();
    refused(
        "cut.yaml",
        &cut,
        &good.key,
        &["has no `-----END CERTIFICATE-----` line"],
    );
    refused(
        "missing.yaml",
        &dir.path().join("nope.crt"),
        &good.key,
        &["cannot read certificate"],
    );

    // A key under a passphrase, and a key this TLS stack cannot sign with (P-521), each
    // made by openssl: named for what they are, not as a key that does not match.
    need("openssl", "openssl");
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    let encrypted = dir.path().join("encrypted.key");
    openssl(&[
        "pkcs8",
        "-topk8",
        "-in",
        good.key.to_str().unwrap(),
        "-out",
        encrypted.to_str().unwrap(),
        "-passout",
        "pass:secret",
    ]);
    let err = refused("encrypted.yaml", &good.cert, &encrypted, &["is encrypted"]);
    assert!(!err.contains("do not belong together"), "{err}");
    let (p521_cert, p521_key) = (dir.path().join("p521.crt"), dir.path().join("p521.key"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-521",
        "-nodes",
        "-subj",
        "/CN=p521.test",
        "-days",
        "30",
        "-keyout",
        p521_key.to_str().unwrap(),
        "-out",
        p521_cert.to_str().unwrap(),
    ]);
    let err = refused(
        "p521.yaml",
        &p521_cert,
        &p521_key,
        &["cannot sign TLS handshakes", "P-384"],
    );
    assert!(!err.contains("do not belong together"), "{err}");

    // Expiring within 14 days: valid, with a warning at its entry.
    let (path, text) = write("soon.yaml", &entry(&soon.cert, &soon.key));
    let (ok, out, err) = check(&path);
    assert!(ok, "{err}");
    assert!(
        err.starts_with(&format!(
            "{}:{}:",
            path.display(),
            line_of(&text, "soon.crt")
        )) && err.contains("warning")
            && err.contains("soon.test) expires in"),
        "{err}"
    );
    assert!(out.contains("certificate soon.test ("), "{out}");

    // A relative path is relative to the config file.
    std::fs::copy(&good.cert, dir.path().join("rel.crt")).unwrap();
    std::fs::copy(&good.key, dir.path().join("rel.key")).unwrap();
    let (path, _) = write(
        "relative.yaml",
        &entry(Path::new("rel.crt"), Path::new("rel.key")),
    );
    let (ok, out, err) = check(&path);
    assert!(ok, "{err}");
    assert!(out.contains("certificate good.test"), "{out}");
}

/// A gateway whose TLS listener serves the pair in `live/tls.crt` and `live/tls.key` (under
/// a test's directory), as a rotation by rename-over replaces them.
struct Live {
    live: PathBuf,
    up: Upstream,
    port: u16,
    gw: Sluice,
}

impl Live {
    /// Put `first` in place and start the gateway on it.
    fn start(dir: &Path, first: &Pair) -> Live {
        let live = dir.join("live");
        std::fs::create_dir(&live).unwrap();
        rename_over(&first.cert, &live.join("tls.crt"));
        rename_over(&first.key, &live.join("tls.key"));
        let up = Upstream::start();
        let port = free_port();
        let gw = Sluice::start(&config(&up, port, &Live::pair(&live), ""));
        Live { live, up, port, gw }
    }

    /// The listener's certificate list, naming the live files.
    fn pair(live: &Path) -> String {
        format!(
            "      certificates:\n        - {{ cert: {l}/tls.crt, key: {l}/tls.key }}\n",
            l = live.display()
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rotation_keeps_the_old_pair_serving() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let first = ca.leaf(dir.path(), "first", &["localhost"], 90);
    let second = ca.leaf(dir.path(), "second", &["localhost"], 90);
    // `_up` lives to the end of the test, as the gateway's upstream.
    let Live {
        live,
        up: _up,
        port,
        gw,
    } = Live::start(dir.path(), &first);
    let put = |from: &Path, name: &str| rename_over(from, &live.join(name));
    let c = Client::new(&ca_pem, format!("127.0.0.1:{port}").parse().unwrap());
    assert_eq!(served(&c).await, first.der);

    // Only the key changes: the pair no longer matches. The reload is refused (counted, logged
    // at the entry), and the first pair keeps serving.
    put(&second.key, "tls.key");
    gw.wait_reloads("error", 1.0).await;
    let log = gw.wait_log(&["config reload rejected", "do not belong together"]);
    let line = line_of(
        &std::fs::read_to_string(&gw.config_path).unwrap(),
        "tls.crt",
    );
    assert!(
        log.contains(&format!("{}:{line}:", gw.config_path.display())),
        "{log}"
    );
    assert_eq!(served(&c).await, first.der);
    let (_, mut send) = c.connect("localhost").await.unwrap();
    assert_eq!(Client::request(&mut send).await, Ok(200));

    // The certificate follows: the pair matches again and is served.
    put(&second.cert, "tls.crt");
    assert!(serves_eventually(&[&c], &second.der).await, "{}", gw.log());
    assert!(gw.reloads("success").await >= 1.0);

    // An expired pair rotated in over a valid one (a wrong file): refused, the valid one
    // kept.
    let expired = ca.leaf(dir.path(), "expired", &["localhost"], -1);
    let errors = gw.reloads("error").await;
    put(&expired.key, "tls.key");
    put(&expired.cert, "tls.crt");
    gw.wait_reloads("error", errors + 1.0).await;
    gw.wait_log(&["running certificates are all valid and are kept"]);
    assert_eq!(served(&c).await, second.der);
}

/// The guard is per name too: a listener that still lists a long-expired pair for another
/// name (a leftover) refuses an expired pair rotated in over the valid one for `localhost`
/// (it was accepted, with a warning, and served), but not one for the leftover's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_leftover_does_not_switch_the_guard_off_for_other_names() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    let first = ca.leaf(dir.path(), "first", &["localhost"], 90);
    rename_over(&first.cert, &live.join("tls.crt"));
    rename_over(&first.key, &live.join("tls.key"));
    // Started with the leftover, and an expired second pair for `localhost` (an ECDSA half,
    // say): a start takes any pair, with a warning.
    let leftover = ca.leaf(dir.path(), "leftover", &["old.test"], -30);
    let stale = ca.leaf(dir.path(), "stale", &["localhost"], -3);
    let mut both = Live::pair(&live);
    for p in [&leftover, &stale] {
        both += &format!(
            "        - {{ cert: {}, key: {} }}\n",
            p.cert.display(),
            p.key.display()
        );
    }
    let up = Upstream::start();
    let port = free_port();
    let gw = Sluice::start(&config(&up, port, &both, ""));
    let c = Client::new(&ca_pem, format!("127.0.0.1:{port}").parse().unwrap());
    let served_first = served(&c).await;
    assert_eq!(served_first, first.der);

    // Expired pairs that run already are not new: a reload that changes something else goes
    // through (the guard refused it for `stale`, whose name a valid pair serves).
    gw.replace_config(&config(&up, port, &both, "").replace("name: all", "name: all2"));
    gw.wait_reloads("success", 1.0).await;

    let wrong = ca.leaf(dir.path(), "wrong", &["localhost"], -1);
    rename_over(&wrong.key, &live.join("tls.key"));
    rename_over(&wrong.cert, &live.join("tls.crt"));
    gw.wait_reloads("error", 1.0).await;
    gw.wait_log(&["a valid certificate for `localhost` runs and is kept"]);
    assert_eq!(
        served(&c).await,
        served_first,
        "the valid pair keeps serving"
    );

    // Put right, then the leftover replaced by another expired pair: nothing valid serves
    // `old.test`, so that goes in with its warning.
    let right = ca.leaf(dir.path(), "right", &["localhost"], 90);
    rename_over(&right.key, &live.join("tls.key"));
    rename_over(&right.cert, &live.join("tls.crt"));
    assert!(serves_eventually(&[&c], &right.der).await, "{}", gw.log());
    let successes = gw.reloads("success").await;
    let older = ca.leaf(dir.path(), "older", &["old.test"], -40);
    rename_over(&older.key, &leftover.key);
    rename_over(&older.cert, &leftover.cert);
    gw.wait_reloads("success", successes + 1.0).await;
    assert_eq!(gw.reloads("error").await, 1.0, "{}", gw.log());
}

/// An expired certificate does not take the gateway down: it starts and serves with it (as
/// nginx and Envoy do), with a warning, and reloads that change anything else go through,
/// until a renewed pair replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_blocks_neither_start_nor_reloads() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let expired = ca.leaf(dir.path(), "expired", &["localhost"], -1);
    let renewed = ca.leaf(dir.path(), "renewed", &["localhost"], 90);
    let Live { live, up, port, gw } = Live::start(dir.path(), &expired);
    let put = |from: &Path, name: &str| rename_over(from, &live.join(name));
    gw.wait_log(&["expired 1 days ago", "served anyway"]);
    let c = Client::new(&ca_pem, format!("127.0.0.1:{port}").parse().unwrap());
    assert_eq!(served_unverified(port), expired.der);

    // Another change reloads while the running pair is expired.
    let version = gw.config_version();
    let renamed = config(&up, port, &Live::pair(&live), "").replace("name: all", "name: all2");
    gw.replace_config(&renamed);
    gw.wait_reloads("success", 1.0).await;
    assert_ne!(gw.config_version(), version);

    // And the renewal is served (a verifying client refuses the expired one till then).
    put(&renewed.key, "tls.key");
    put(&renewed.cert, "tls.crt");
    let want = renewed.der.clone();
    let renewed_served = eventually(Duration::from_secs(10), move || {
        let want = want.clone();
        async move { served_unverified(port) == want }
    })
    .await;
    assert!(renewed_served, "{}", gw.log());
    assert_eq!(served(&c).await, renewed.der);
}

/// A raw HTTP/1.1 exchange: `prefix` (a PROXY header) then a GET, the whole answer.
fn raw_exchange(addr: SocketAddr, prefix: &[u8], path: &str) -> String {
    raw_exchange_with(addr, prefix, path, "")
}

/// [`raw_exchange`] with `fields` (`Name: value\r\n` lines) in the GET's head.
fn raw_exchange_with(addr: SocketAddr, prefix: &[u8], path: &str, fields: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(prefix).unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{fields}Connection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).to_string()
}

fn v2_header(src: [u8; 4], src_port: u16) -> Vec<u8> {
    let mut h = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    h.push(0x21); // version 2, PROXY
    h.push(0x11); // TCP over IPv4
    h.extend_from_slice(&12u16.to_be_bytes());
    h.extend_from_slice(&src);
    h.extend_from_slice(&[10, 0, 0, 1]);
    h.extend_from_slice(&src_port.to_be_bytes());
    h.extend_from_slice(&80u16.to_be_bytes());
    h
}

/// The X-Forwarded-For the upstream received (it echoes the request as JSON).
fn forwarded_for(answer: &str) -> String {
    let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["headers"]["x-forwarded-for"][0]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn pp_config(up: &Upstream, trusted: &str) -> String {
    format!(
        "listen:
  - address: {{ADDR}}
    proxy_protocol: true
client_ip:
  trusted_proxies: [{trusted}]
upstreams:
  up: {{ targets: [\"{}\"] }}
routes:
  - name: all
    match: {{ path_prefix: / }}
    upstream: up
    limits:
      - {{ name: per-ip, by: ip, algorithm: fixed_window, rate: 2/1m }}
",
        up.url()
    )
}

/// The PROXY header and the first bytes of HTTP share one `client_header_timeout` from
/// accept: a client that spends most of it on the header cannot have it again for the rest.
#[test]
fn the_proxy_header_and_the_first_bytes_share_one_timeout() {
    let up = Upstream::start();
    let gw = Sluice::start(&format!(
        "{}client_header_timeout: 2s\n",
        pp_config(&up, "127.0.0.1/32")
    ));
    let exchange = |header_after: u64, request_after: u64| {
        let mut s = std::net::TcpStream::connect(gw.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
        std::thread::sleep(Duration::from_millis(header_after));
        let _ = s.write_all(b"PROXY TCP4 203.0.113.9 10.0.0.1 5555 80\r\n");
        std::thread::sleep(Duration::from_millis(request_after));
        let _ = s.write_all(b"GET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).to_string()
    };
    // Both well within the 2 s: served.
    assert!(exchange(300, 300).starts_with("HTTP/1.1 200"));
    // The header after 1 s, the request 1.6 s later: past 2 s from accept, though within 2 s
    // of the header. Closed without an answer.
    assert_eq!(exchange(1000, 1600), "");
}

#[test]
fn proxy_protocol_names_the_client_only_for_trusted_proxies() {
    let up = Upstream::start();
    // The harness waits for the data port with a bare connect; the gateway closes it when no
    // PROXY header arrives in time, which is what a health check expects.
    let gw = Sluice::start(&pp_config(&up, "127.0.0.1/32"));
    let v1 = b"PROXY TCP4 203.0.113.7 10.0.0.1 5555 80\r\n";
    let a = raw_exchange(gw.addr, v1, "/one");
    assert!(a.starts_with("HTTP/1.1 200"), "{a}");
    assert_eq!(forwarded_for(&a), "203.0.113.7", "{a}");
    // v2 for the same client shares its limit (2 a minute): the third is refused.
    let b = raw_exchange(gw.addr, &v2_header([203, 0, 113, 7], 6000), "/two");
    assert!(b.starts_with("HTTP/1.1 200"), "{b}");
    assert_eq!(forwarded_for(&b), "203.0.113.7");
    let c = raw_exchange(gw.addr, v1, "/three");
    assert!(c.starts_with("HTTP/1.1 429"), "{c}");
    // Another client behind the same proxy has its own budget.
    let d = raw_exchange(
        gw.addr,
        b"PROXY TCP4 203.0.113.8 10.0.0.1 5555 80\r\n",
        "/four",
    );
    assert!(d.starts_with("HTTP/1.1 200"), "{d}");
    // LOCAL (a load balancer's health check) and UNKNOWN: the connection's own peer stands.
    let e = raw_exchange(gw.addr, b"PROXY UNKNOWN\r\n", "/five");
    assert!(e.starts_with("HTTP/1.1 200"), "{e}");
    assert_eq!(forwarded_for(&e), "127.0.0.1");
    // And its forwarding headers are the client's own (a proxy speaking PROXY writes none):
    // not believed, though the peer is trusted. Every such request counts as the peer's.
    let mut statuses = Vec::new();
    for i in 1..=3 {
        let fields = format!("X-Forwarded-For: 198.51.100.{i}\r\nX-Real-IP: 198.51.100.{i}\r\n");
        let a = raw_exchange_with(gw.addr, b"PROXY UNKNOWN\r\n", "/six", &fields);
        statuses.push(a[9..12].to_string());
        if a.starts_with("HTTP/1.1 200") {
            let body: serde_json::Value =
                serde_json::from_str(&a[a.find("\r\n\r\n").unwrap() + 4..]).unwrap();
            assert_eq!(body["headers"]["x-real-ip"][0], "127.0.0.1", "{a}");
        }
    }
    assert_eq!(
        statuses,
        ["200", "429", "429"],
        "the peer's budget, used once above"
    );
    // No header, or a malformed one: closed without an answer, never forwarded.
    let hits = up.hits();
    assert_eq!(raw_exchange(gw.addr, b"", "/no-header"), "");
    assert_eq!(
        raw_exchange(gw.addr, b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "/bad"),
        ""
    );
    assert_eq!(up.hits(), hits);
    drop(gw);

    // The same header from a peer that is not a trusted proxy is read but not believed.
    let gw = Sluice::start(&pp_config(&up, "10.9.9.9/32"));
    for i in 0..3 {
        let a = raw_exchange(
            gw.addr,
            format!("PROXY TCP4 198.51.100.{i} 10.0.0.1 5555 80\r\n").as_bytes(),
            "/x",
        );
        if i < 2 {
            assert!(a.starts_with("HTTP/1.1 200"), "{a}");
            assert_eq!(forwarded_for(&a), "127.0.0.1");
        } else {
            assert!(
                a.starts_with("HTTP/1.1 429"),
                "all three count as 127.0.0.1: {a}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_protocol_before_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let ca_pem = ca.write(&dir.path().join("ca.pem"));
    let pair = ca.leaf(dir.path(), "api", &["localhost"], 90);
    let up = Upstream::start();
    let port = free_port();
    let yaml = config(
        &up,
        port,
        &certificates(&[&pair]),
        "client_ip:\n  trusted_proxies: [127.0.0.1/32]\n",
    )
    .replace("    tls:\n", "    proxy_protocol: true\n    tls:\n");
    let _gw = Sluice::start(&yaml);
    let c = Client::new(&ca_pem, format!("127.0.0.1:{port}").parse().unwrap());

    let mut tcp = tokio::net::TcpStream::connect(c.addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    tcp.write_all(b"PROXY TCP6 2001:db8::7 2001:db8::1 4000 443\r\n")
        .await
        .unwrap();
    let tls = c
        .connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/pp")
        .header("host", "localhost")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    assert_eq!(res.status(), 200);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["headers"]["x-forwarded-for"][0], "2001:db8::7");
    assert_eq!(v["headers"]["x-forwarded-proto"][0], "https");

    // Without the header, the TLS ClientHello itself is refused as a PROXY header.
    assert!(c.connect("localhost").await.is_err());
    assert_eq!(up.hits(), 1);
}

/// A gateway whose TLS listener serves `first`, a `second` leaf for the same name to rotate
/// to, and a client that trusts their CA (already served `first`).
struct Rotation {
    dir: tempfile::TempDir,
    ca: Ca,
    first: Pair,
    second: Pair,
    up: Upstream,
    port: u16,
    gw: Sluice,
    c: Client,
}

impl Rotation {
    async fn start() -> Rotation {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("test CA");
        let ca_pem = ca.write(&dir.path().join("ca.pem"));
        let first = ca.leaf(dir.path(), "first", &["localhost"], 90);
        let second = ca.leaf(dir.path(), "second", &["localhost"], 90);
        let up = Upstream::start();
        let port = free_port();
        let gw = Sluice::start(&config(&up, port, &certificates(&[&first]), ""));
        let c = Client::new(&ca_pem, format!("127.0.0.1:{port}").parse().unwrap());
        assert_eq!(served(&c).await, first.der);
        Rotation {
            dir,
            ca,
            first,
            second,
            up,
            port,
            gw,
            c,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_named_before_it_exists_is_served_once_it_appears() {
    let Rotation {
        dir,
        ca,
        first,
        second: later,
        up,
        port,
        gw,
        c,
    } = Rotation::start().await;
    let serves = |want: Vec<u8>| {
        let c = c.clone();
        async move { serves_eventually(&[&c], &want).await }
    };

    // The config names files that do not exist yet, in the watched directory of the first
    // pair: refused, the first pair keeps serving.
    let named = |stem: &str, from: &Pair| Pair {
        cert: dir.path().join(format!("{stem}.crt")),
        key: dir.path().join(format!("{stem}.key")),
        ..from.clone()
    };
    let pending = named("pending", &later);
    gw.replace_config(&config(&up, port, &certificates(&[&pending]), ""));
    gw.wait_reloads("error", 1.0).await;
    assert_eq!(served(&c).await, first.der);
    // They appear: that is a change of what the config names, so it reloads by itself.
    std::fs::copy(&later.key, &pending.key).unwrap();
    std::fs::copy(&later.cert, &pending.cert).unwrap();
    assert!(serves(later.der.clone()).await, "{}", gw.log());

    // Files in a directory that does not exist yet: once it exists a signal loads them, and
    // from then on that directory is watched (a rename-over there is picked up by itself).
    let incoming = dir.path().join("incoming");
    let (cert, key) = (incoming.join("tls.crt"), incoming.join("tls.key"));
    let elsewhere = Pair {
        cert: cert.clone(),
        key: key.clone(),
        ..first.clone()
    };
    gw.replace_config(&config(&up, port, &certificates(&[&elsewhere]), ""));
    gw.wait_reloads("error", 2.0).await;
    std::fs::create_dir(&incoming).unwrap();
    std::fs::copy(&first.cert, &cert).unwrap();
    std::fs::copy(&first.key, &key).unwrap();
    gw.signal("HUP");
    assert!(serves(first.der.clone()).await, "{}", gw.log());
    let next = ca.leaf(dir.path(), "next", &["localhost"], 90);
    rename_over(&next.key, &key);
    rename_over(&next.cert, &cert);
    assert!(serves(next.der.clone()).await, "{}", gw.log());
}

/// A reload that changes the listener set (which waits for a restart) and a TLS listener's
/// certificates (which apply at once): the new pair is served, and `/admin/config` lists the
/// running listeners with the certificates they now serve, not the ones they started with.
/// Listeners are compared by address: the same ones written in another order need no restart
/// (each was reported as `listen` changed, on every reload until a restart), and a listener
/// really added is named in the warning.
#[tokio::test]
async fn admin_config_lists_the_certificates_served_while_a_listener_change_waits() {
    // `dir` is bound so that it lives (and holds the files) to the end of the test.
    let Rotation {
        dir: _dir,
        first,
        second,
        up,
        port,
        gw,
        c,
        ..
    } = Rotation::start().await;

    // The TLS listener written first, serving `pair`.
    let swapped = |pair: &Pair| {
        let tls = format!(
            "  - address: 127.0.0.1:{port}\n    tls:\n{}",
            certificates(&[pair])
        );
        config(&up, port, &certificates(&[pair]), "")
            .replacen(&tls, "", 1)
            .replacen("listen:\n", &format!("listen:\n{tls}"), 1)
    };
    assert!(swapped(&first).starts_with(&format!("listen:\n  - address: 127.0.0.1:{port}")));
    gw.replace_config(&swapped(&first));
    // Logged after any restart warning, so that one would be in the log by now.
    let log = gw.wait_log(&["config reloaded"]);
    assert!(!log.contains("need a restart"), "{log}");

    // A listener added and the certificate changed in one reload.
    let added = free_port();
    gw.replace_config(&swapped(&second).replacen(
        "listen:\n",
        &format!("listen:\n  - address: 127.0.0.1:{added}\n"),
        1,
    ));
    assert!(serves_eventually(&[&c], &second.der).await, "{}", gw.log());
    let log = gw.wait_log(&["need a restart"]);
    let line = log.lines().find(|l| l.contains("need a restart")).unwrap();
    assert!(line.contains(&format!("127.0.0.1:{added}")), "{line}");
    assert!(!line.contains(&format!("127.0.0.1:{port}")), "{line}");
    let r = support::get(&client(), &gw.admin_url("/admin/config"), &[]).await;
    let doc = r.json();
    let listen = doc["config"]["listen"].as_array().expect("a list").clone();
    assert_eq!(listen.len(), 2, "the running listeners: {doc}");
    assert!(
        !doc.to_string().contains(&format!("127.0.0.1:{added}")),
        "the added listener waits for a restart: {doc}"
    );
    let shown = &listen[0]["tls"]["certificates"][0]["cert"];
    assert_eq!(
        shown.as_str(),
        Some(second.cert.display().to_string().as_str()),
        "{doc}"
    );
}

/// A client that asks to renegotiate is refused (rustls never renegotiates) without a log
/// line: rustls reports each refusal at WARN, and a client may ask again and again, so its
/// records are errors only unless `RUST_LOG` names it.
#[test]
fn a_renegotiation_request_does_not_reach_the_log() {
    need("openssl", "openssl");
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let pair = ca.leaf(dir.path(), "leaf", &["localhost"], 90);
    let up = Upstream::start();
    let port = free_port();
    // openssl waits for the refused handshake until the gateway closes the connection.
    let gw = Sluice::start(&config(
        &up,
        port,
        &certificates(&[&pair]),
        "client_header_timeout: 2s\n",
    ));
    // s_client reads "R" at the start of a line as "renegotiate" (TLS 1.2 only).
    let mut child = Command::new("openssl")
        .args(["s_client", "-tls1_2", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..3 {
        let _ = stdin.write_all(b"R\n");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("RENEGOTIATING"),
        "no renegotiation was asked: {said}"
    );
    // A line logged after the attempts: the log has been flushed past them.
    let c = client();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async { support::get(&c, &gw.url("/"), &[]).await });
    let log = gw.wait_log(&["\"status\":200"]);
    assert!(!log.contains("Renegotiation"), "{log}");
    assert!(!log.contains("rustls"), "{log}");
}
