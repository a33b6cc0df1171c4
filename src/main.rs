//! `sluice` command line: `run` (the default), `check`, `--version`.

use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use sluice::config;
use sluice::config::Loaded;
use sluice::model::policy::RedisMode;
use sluice::model::tls::TlsVersion;

/// The crate's version, and whether the build is profile-guided (scripts/rustc-pgo, the
/// release builds' rustc wrapper, passes `--cfg sluice_pgo` with the profile).
const VERSION: &str = if cfg!(sluice_pgo) {
    concat!(env!("CARGO_PKG_VERSION"), " (profile-guided)")
} else {
    env!("CARGO_PKG_VERSION")
};

#[derive(Parser)]
#[command(
    name = "sluice",
    version = VERSION,
    about = "HTTP reverse-proxy gateway with built-in, distributed rate limiting"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Config file (default: $SLUICE_CONFIG, then config/sluice.yaml).
    #[arg(
        short = 'c',
        long = "config",
        global = true,
        env = "SLUICE_CONFIG",
        default_value = "config/sluice.yaml"
    )]
    config: PathBuf,
    /// Log format on stderr (default: human on a terminal, JSON otherwise).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
}

#[derive(Subcommand)]
enum Command {
    /// Serve (the default).
    Run,
    /// Validate the config offline and print a summary.
    Check {
        /// Also connect to the configured store and ping it.
        #[arg(long)]
        connect: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

/// mimalloc instead of glibc's malloc: in an A/B on the same machine (ABAB, wrk -t1 -c64, 3
/// rounds), 3–16 % more plain-proxy requests per gateway CPU-second and 8–21 % on a limited
/// route in 5 of 6 pairs (docs/performance.md); a request allocates and frees small objects
/// across threads, which is what mimalloc is built for. Called through `sluice::alloc`, which
/// keeps small alignments off mimalloc's aligned API.
#[global_allocator]
static GLOBAL: sluice::alloc::Mimalloc = sluice::alloc::Mimalloc;

fn main() -> ExitCode {
    // Compose and Helm templates often set SLUICE_CONFIG to an empty string: that is unset
    // (the default applies), not a config path clap would refuse as missing.
    if std::env::var_os("SLUICE_CONFIG").is_some_and(|v| v.is_empty()) {
        std::env::remove_var("SLUICE_CONFIG");
    }
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Check { connect } => check(&cli.config, connect),
        Command::Run => run(&cli.config, cli.log_format),
    }
}

fn load_or_report(path: &std::path::Path) -> Option<Loaded> {
    match config::load(path) {
        Ok(t) => Some(t),
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            None
        }
    }
}

fn run(path: &std::path::Path, format: Option<LogFormat>) -> ExitCode {
    let logs = init_logging(format);
    // The first worker; `runtime::app::run` starts the others, one thread each. Built before
    // the config is read, so the signal handlers are in place while it loads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let signals = {
        let _in = rt.enter();
        sluice::runtime::app::Signals::install()
    };
    let signals = match signals {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    let Some(loaded) = load_or_report(path) else {
        return ExitCode::from(1);
    };
    let code = rt.block_on(sluice::runtime::app::run(
        loaded,
        path.to_path_buf(),
        signals,
    ));
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    logs.flush();
    ExitCode::from(code as u8)
}

