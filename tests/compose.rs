//! docker-compose.yml, checked without Docker: every file it builds from or mounts exists,
//! and services, ports and addresses agree with config/docker.yaml, deploy/prometheus.yml
//! and the Grafana provisioning; config/docker.yaml passes `sluice check`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut v: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    v.apply_merge().unwrap();
    v
}

fn compose() -> Value {
    yaml("docker-compose.yml")
}

fn service<'a>(c: &'a Value, name: &str) -> &'a Value {
    c["services"]
        .get(name)
        .unwrap_or_else(|| panic!("docker-compose.yml has no service `{name}`"))
}

fn str_list(v: &Value) -> Vec<String> {
    match v {
        Value::Sequence(items) => items
            .iter()
            .map(|i| i.as_str().expect("string item").to_string())
            .collect(),
        Value::String(s) => vec![s.clone()],
        _ => vec![],
    }
}

/// `environment:` as a map or a `K=V` list; `${VAR:-default}` resolves to its default.
fn env(svc: &Value, key: &str) -> Option<String> {
    let raw = match &svc["environment"] {
        Value::Mapping(m) => m.get(key).map(|v| match v {
            Value::String(s) => s.clone(),
            other => serde_yaml::to_string(other).unwrap().trim().to_string(),
        }),
        Value::Sequence(items) => items.iter().filter_map(|i| i.as_str()).find_map(|kv| {
            kv.split_once('=')
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| v.to_string())
        }),
        _ => None,
    }?;
    Some(
        match raw.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
            Some(inner) => inner.split_once(":-").map_or("", |(_, d)| d).to_string(),
            None => raw,
        },
    )
}

/// Bind mounts of a service: (host path relative to the repo, container path).
fn binds(svc: &Value) -> Vec<(String, String)> {
    svc["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|v| match v {
            Value::String(s) => {
                let mut parts = s.split(':');
                let (src, dst) = (parts.next()?, parts.next()?);
                src.starts_with('.')
                    .then(|| (src.to_string(), dst.to_string()))
            }
            Value::Mapping(_) if v["type"].as_str() == Some("bind") => Some((
                v["source"].as_str()?.to_string(),
                v["target"].as_str()?.to_string(),
            )),
            _ => None,
        })
        .collect()
}

/// The host file a container path of `svc` comes from, through its bind mounts.
fn host_path(svc: &Value, container: &str) -> Option<PathBuf> {
    binds(svc).into_iter().find_map(|(src, dst)| {
        let rest = container.strip_prefix(dst.trim_end_matches('/'))?;
        let host = root().join(&src);
        match rest.strip_prefix('/') {
            _ if rest.is_empty() => Some(host),
            Some(rest) => Some(host.join(rest)),
            None => None,
        }
    })
}

/// Container ports a service publishes (`HOST:CONTAINER`, `IP:HOST:CONTAINER`, `/tcp`).
fn published(svc: &Value) -> Vec<(u16, u16)> {
    str_list(&svc["ports"])
        .iter()
        .map(|p| {
            let p = p.split('/').next().unwrap();
            let parts: Vec<&str> = p.rsplitn(3, ':').collect();
            let container = parts[0].parse().unwrap();
            let host = parts.get(1).map_or(container, |h| h.parse().unwrap());
            (host, container)
        })
        .collect()
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .unwrap()
        .1
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split(['/', ':']).next().unwrap()
}

#[test]
fn every_built_or_mounted_file_exists() {
    let c = compose();
    let services = c["services"].as_mapping().expect("services");
    for name in [
        "sluice",
        "upstream",
        "redis",
        "prometheus",
        "grafana",
        "traffic",
    ] {
        service(&c, name);
    }
    for (name, svc) in services {
        let name = name.as_str().unwrap();
        match &svc["build"] {
            Value::Null => assert!(svc["image"].is_string(), "{name}: no image or build"),
            b => {
                let ctx = b["context"].as_str().or(b.as_str()).unwrap_or(".");
                let dockerfile = b["dockerfile"].as_str().unwrap_or("Dockerfile");
                let ctx = root().join(ctx);
                assert!(
                    ctx.is_dir(),
                    "{name}: build context {} missing",
                    ctx.display()
                );
                assert!(
                    ctx.join(dockerfile).is_file(),
                    "{name}: {dockerfile} missing"
                );
            }
        }
        for (src, _) in binds(svc) {
            assert!(
                root().join(&src).exists(),
                "{name}: mounts {src}, which does not exist"
            );
        }
    }
}

#[test]
fn dockerfile_builds_both_binaries_and_runs_unprivileged() {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "multi-stage: builder then runtime");
    assert!(
        froms[0].contains("rust:") && froms[0].ends_with(" AS build"),
        "{}",
        froms[0]
    );
    assert!(
        froms[1].contains("debian:") && froms[1].contains("-slim"),
        "{}",
        froms[1]
    );
    // Built by the script that keeps the committed profile applying, strictly, and with the
    // toolchain the profile was made with (its version is in every symbol name).
    assert!(text.contains("scripts/build_release.sh --strict"), "{text}");
    let meta = std::fs::read_to_string(root().join("pgo/sluice.meta")).unwrap();
    let rustc = meta.lines().find_map(|l| l.strip_prefix("rustc=rustc "));
    let version = rustc
        .and_then(|r| r.split(' ').next())
        .expect("pgo/sluice.meta rustc=");
    assert!(
        froms[0].contains(&format!("rust:{version}-")),
        "{} is not the profile's toolchain {version}",
        froms[0]
    );
    // How that script builds (both binaries, each in a cargo run of its own) is checked in
    // tests/release_scripts.rs.
    assert!(text.contains("target/release/sluice target/release/examples/demo_upstream /out/"));
    assert!(root().join("examples/demo_upstream.rs").is_file());
    let user = text
        .lines()
        .rfind(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(!user.contains("root") && user != "USER 0", "{user}");
    assert!(text.contains("ENTRYPOINT [\"sluice\"]"));
    // The upstream service runs the example from that image.
    let c = compose();
    let up = service(&c, "upstream");
    assert_eq!(up["build"], service(&c, "sluice")["build"]);
    assert_eq!(str_list(&up["entrypoint"])[0], "demo_upstream");
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    assert!(ignore.lines().any(|l| l.trim_end_matches('/') == "target"));
}