fn check(path: &std::path::Path, connect: bool) -> ExitCode {
    let Some(t) = load_or_report(path) else {
        return ExitCode::from(1);
    };
    for w in &t.warnings {
        eprintln!("{}:{}:{}: warning: {}", w.file, w.line, w.col, w.message);
    }
    let mut out = summary(path, &t);
    // With `--connect`, the summary is printed only once the store answered: either it and
    // exit 0, or the errors and exit 1.
    if connect {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let result = rt.block_on(async {
            let gw = sluice::runtime::app::gateway(t, path.to_path_buf()).await;
            gw.store.wait_ready(std::time::Duration::from_secs(3)).await
        });
        match result {
            Ok(()) => out.push_str("store: reachable\n"),
            Err(e) => {
                eprintln!("{}: store unreachable: {e}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    // Not `print!`, which panics when stdout is closed (`sluice check | head -1`).
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(out.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            eprintln!("cannot write the summary: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}

fn summary(path: &std::path::Path, loaded: &Loaded) -> String {
    use std::fmt::Write;
    let (boot, t, file) = (&loaded.boot, &loaded.table, &loaded.file);
    let mut s = String::new();
    let _ = writeln!(s, "{}: OK, version {}", path.display(), t.version);
    for (l, certs) in boot.listeners.iter().zip(&loaded.tls.listeners) {
        let tls = match &l.tls {
            Some(t) if t.min_version == TlsVersion::V1_3 => " tls 1.3",
            Some(_) => " tls 1.2+",
            None => "",
        };
        let pp = if l.proxy_protocol {
            " proxy_protocol"
        } else {
            ""
        };
        let _ = writeln!(s, "listen {}{tls}{pp}", l.address);
        #[allow(clippy::disallowed_methods)] // days left of a certificate: wall clock
        let now = std::time::SystemTime::now();
        for info in certs.iter().flat_map(|c| &c.infos) {
            let _ = writeln!(
                s,
                "  certificate {} ({} days left)",
                info.name,
                info.seconds_left(now) / 86_400
            );
        }
    }
    let _ = writeln!(s, "admin {}  workers {}", boot.admin_listen, boot.workers);
    let store = match boot.store.kind {
        sluice::model::policy::StoreKind::Memory => {
            format!("memory (max {} keys)", boot.store.memory_max_keys)
        }
        sluice::model::policy::StoreKind::Redis => {
            let r = &boot.store.redis;
            let url = r.url.as_deref().map(config::compile::redact_url);
            match r.mode {
                RedisMode::Standalone => format!("redis standalone {}", url.unwrap_or_default()),
                RedisMode::Cluster => {
                    let seeds: Vec<String> = url.into_iter().chain(r.nodes.clone()).collect();
                    format!("redis cluster {}", seeds.join(","))
                }
                RedisMode::Sentinel => format!(
                    "redis sentinel {} (service {})",
                    r.nodes.join(","),
                    r.sentinel_service.as_deref().unwrap_or_default()
                ),
            }
        }
    };
    // As written in the YAML (`deny`), not as the Rust enum is named.
    let on_error = serde_json::to_value(boot.store.on_error)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let _ = writeln!(s, "store {store}  on_error {on_error}");
    let _ = writeln!(
        s,
        "upstreams {}",
        file.upstreams
            .iter()
            .map(|(n, u)| format!("{n} ({})", u.targets.join(" ")))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(s, "routes {}:", t.routes.len());
    for (r, fr) in t.routes.iter().zip(&file.routes) {
        let m = &fr.matcher;
        let path = m
            .path
            .as_deref()
            .map(|p| format!("path {p}"))
            .or(m.path_prefix.as_deref().map(|p| format!("prefix {p}")))
            .or(m.path_regex.as_deref().map(|p| format!("regex {p}")))
            .unwrap_or_default();
        // As compiled (`GET` brings `HEAD`), not as written.
        let methods = r
            .matcher
            .methods
            .as_ref()
            .map(|ms| ms.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(",") + " ")
            .unwrap_or_default();
        let _ = writeln!(s, "  {:<20} {methods}{path} -> {}", r.name, fr.upstream);
        for l in &fr.limits {
            let by = flow(&l.by);
            let burst = l.burst.map(|b| format!(" burst {b}")).unwrap_or_default();
            let shadow = if l.shadow { " (shadow)" } else { "" };
            let _ = writeln!(
                s,
                "      limit {:<14} {} {}{burst} by {by}{shadow}",
                l.name,
                l.algorithm,
                l.describe()
            );
        }
    }
    let consumers = &t.consumers;
    if !consumers.plans.is_empty() {
        let anonymous = consumers
            .anonymous
            .map(|p| format!(" (anonymous: {})", consumers.plans[p].name))
            .unwrap_or_default();
        let _ = writeln!(s, "plans {}{anonymous}:", consumers.plans.len());
        for (i, (plan, fp)) in consumers.plans.iter().zip(file.plans.values()).enumerate() {
            let n = consumers.list.iter().filter(|c| c.plan == i).count();
            let limits: Vec<String> = fp
                .limits
                .iter()
                .map(|l| format!("{} {} {}", l.name, l.algorithm, l.describe()))
                .collect();
            let _ = writeln!(
                s,
                "  {:<20} {n} consumer(s); {}",
                plan.name,
                limits.join(", ")
            );
        }
    }
    s
}

fn init_logging(format: Option<LogFormat>) -> sluice::telemetry::logging::Buffered {
    let terminal = std::io::stderr().is_terminal();
    let json = match format {
        Some(LogFormat::Json) => true,
        Some(LogFormat::Human) => false,
        None => !terminal,
    };
    sluice::telemetry::logging::init(json, terminal && !json)
}

/// A `by` on one line, as flow style writes it: `ip`, `[ip, api_key]`.
fn flow(v: &serde_yaml::Value) -> String {
    match v {
        serde_yaml::Value::Sequence(items) => {
            format!(
                "[{}]",
                items.iter().map(flow).collect::<Vec<_>>().join(", ")
            )
        }
        serde_yaml::Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .replace('\n', " "),
    }
}