#[test]
fn services_ports_and_addresses_agree() {
    let c = compose();
    let sluice = service(&c, "sluice");

    // The config sluice runs is config/docker.yaml, reached through a bind mount.
    let cfg_in_container = env(sluice, "SLUICE_CONFIG").expect("SLUICE_CONFIG");
    let cfg_path = host_path(sluice, &cfg_in_container).expect("SLUICE_CONFIG is mounted");
    assert_eq!(
        cfg_path.canonicalize().unwrap(),
        root().join("config/docker.yaml").canonicalize().unwrap()
    );
    let cfg = yaml("config/docker.yaml");
    let listen = cfg["listen"].as_str().unwrap();
    let admin = cfg["admin_listen"].as_str().unwrap();
    assert!(listen.starts_with("0.0.0.0:") && admin.starts_with("0.0.0.0:"));
    let (listen_port, admin_port) = (port_of(listen), port_of(admin));
    let ports = published(sluice);
    assert!(
        ports.iter().any(|p| p.1 == listen_port),
        "data port not published: {ports:?}"
    );
    assert!(
        ports.iter().any(|p| p.1 == admin_port),
        "admin port not published: {ports:?}"
    );
    let token = env(sluice, "SLUICE_ADMIN_TOKEN").unwrap_or_default();
    assert!(
        !token.is_empty(),
        "admin on 0.0.0.0 needs SLUICE_ADMIN_TOKEN"
    );

    // Redis is the `redis` service.
    assert_eq!(cfg["store"]["kind"], "redis");
    let url = cfg["store"]["redis"]["url"].as_str().unwrap();
    assert_eq!(host_of(url), "redis");
    assert_eq!(port_of(url.trim_end_matches("/0")), 6379);
    assert!(service(&c, "redis")["image"]
        .as_str()
        .unwrap()
        .starts_with("redis:"));
    assert!(
        str_list(&sluice["depends_on"]).contains(&"redis".to_string())
            || sluice["depends_on"].get("redis").is_some()
    );

    // Every upstream target is a compose service; the demo one on the port it listens on.
    let up = service(&c, "upstream");
    let up_listen = str_list(&up["entrypoint"])
        .into_iter()
        .chain(str_list(&up["command"]))
        .find(|a| a.contains(':'))
        .expect("demo_upstream ADDR");
    for (name, u) in cfg["upstreams"].as_mapping().unwrap() {
        for t in str_list(&u["targets"]) {
            service(&c, host_of(&t));
            if name == "demo" {
                assert_eq!(host_of(&t), "upstream");
                assert_eq!(
                    port_of(&t),
                    port_of(&up_listen),
                    "demo target vs {up_listen}"
                );
            }
        }
    }

    // Prometheus scrapes sluice's admin port (and gets deploy/prometheus.yml).
    let prom = service(&c, "prometheus");
    let prom_cfg = host_path(prom, "/etc/prometheus/prometheus.yml").expect("mounted config");
    assert_eq!(
        prom_cfg.canonicalize().unwrap(),
        root().join("deploy/prometheus.yml").canonicalize().unwrap()
    );
    let p = yaml("deploy/prometheus.yml");
    let jobs = p["scrape_configs"].as_sequence().unwrap();
    let targets: Vec<String> = jobs
        .iter()
        .flat_map(|j| j["static_configs"].as_sequence().unwrap().iter())
        .flat_map(|s| str_list(&s["targets"]))
        .collect();
    assert!(
        targets.contains(&format!("sluice:{admin_port}")),
        "{targets:?}"
    );
    for j in jobs {
        assert!(j["metrics_path"].is_null() || j["metrics_path"] == "/metrics");
    }

    // Grafana: provisioning and dashboards mounted where the provisioning file looks.
    let g = service(&c, "grafana");
    assert!(
        published(g).contains(&(3000, 3000)),
        "http://localhost:3000"
    );
    let prov = host_path(g, "/etc/grafana/provisioning").expect("provisioning mounted");
    assert_eq!(
        prov.canonicalize().unwrap(),
        root()
            .join("dashboards/provisioning")
            .canonicalize()
            .unwrap()
    );
    let ds = yaml("dashboards/provisioning/datasources/prometheus.yml");
    let ds = &ds["datasources"][0];
    assert_eq!(ds["type"], "prometheus");
    let ds_url = ds["url"].as_str().unwrap();
    service(&c, host_of(ds_url));
    assert_eq!(host_of(ds_url), "prometheus");
    assert_eq!(
        port_of(ds_url),
        9090,
        "Prometheus listens on 9090 in its container"
    );
    let provider = yaml("dashboards/provisioning/dashboards/sluice.yml");
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    let dashboards = host_path(g, path).expect("dashboards mounted at the provider's path");
    assert!(
        dashboards.join("sluice.json").is_file(),
        "{}",
        dashboards.display()
    );
    if let Some(home) = env(g, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH") {
        assert!(host_path(g, &home).is_some_and(|h| h.is_file()), "{home}");
    }

    // Every kind of limit the dashboard has panels for is there, so none stays empty (TLS
    // excepted: the compose file has no certificate).
    let limits: Vec<&serde_yaml::Value> = cfg["routes"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|r| r["limits"].as_sequence().into_iter().flatten())
        .collect();
    assert!(
        limits
            .iter()
            .any(|l| l["cost"]["response_header"].is_string() || !l["count_when"].is_null()),
        "no limit charged by the answer in config/docker.yaml"
    );
    assert!(
        limits.iter().any(|l| l["algorithm"] == "concurrency"),
        "no concurrency limit in config/docker.yaml"
    );

    // The traffic generator talks to sluice's data port, on routes the config has.
    let traffic = str_list(&service(&c, "traffic")["command"]).join("\n");
    assert!(traffic.contains(&format!("http://sluice:{listen_port}/")));
    for route in cfg["routes"].as_sequence().unwrap() {
        let m = &route["match"];
        let path = m["path"].as_str().or(m["path_prefix"].as_str()).unwrap();
        assert!(
            traffic.contains(&format!("sluice:{listen_port}{path}")),
            "no traffic for route {:?}",
            route["name"]
        );
    }
}

#[test]
fn docker_config_passes_sluice_check() {
    let c = compose();
    let token = env(service(&c, "sluice"), "SLUICE_ADMIN_TOKEN").unwrap();
    let run = |token: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
        cmd.current_dir(root())
            .args(["check", "-c", "config/docker.yaml"])
            .env_remove("SLUICE_ADMIN_TOKEN")
            .env_remove("SLUICE_CONFIG");
        if let Some(t) = token {
            cmd.env("SLUICE_ADMIN_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let out = run(Some(&token));
    assert!(
        out.status.success(),
        "sluice check failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.starts_with("config/docker.yaml: OK"), "{summary}");
    // The token is what makes it valid: admin_listen is not loopback.
    let out = run(None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("config/docker.yaml:") && err.contains("SLUICE_ADMIN_TOKEN"),
        "{err}"
    );
    assert!(Path::new(&root().join("config/docker.yaml")).is_file());
}
