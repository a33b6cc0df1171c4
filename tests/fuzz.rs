//! Fuzzing on the stable toolchain: one property test per input parser (no libFuzzer, so no
//! cargo-fuzz). Each target first replays every file of its seed corpus in
//! `tests/corpus/<target>/` (see `tests/corpus/README.md`), then runs proptest-generated
//! inputs: arbitrary bytes or strings, and structure-aware ones built from the real grammar.
//! Every target asserts invariants of the result, not only "no panic".
//!
//! `SLUICE_FUZZ_CASES=N` sets the number of generated cases of every target (default: a few
//! hundred, so the file runs in seconds in debug); `SLUICE_FUZZ_SEED=N` replays a run (each
//! target prints its seed, shown when it fails). `scripts/fuzz.sh` runs long campaigns.
//!
//! The bugs fuzzing found are fixed; `found_bugs_stay_fixed` replays each minimal input.

use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{RngSeed, TestCaseError, TestRunner};
use sha2::Sha256;

use sluice::limiter::algo::{Algorithm, Code, Decision, Params, MAX_EXACT};
use sluice::limiter::store::memory::{Clock, MemoryStore};
use sluice::limiter::store::scripts::{argv, decisions, ARGS_PER_KEY};
use sluice::limiter::store::LimitCall;
use sluice::limiter::store::Store;
use sluice::model::identity::{ClientIpRules, IdentitySources, JwtSource};
use sluice::model::path::{normalize, EscapedSlashes, PathError, PathRules};
use sluice::pipeline::identify::{bearer_token, Identity};
use sluice::pipeline::respond::GatewayError;

// ---------------------------------------------------------------------------------------------
// Harness: corpus, case counts, seeds.

/// Generated cases per target: `default`, or `SLUICE_FUZZ_CASES` when set.
fn cases(default: u32) -> u32 {
    std::env::var("SLUICE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The settings of one target's generated runs: case count and a printed seed
/// (`SLUICE_FUZZ_SEED` replays a run).
struct Fuzz {
    cases: u32,
    seed: u64,
}

/// The runs of `target`: `cases` each (see [`cases`]), seeded from `SLUICE_FUZZ_SEED` or
/// the clock.
fn runner(target: &str, cases: u32) -> Fuzz {
    let seed = std::env::var("SLUICE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            // A fresh seed per run (printed, so a failure can be replayed).
            #[allow(clippy::disallowed_methods)]
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            t.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32)
        });
    println!("fuzz target {target}: {cases} cases per run, SLUICE_FUZZ_SEED={seed}");
    Fuzz { cases, seed }
}

/// Run `test` on `cases` values of `strategy` (a fresh runner: a runner counts its successes
/// across runs). No persistence file: the corpus is the regression store. A failure panics
/// with proptest's minimal failing input.
fn run<S: Strategy>(
    fuzz: &Fuzz,
    what: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(ProptestConfig {
        cases: fuzz.cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(fuzz.seed),
        max_shrink_iters: 2_000,
        // Filtered strategies (valid `Params`, …) reject a share of their values.
        max_local_rejects: fuzz.cases.saturating_mul(4).max(65_536),
        max_global_rejects: fuzz.cases.max(1_024),
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    });
    let started = Instant::now();
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{what}: {e}");
    }
    println!("  {what}: {} cases in {:?}", fuzz.cases, started.elapsed());
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(target)
}

/// Every file of `tests/corpus/<target>/`, sorted, as (path, bytes).
fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus {}", dir.display());
    files
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap();
            (p, b)
        })
        .collect()
}

/// Replay a corpus through `test`, naming the file that breaks a property.
fn replay(target: &str, test: impl Fn(&Path, &[u8]) -> Result<(), TestCaseError>) {
    for (path, bytes) in &corpus(target) {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test(path, bytes)));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("corpus {}: {e}", path.display()),
            Err(_) => panic!("corpus {}: panicked (message above)", path.display()),
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------------------------
// Target: the config loader.

/// Seeds up to this size are also mutated and run through the binary.
const SMALL_SEED: usize = 4096;

/// Seeds too slow to be mutated hundreds of times (they are replayed as they are).
const SLOW_SEEDS: &[&str] = &["laughs", "quadratic", "deep-nesting", "regex-huge"];

/// Properties of `load_str` on any text: never a panic, a load within 5 s (debug build);
/// errors at real `FILE:LINE:COL` positions, in file order, deterministic; a valid table
/// holds every route and limit exactly as written, and the Redis script accepts its limits.
fn config_prop(name: &str, text: &str) -> Result<(), TestCaseError> {
    config_check(name, text).map(|_| ())
}

/// [`config_prop`], saying whether the text was a valid config.
fn config_check(name: &str, text: &str) -> Result<bool, TestCaseError> {
    let result = sluice::config::load_str(name, text);
    let lines = yaml_lines(text);
    match result {
        Err(errors) => {
            prop_assert!(!errors.0.is_empty(), "Err with no errors");
            let mut prev = (0, 0);
            for e in &errors.0 {
                prop_assert_eq!(&e.file, name);
                prop_assert!(e.line >= 1 && e.col >= 1, "position {}:{}", e.line, e.col);
                // (An error at the end of a last line without a newline is on the next one.)
                prop_assert!(
                    e.line <= lines + 1,
                    "line {} past the end ({lines} lines): {e}",
                    e.line
                );
                prop_assert!(!e.message.trim().is_empty(), "empty message: {e:?}");
                let shown = e.to_string();
                let prefix = format!("{name}:{}:{}: ", e.line, e.col);
                prop_assert!(shown.starts_with(&prefix), "{shown:?}");
                // One error, one line: `FILE:LINE:COL: message` is what editors and CI parse.
                prop_assert!(
                    !shown.contains(['\n', '\r']),
                    "error spans several lines: {shown:?}"
                );
                prop_assert!(prev <= (e.line, e.col), "errors not in file order");
                prev = (e.line, e.col);
            }
            // Deterministic: the same text gives the same errors.
            if text.len() <= SMALL_SEED {
                let again = sluice::config::load_str(name, text).err();
                prop_assert_eq!(again.as_ref(), Some(&errors));
            }
        }
        Ok(sluice::config::Loaded { table, file, .. }) => {
            prop_assert_eq!(table.routes.len(), file.routes.len());
            let read = sluice::config::compile::watched_files(name, &file);
            prop_assert_eq!(&table.version, &sluice::config::version_of(text, &read));
            prop_assert_eq!(table.version.len(), 12);
            for (r, fr) in table.routes.iter().zip(&file.routes) {
                prop_assert!(!r.name.is_empty());
                prop_assert_eq!(r.limits.len(), fr.limits.len());
                for (l, fl) in r.limits.iter().zip(&fr.limits) {
                    // The limit decided is the one written: N and the window, exactly.
                    let rate = fl.rate.as_deref().unwrap_or_default();
                    let (n, w) = sluice::config::units::rate(rate).map_err(TestCaseError::fail)?;
                    prop_assert_eq!(l.params.limit, n);
                    prop_assert!(
                        u128::from(l.params.window_us) == w.as_micros(),
                        "rate `{}` decided with a window of {} µs",
                        rate,
                        l.params.window_us
                    );
                    // What the config accepts, the Redis script must accept too.
                    lua_accepts_limit(&l.params, max_cost(&l.cost))?;
                }
            }
            return Ok(true);
        }
    }
    Ok(false)
}

/// Lines as YAML counts them: `\r\n`, `\r`, `\n` (and NEL, LS, PS) each end one.
fn yaml_lines(text: &str) -> usize {
    let mut n = 1;
    let mut after_cr = false;
    for c in text.chars() {
        match c {
            '\n' if after_cr => {}
            '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}' => n += 1,
            _ => {}
        }
        after_cr = c == '\r';
    }
    n
}

fn max_cost(c: &sluice::model::limit::Cost) -> u64 {
    match c {
        sluice::model::limit::Cost::Static(n) => *n,
        sluice::model::limit::Cost::Header { max, .. } => *max,
    }
}

/// `sluice check -c FILE` on `bytes`: exit 0 and a summary, or exit 1 and only
/// `FILE:LINE:COL: ` lines on stderr; never a panic, never a hang. When the text is UTF-8,
/// the binary and `load_str` agree.
fn check_binary(dir: &Path, file_name: &str, bytes: &[u8]) -> Result<(), TestCaseError> {
    let path = dir.join(file_name);
    std::fs::write(&path, bytes).unwrap();
    let shown = path.display().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check")
        .arg("-c")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    // What the library says about the same text (while the binary runs).
    let in_process = std::str::from_utf8(bytes)
        .ok()
        .map(|t| sluice::config::load_str(&shown, t));
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TestCaseError::fail(format!("sluice check hung on {shown}")));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let out = String::from_utf8_lossy(&out.join().unwrap()).into_owned();
    let err = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    prop_assert!(
        !err.contains("panicked") && status.code() != Some(101),
        "sluice check panicked on {shown}: {err}"
    );
    let line_re =
        regex::Regex::new(&format!("^{}:[0-9]+:[0-9]+: ", regex::escape(&shown))).unwrap();
    match status.code() {
        Some(0) => {
            prop_assert!(
                out.starts_with(&format!("{shown}: OK, version ")),
                "summary of {shown}: {out}"
            );
            // Only warnings, each at its position (a route another shadows, say).
            prop_assert!(
                err.lines()
                    .all(|l| line_re.is_match(l) && l.contains(": warning: ")),
                "stderr on success: {err}"
            );
        }
        Some(1) => {
            prop_assert!(out.is_empty(), "stdout on failure: {out}");
            prop_assert!(!err.is_empty(), "exit 1 without a message");
            for l in err.lines() {
                prop_assert!(
                    line_re.is_match(l),
                    "stderr line {l:?} is not FILE:LINE:COL: …"
                );
            }
            prop_assert!(
                line_re.is_match(&err),
                "stderr does not start with FILE:LINE:COL: {err}"
            );
        }
        c => return Err(TestCaseError::fail(format!("exit {c:?} on {shown}: {err}"))),
    }
    if let Some(r) = in_process {
        match r {
            Ok(_) => prop_assert_eq!(status.code(), Some(0), "load_str Ok, check failed: {}", err),
            Err(e) => {
                prop_assert_eq!(status.code(), Some(1));
                prop_assert_eq!(err.trim_end(), e.to_string());
            }
        }
    }
    Ok(())
}

/// One YAML node of a generated config. Scalars are written plain (which may change the
/// structure: that is fuzzing too) or double-quoted.
#[derive(Clone, Debug)]
enum Y {
    Plain(String),
    Quoted(String),
    Seq(Vec<Y>, bool),
    Map(Vec<(String, Y)>, bool),
}

impl Y {
    fn is_block(&self) -> bool {
        match self {
            Y::Seq(v, flow) => !flow && !v.is_empty(),
            Y::Map(v, flow) => !flow && !v.is_empty(),
            _ => false,
        }
    }

    fn inline(&self) -> String {
        match self {
            Y::Plain(s) => s.clone(),
            Y::Quoted(s) => serde_json::to_string(s).unwrap(),
            Y::Seq(v, _) => format!(
                "[{}]",
                v.iter().map(Y::inline).collect::<Vec<_>>().join(", ")
            ),
            Y::Map(v, _) => format!(
                "{{{}}}",
                v.iter()
                    .map(|(k, v)| format!("{k}: {}", v.inline()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    fn block(&self, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match self {
            Y::Map(entries, _) => {
                for (k, v) in entries {
                    out.push_str(&pad);
                    out.push_str(k);
                    out.push(':');
                    v.value(indent, out);
                }
            }
            Y::Seq(items, _) => {
                for item in items {
                    if let (Y::Map(..), true) = (item, item.is_block()) {
                        // `- first: key` with the other keys aligned under it.
                        let mut s = String::new();
                        item.block(indent + 2, &mut s);
                        out.push_str(&pad);
                        out.push_str("- ");
                        out.push_str(&s[indent + 2..]);
                    } else {
                        out.push_str(&pad);
                        out.push('-');
                        item.value(indent, out);
                    }
                }
            }
            y => {
                out.push_str(&pad);
                out.push_str(&y.inline());
                out.push('\n');
            }
        }
    }

    fn value(&self, indent: usize, out: &mut String) {
        if self.is_block() {
            out.push('\n');
            self.block(indent + 2, out);
        } else {
            out.push(' ');
            out.push_str(&self.inline());
            out.push('\n');
        }
    }

    fn render(&self) -> String {
        let mut s = String::new();
        if self.is_block() {
            self.block(0, &mut s);
        } else {
            s.push_str(&self.inline());
            s.push('\n');
        }
        s
    }
}

const DURATIONS: &[&str] = &["5s", "250ms", "1m", "2h", "1d", "30s", "10s", "50ms"];
const BAD_DURATIONS: &[&str] = &[
    "0s",
    "0ms",
    "1.5s",
    "-1s",
    "5",
    "s",
    "",
    "5w",
    "1 s",
    "10S",
    "18446744073709551615ms",
    "18446744073709551615d",
    "99999999999999999999s",
    "213503982334601d",
];
const RATES: &[&str] = &[
    "100/s",
    "5/1m",
    "10/30s",
    "50000/1d",
    "1/7d",
    "1/1s",
    "10000000/1s",
    "10000000/7d",
    "3/2s",
    "1000/h",
];
const BAD_RATES: &[&str] = &[
    "0/0s",
    "0/s",
    "1/0s",
    "1/500ms",
    "1/8d",
    "18446744073709551615/s",
    "1/18446744073709551615d",
    "/s",
    "5/",
    "x/s",
    "1.5/s",
    "5//s",
    "5/s/s",
    "100 / s",
    " 1/1s ",
    "-1/s",
    "10001/1s",
    "+5/s",
    "5/+1s",
    "9007199254740993/7d",
    "5/18446744073769552ms",
    "5/18446744073769553s",
];
const ADDRS: &[&str] = &[
    "127.0.0.1:8080",
    "0.0.0.0:8080",
    "[::1]:9090",
    "127.0.0.1:0",
];
const BAD_ADDRS: &[&str] = &[
    "localhost:80",
    "127.0.0.1",
    "127.0.0.1:99999",
    ":80",
    "",
    "0.0.0.0:9090",
    "[::]:1",
];
const CIDRS: &[&str] = &[
    "127.0.0.1/32",
    "10.0.0.0/8",
    "::1/128",
    "::/0",
    "1.2.3.4",
    "::1",
];
const BAD_CIDRS: &[&str] = &[
    "1.2.3.4/33",
    "::1/129",
    "fe80::1%eth0",
    "x",
    "",
    "10.0.0.0/8/8",
];
const TARGETS: &[&str] = &[
    "http://127.0.0.1:3000",
    "http://127.0.0.1:3000/",
    "http://localhost",
    "http://[::1]:80",
];
const BAD_TARGETS: &[&str] = &[
    "https://x:1",
    "http://a/b",
    "http://u@h:1",
    "http://:1",
    "http://h:99999",
    "127.0.0.1:3000",
    "",
    "http://",
    "http://[::1",
    "http://h:1/?q",
];
const NAMES: &[&str] = &["api", "login", "per-ip", "a_b-1", "x", "everything-else"];
const BAD_NAMES: &[&str] = &["Bad Name", "", "é", "a\nb", "a\tb", "a:b", "A", "-\u{0}-"];
const UPSTREAMS: &[&str] = &["api", "demo"];
const HEADERS: &[&str] = &[
    "X-Api-Key",
    "X-Cost",
    "Authorization",
    "x-user-id",
    "X-Team",
];
const BAD_HEADERS: &[&str] = &["x user", "", "é", "X\nY", ":path", "X-\u{7f}"];
const PATHS: &[&str] = &[
    "/",
    "/api/",
    "/auth/login",
    "/hello",
    "/a.b/c-d_e~f",
    "/%20",
];
const BAD_PATHS: &[&str] = &[
    "/a//b", "/a/./b", "/%2e%2e/", "/a%2fb", "x", "", "/é", "/a\\b", "/%zz", "/A%41", "/..",
    "/%00", "/a/", "/a%3a",
];
const REGEXES: &[&str] = &["/api/.*", "\\d+", "/(?P<x>a)", ".*", "/v[0-9]+/.*"];
const BAD_REGEXES: &[&str] = &[
    "(",
    "[z-a]",
    "(a{1000}){1000}",
    "\\",
    "(?P<x>",
    "a{4294967296}",
];
const METHODS: &[&str] = &["GET", "post", "DELETE", "PUT", "PATCH"];
const BAD_METHODS: &[&str] = &["BREW", "G ET", "", "GET\n", "é"];
const HOSTS: &[&str] = &["api.example.com", "*.example.com", "A.B"];
const BAD_HOSTS: &[&str] = &["*.", "*", "a:80", "x/y", "", "*.*.x", "a b"];
const ALGOS: &[&str] = &[
    "fixed_window",
    "sliding_log",
    "sliding_window",
    "token_bucket",
    "leaky_bucket",
    "gcra",
];
const BAD_ALGOS: &[&str] = &["gcra2", "", "GCRA", "concurrency", "token-bucket"];
const BY: &[&str] = &["ip", "api_key", "user", "route", "header:X-Team"];
const BAD_BY: &[&str] = &[
    "header:",
    "header:bad name",
    "consumer",
    "IP",
    "",
    "header:é",
];
const ENV_VARS: &[&str] = &["PATH", "SLUICE_FUZZ_NEVER_SET", ""];
const REDIS_URLS: &[&str] = &[
    "redis://127.0.0.1:6379/0",
    "rediss://u:p@h:1",
    "redis://h",
    "http://x",
    "redis://",
    "redis://:@:99999/x",
    "redis://u:secret@h:1/99999999999",
    "redis://[::1",
];
const NODES: &[&str] = &["h:1", "h", "h:99999", ":1", "[::1]:6379", "127.0.0.1:26379"];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "4",
    "10",
    "64",
    "256",
    "257",
    "-1",
    "18446744073709551615",
    "18446744073709551616",
    "1e3",
    "1.5",
    "0x10",
    "0o7",
    ".inf",
    "-.inf",
    ".nan",
    "null",
    "~",
    "true",
    "'4'",
    "99999999999999999999999999999999999999",
];
const BOOLS: &[&str] = &["true", "false"];
const BAD_BOOLS: &[&str] = &["yes", "no", "'true'", "1", "null", "TRUE", "maybe"];
const UNKNOWN_KEYS: &[&str] = &[
    "tls", "plans", "lisen", "routes_", "<<", "? x", "limits", "by",
];

/// Mostly valid values (so the compiler, not only the parser, is reached), some invalid ones
/// from the pool, and some arbitrary strings.
fn val(good: &'static [&'static str], bad: &'static [&'static str]) -> BoxedStrategy<Y> {
    val_from(select(good).prop_map(str::to_owned).boxed(), bad)
}

/// A boolean, written plain; sometimes something else.
fn flag() -> BoxedStrategy<Y> {
    prop_oneof![
        30 => select(BOOLS).prop_map(|s| Y::Plain(s.to_owned())),
        2 => select(BAD_BOOLS).prop_map(|s| Y::Plain(s.to_owned())),
        1 => select(BOOLS).prop_map(|s| Y::Quoted(s.to_owned())),
    ]
    .boxed()
}

/// A name: usually fresh (so names rarely collide), sometimes one of the usual ones.
fn name() -> BoxedStrategy<Y> {
    let good = prop_oneof![
        3 => "[a-z][a-z0-9_-]{0,10}",
        1 => select(NAMES).prop_map(str::to_owned),
    ];
    val_from(good.boxed(), BAD_NAMES)
}

fn val_from(good: BoxedStrategy<String>, bad: &'static [&'static str]) -> BoxedStrategy<Y> {
    let s = prop_oneof![
        40 => good,
        3 => select(bad).prop_map(str::to_owned),
        1 => "\\PC{0,12}",
        1 => any::<String>(),
    ];
    (s, prop::bool::weighted(0.3), prop::bool::weighted(0.03))
        .prop_map(|(s, quote, raw)| {
            if raw || (!quote && plain_safe(&s)) {
                Y::Plain(s)
            } else {
                Y::Quoted(s)
            }
        })
        .boxed()
}

/// A string that YAML reads back as itself when written plain, in block or flow context
/// (others are quoted, except in the few raw cases that fuzz the structure itself).
fn plain_safe(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphanumeric() || matches!(b[0], b'/' | b'_'))
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || b"/._~:+-".contains(&c))
        && !s.ends_with(':')
        && !matches!(
            s,
            "true" | "false" | "yes" | "no" | "null" | "y" | "n" | "on" | "off" | "TRUE" | "FALSE"
        )
}

fn num(good: &'static [&'static str]) -> BoxedStrategy<Y> {
    prop_oneof![
        30 => select(good).prop_map(|s| Y::Plain(s.to_owned())),
        2 => select(NUMBERS).prop_map(|s| Y::Plain(s.to_owned())),
        1 => any::<u64>().prop_map(|n| Y::Plain(n.to_string())),
        1 => any::<i64>().prop_map(|n| Y::Plain(n.to_string())),
    ]
    .boxed()
}

type Field = BoxedStrategy<Option<(String, Y)>>;

fn field(key: &'static str, p: f64, v: BoxedStrategy<Y>) -> Field {
    prop::option::weighted(p, v.prop_map(move |y| (key.to_owned(), y))).boxed()
}

fn always(key: &'static str, v: BoxedStrategy<Y>) -> Field {
    v.prop_map(move |y| Some((key.to_owned(), y))).boxed()
}

/// A mapping of some of `fields`, block or flow, sometimes with a misspelled or unknown key.
fn map(fields: Vec<Field>) -> BoxedStrategy<Y> {
    (
        fields,
        prop::bool::weighted(0.25),
        prop::option::weighted(0.01, (select(UNKNOWN_KEYS), num(&["1"]))),
    )
        .prop_map(|(fs, flow, extra)| {
            let mut entries: Vec<(String, Y)> = fs.into_iter().flatten().collect();
            if let Some((k, v)) = extra {
                entries.push((k.to_owned(), v));
            }
            Y::Map(entries, flow)
        })
        .boxed()
}

fn seq(item: BoxedStrategy<Y>, len: std::ops::Range<usize>) -> BoxedStrategy<Y> {
    (prop::collection::vec(item, len), prop::bool::weighted(0.6))
        .prop_map(|(v, flow)| Y::Seq(v, flow))
        .boxed()
}

fn by() -> BoxedStrategy<Y> {
    let one = val(BY, BAD_BY);
    prop_oneof![
        6 => one.clone(),
        2 => seq(one.clone(), 0..4),
        1 => seq(seq(one, 0..3), 1..3),
        1 => num(&["1"]),
    ]
    .boxed()
}

fn cost() -> BoxedStrategy<Y> {
    prop_oneof![
        2 => num(&["1", "2", "5"]),
        3 => map(vec![
            field("header", 0.9, val(HEADERS, BAD_HEADERS)),
            field("default", 0.5, num(&["1", "2"])),
            field("max", 0.9, num(&["5", "10", "100"])),
        ]),
        1 => val(&["x"], &[""]),
    ]
    .boxed()
}

fn limit() -> BoxedStrategy<Y> {
    map(vec![
        field("name", 0.99, name()),
        field("by", 0.99, by()),
        field("algorithm", 0.99, val(ALGOS, BAD_ALGOS)),
        field("rate", 0.99, val(RATES, BAD_RATES)),
        field("burst", 0.2, num(&["1", "10", "100"])),
        field("cost", 0.25, cost()),
        field("shadow", 0.1, flag()),
        field(
            "on_missing",
            0.2,
            val(&["ip", "skip", "reject"], &["deny", ""]),
        ),
    ])
}

fn matcher() -> BoxedStrategy<Y> {
    // Exactly one of path, path_prefix, path_regex, mostly.
    let (p, pp, pr) = (0.02, 0.03, 0.01);
    let one = prop_oneof![
        3 => always("path", val(PATHS, BAD_PATHS)),
        6 => always("path_prefix", val(PATHS, BAD_PATHS)),
        1 => always("path_regex", val(REGEXES, BAD_REGEXES)),
    ]
    .boxed();
    map(vec![
        one,
        field("path", p, val(PATHS, BAD_PATHS)),
        field("path_prefix", pp, val(PATHS, BAD_PATHS)),
        field("path_regex", pr, val(REGEXES, BAD_REGEXES)),
        field("methods", 0.2, seq(val(METHODS, BAD_METHODS), 0..3)),
        field("host", 0.15, val(HOSTS, BAD_HOSTS)),
        field(
            "headers",
            0.1,
            map(vec![field("X-Env", 0.8, val(&["prod"], &["a\u{1}b", ""]))]),
        ),
    ])
}

fn route() -> BoxedStrategy<Y> {
    map(vec![
        field("name", 0.99, name()),
        field("match", 0.99, matcher()),
        field("upstream", 0.99, val(UPSTREAMS, &["missing", ""])),
        field("strip_prefix", 0.15, flag()),
        field(
            "on_store_error",
            0.1,
            val(&["allow", "deny", "local"], &["Allow", "fail"]),
        ),
        field("limits", 0.7, seq(limit(), 0..3)),
    ])
}

fn upstream() -> BoxedStrategy<Y> {
    map(vec![
        field("targets", 0.99, seq(val(TARGETS, BAD_TARGETS), 1..3)),
        field("connect_timeout", 0.3, val(DURATIONS, BAD_DURATIONS)),
        field("timeout", 0.3, val(DURATIONS, BAD_DURATIONS)),
    ])
}

fn store() -> BoxedStrategy<Y> {
    let redis = map(vec![
        field("url", 0.7, val(REDIS_URLS, &[""])),
        field(
            "mode",
            0.3,
            val(&["standalone", "cluster", "sentinel"], &["x"]),
        ),
        field("nodes", 0.3, seq(val(NODES, &[""]), 0..3)),
        field("sentinel_service", 0.2, val(&["mymaster"], &[""])),
        field("password_env", 0.2, val(ENV_VARS, &["X=Y"])),
        field("pool_size", 0.3, num(&["1", "4", "256"])),
        field("timeout", 0.3, val(DURATIONS, BAD_DURATIONS)),
        field("key_prefix", 0.3, val(&["sluice:", ""], &["{x}"])),
        field("startup_timeout", 0.2, val(DURATIONS, BAD_DURATIONS)),
    ]);
    map(vec![
        field(
            "kind",
            0.7,
            val(
                &["memory", "memory", "memory", "redis"],
                &["Memory", "etcd"],
            ),
        ),
        field("redis", 0.4, redis),
        field(
            "memory",
            0.3,
            map(vec![field("max_keys", 0.9, num(&["1", "1000"]))]),
        ),
        field(
            "on_error",
            0.4,
            val(&["allow", "deny", "local"], &["ignore"]),
        ),
    ])
}

fn identities() -> BoxedStrategy<Y> {
    let jwt = map(vec![
        field("header", 0.5, val(HEADERS, BAD_HEADERS)),
        field("secret_env", 0.9, val(ENV_VARS, &["="])),
        field("claim", 0.5, val(&["sub", "uid"], &[""])),
    ]);
    map(vec![
        field(
            "api_key",
            0.5,
            map(vec![
                field("header", 0.6, val(HEADERS, BAD_HEADERS)),
                field("query", 0.6, val(&["api_key", "key"], &["", "a&b"])),
            ]),
        ),
        field(
            "user",
            0.5,
            map(vec![
                field("header", 0.6, val(HEADERS, BAD_HEADERS)),
                field("jwt", 0.4, jwt),
            ]),
        ),
    ])
}

/// A whole config file from the real grammar, with random (mostly valid) values.
fn config_doc() -> BoxedStrategy<Y> {
    let upstreams = (
        upstream(),
        prop::option::weighted(0.9, upstream()),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(api, demo, flow)| {
            let mut v = vec![("api".to_owned(), api)];
            v.extend(demo.map(|d| ("demo".to_owned(), d)));
            Y::Map(v, flow)
        })
        .boxed();
    map(vec![
        field("listen", 0.3, val(ADDRS, BAD_ADDRS)),
        field(
            "admin_listen",
            0.2,
            val(&["127.0.0.1:9090", "[::1]:9091"], BAD_ADDRS),
        ),
        field("workers", 0.2, num(&["0", "1", "2"])),
        field("drain_timeout", 0.2, val(DURATIONS, BAD_DURATIONS)),
        field("client_header_timeout", 0.1, val(DURATIONS, BAD_DURATIONS)),
        field("send_timeout", 0.1, val(DURATIONS, BAD_DURATIONS)),
        field("store", 0.3, store()),
        field(
            "client_ip",
            0.3,
            map(vec![
                field("trusted_proxies", 0.8, seq(val(CIDRS, BAD_CIDRS), 0..3)),
                field("ipv6_prefix", 0.3, num(&["0", "48", "64", "128", "129"])),
            ]),
        ),
        field("identities", 0.3, identities()),
        field(
            "responses",
            0.1,
            map(vec![field(
                "headers",
                0.9,
                val(&["draft", "legacy", "both", "none"], &["x"]),
            )]),
        ),
        field(
            "paths",
            0.15,
            map(vec![
                field("merge_slashes", 0.6, flag()),
                field("escaped_slashes", 0.6, val(&["reject", "keep"], &["x"])),
            ]),
        ),
        field("upstreams", 0.98, upstreams),
        field("routes", 0.98, seq(route(), 0..4)),
    ])
}

/// A byte-level edit of a seed text.
#[derive(Clone, Debug)]
enum Edit {
    Truncate(usize),
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    DuplicateLine(usize),
    Indent(usize, bool),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let bytes = prop_oneof![
        select(
            &[
                ":",
                "- ",
                "&a ",
                "*a",
                "[",
                "{",
                "}",
                "]",
                "\"",
                "'",
                "#",
                "\n",
                "\t",
                "  ",
                "!!str ",
                "? ",
                "|\n",
                ">-\n",
                "\u{feff}",
                "\r\n",
                "---\n",
                "...\n",
                "%YAML 1.2\n",
                "0",
                "-1",
                "18446744073709551616",
                "\u{0}",
                "é",
            ][..]
        )
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 1..4),
    ];
    prop::collection::vec(
        prop_oneof![
            1 => any::<usize>().prop_map(Edit::Truncate),
            2 => (any::<usize>(), 1usize..12).prop_map(|(a, n)| Edit::Delete(a, n)),
            4 => (any::<usize>(), bytes).prop_map(|(a, b)| Edit::Insert(a, b)),
            1 => any::<usize>().prop_map(Edit::DuplicateLine),
            1 => (any::<usize>(), any::<bool>()).prop_map(|(a, b)| Edit::Indent(a, b)),
        ],
        1..5,
    )
}

fn apply_edits(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for e in edits {
        let at = |i: usize, b: &Vec<u8>| if b.is_empty() { 0 } else { i % (b.len() + 1) };
        match e {
            Edit::Truncate(i) => {
                let i = at(*i, &b);
                b.truncate(i);
            }
            Edit::Delete(i, n) => {
                let i = at(*i, &b);
                let j = (i + n).min(b.len());
                b.drain(i..j);
            }
            Edit::Insert(i, s) => {
                let i = at(*i, &b);
                b.splice(i..i, s.iter().copied());
            }
            Edit::DuplicateLine(i) | Edit::Indent(i, _) => {
                let starts: Vec<usize> = std::iter::once(0)
                    .chain(
                        b.iter()
                            .enumerate()
                            .filter(|(_, &c)| c == b'\n')
                            .map(|(k, _)| k + 1),
                    )
                    .filter(|&k| k < b.len())
                    .collect();
                if starts.is_empty() {
                    continue;
                }
                let s = starts[i % starts.len()];
                let end = b[s..]
                    .iter()
                    .position(|&c| c == b'\n')
                    .map_or(b.len(), |p| s + p + 1);
                match e {
                    Edit::DuplicateLine(_) => {
                        let line = b[s..end].to_vec();
                        b.splice(end..end, line);
                    }
                    Edit::Indent(_, true) => {
                        b.splice(s..s, *b"  ");
                    }
                    _ => {
                        let n = b[s..end].iter().take(2).take_while(|&&c| c == b' ').count();
                        b.drain(s..s + n);
                    }
                }
            }
        }
    }
    b
}

/// `by:` (or any Value field) holding `levels` levels of `width` aliases each: exponential.
fn alias_bomb(levels: usize, width: usize) -> String {
    let mut s = String::from(
        "upstreams: {u: {targets: [http://127.0.0.1:1]}}\nroutes:\n  - name: r\n    match: {path_prefix: /}\n    upstream: u\n    limits:\n      - name: l\n        algorithm: gcra\n        rate: 1/s\n        by: [&l0 [",
    );
    s.push_str(&vec!["ip"; width].join(", "));
    s.push(']');
    for l in 1..levels {
        s.push_str(&format!(", &l{l} ["));
        s.push_str(&vec![format!("*l{}", l - 1); width].join(", "));
        s.push(']');
    }
    s.push_str("]\n");
    s
}

#[test]
fn fuzz_config() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = corpus("config");
    let t0 = Instant::now();
    replay("config", |path, bytes| {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        config_prop(&name, &text(bytes))
    });
    println!("  corpus replayed in {:?}", t0.elapsed());
    let t0 = Instant::now();
    // The real binary on every seed: raw bytes, so non-UTF-8 files reach `check` as they are.
    for (i, (path, bytes)) in seeds.iter().enumerate() {
        // Large seeds are slow in a debug binary; the small ones cover every code path of
        // `check` (raw non-UTF-8 bytes included).
        if bytes.len() > SMALL_SEED {
            continue;
        }
        if let Err(e) = check_binary(dir.path(), &format!("seed{i}.yaml"), bytes) {
            panic!("sluice check on corpus {}: {e}", path.display());
        }
    }
    println!("  corpus through sluice check in {:?}", t0.elapsed());
    let t0 = Instant::now();
    // Exponential aliases must be refused (or bounded) fast: serde_yaml stops expanding
    // after 100 alias jumps per event of the document ("repetition limit exceeded").
    for (levels, width) in [(3, 3), (12, 9), (64, 2)] {
        let bomb = alias_bomb(levels, width);
        let r = config_prop("bomb.yaml", &bomb);
        if let Err(e) = r {
            panic!("alias bomb {levels}x{width}: {e}");
        }
    }
    println!("  alias bombs in {:?}", t0.elapsed());
    let r = runner("config", cases(400));
    // Mutation bases: the small seeds but the slow ones (bombs, deep nesting: replayed above).
    let seed_texts: Vec<Vec<u8>> = seeds
        .iter()
        .filter(|(p, b)| {
            let name = p.file_name().unwrap().to_string_lossy();
            b.len() <= SMALL_SEED && !SLOW_SEEDS.iter().any(|s| name.contains(s))
        })
        .map(|(_, b)| b.clone())
        .collect();
    let valid = std::sync::atomic::AtomicU32::new(0);
    run(&r, "generated config", config_doc(), |doc| {
        if config_check("gen.yaml", &doc.render())? {
            valid.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    });
    // The generator must reach the compiler and produce valid files, not only parse errors.
    let valid = valid.into_inner();
    println!("  generated config: {valid} valid");
    assert!(r.cases < 100 || valid > 0, "no generated config was valid");
    run(
        &r,
        "mutated corpus config",
        (select(seed_texts), edits()),
        |(seed, edits)| config_prop("mut.yaml", &text(&apply_edits(&seed, &edits))),
    );
    run(&r, "arbitrary text", any::<String>(), |s| {
        config_prop("any.yaml", &s)
    });
    run(
        &r,
        "YAML-ish text",
        "[a-z_:\\-\\[\\]{}&*!|>#'\" \n0-9/.]{0,200}",
        |s| config_prop("ish.yaml", &s),
    );

    // A few generated configs through the real binary (a process each: 1 per 200 cases of a
    // long campaign).
    let r = runner("config-binary", (cases(2_400) / 200).max(12));
    run(
        &r,
        "sluice check on a generated config",
        config_doc(),
        |doc| check_binary(dir.path(), "gen.yaml", doc.render().as_bytes()),
    );
    run(
        &r,
        "sluice check on arbitrary bytes",
        prop::collection::vec(any::<u8>(), 0..300),
        |b| check_binary(dir.path(), "bytes.yaml", &b),
    );
}

// ---------------------------------------------------------------------------------------------
// Target: the path normalizer.

const ALL_RULES: [PathRules; 4] = [
    PathRules {
        merge_slashes: true,
        escaped_slashes: EscapedSlashes::Reject,
    },
    PathRules {
        merge_slashes: false,
        escaped_slashes: EscapedSlashes::Reject,
    },
    PathRules {
        merge_slashes: true,
        escaped_slashes: EscapedSlashes::Keep,
    },
    PathRules {
        merge_slashes: false,
        escaped_slashes: EscapedSlashes::Keep,
    },
];

fn unreserved(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
}

fn is_hex_upper(c: u8) -> bool {
    c.is_ascii_digit() || (b'A'..=b'F').contains(&c)
}

/// What a normalized path looks like (SPEC §7).
fn assert_normal(out: &str, rules: &PathRules) -> Result<(), TestCaseError> {
    let b = out.as_bytes();
    prop_assert!(out.starts_with('/'), "not absolute: {out:?}");
    for seg in out[1..].split('/') {
        prop_assert!(seg != "." && seg != "..", "dot segment left in {out:?}");
    }
    if rules.merge_slashes {
        prop_assert!(!out.contains("//"), "`//` left in {out:?}");
    }
    prop_assert!(!out.contains('\\'), "backslash in {out:?}");
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            prop_assert!(
                i + 2 < b.len() && is_hex_upper(b[i + 1]) && is_hex_upper(b[i + 2]),
                "escape at {i} not upper-case hex in {out:?}"
            );
            let v = u8::from_str_radix(&out[i + 1..i + 3], 16).unwrap();
            prop_assert!(v != 0, "%00 in {out:?}");
            prop_assert!(!unreserved(v), "undecoded unreserved %{v:02X} in {out:?}");
            if rules.escaped_slashes == EscapedSlashes::Reject {
                prop_assert!(
                    v != b'/' && v != b'\\',
                    "%2F/%5C kept under reject: {out:?}"
                );
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    Ok(())
}

fn has_escape(raw: &str, hexes: &[&str]) -> bool {
    let b = raw.as_bytes();
    (0..b.len()).any(|i| {
        b[i] == b'%'
            && b.get(i + 1..i + 3)
                .is_some_and(|h| hexes.iter().any(|x| x.as_bytes().eq_ignore_ascii_case(h)))
    })
}

fn path_prop(raw: &str) -> Result<(), TestCaseError> {
    for rules in &ALL_RULES {
        match normalize(raw, rules) {
            Ok(out) => {
                assert_normal(&out, rules)?;
                prop_assert!(out.bytes().all(|b| b.is_ascii_graphic()), "{out:?}");
                let again = normalize(&out, rules);
                prop_assert_eq!(
                    again.as_deref(),
                    Ok(&*out),
                    "not idempotent under {:?}: {:?} -> {:?}",
                    rules,
                    raw,
                    out
                );
                prop_assert!(raw.starts_with('/'));
            }
            // Each refusal has its cause in the input.
            Err(e) => match e {
                PathError::NotAbsolute => prop_assert!(!raw.starts_with('/')),
                PathError::Backslash => prop_assert!(raw.contains('\\')),
                PathError::Nul => prop_assert!(has_escape(raw, &["00"])),
                PathError::EncodedSlash => {
                    prop_assert_eq!(rules.escaped_slashes, EscapedSlashes::Reject);
                    prop_assert!(has_escape(raw, &["2f", "5c"]));
                }
                PathError::BadEscape => prop_assert!(raw.contains('%')),
                PathError::AboveRoot => {
                    prop_assert!(raw.contains('.') || has_escape(raw, &["2e"]))
                }
                PathError::RawByte => prop_assert!(raw.bytes().any(|b| !b.is_ascii_graphic())),
            },
        }
    }
    // `keep` only differs from `reject` on %2F / %5C.
    if !has_escape(raw, &["2f", "5c"]) {
        for merge in [true, false] {
            let r = |e| {
                normalize(
                    raw,
                    &PathRules {
                        merge_slashes: merge,
                        escaped_slashes: e,
                    },
                )
            };
            prop_assert_eq!(r(EscapedSlashes::Reject), r(EscapedSlashes::Keep));
        }
    }
    Ok(())
}

/// A normal path, and one way of spelling it that every upstream reads as that path.
#[derive(Clone, Debug)]
struct Spelling {
    segments: Vec<String>,
    trailing_dot: bool,
    noise: Vec<(u8, Vec<bool>, bool)>,
}

fn spelling() -> impl Strategy<Value = Spelling> {
    let seg = "[a-z0-9._~-]{1,6}".prop_filter("not a dot segment", |s| s != "." && s != "..");
    (
        prop::collection::vec(seg, 0..5),
        any::<bool>(),
        prop::collection::vec(
            (
                0u8..6,
                prop::collection::vec(any::<bool>(), 8),
                any::<bool>(),
            ),
            5,
        ),
    )
        .prop_map(|(segments, trailing_dot, noise)| Spelling {
            segments,
            trailing_dot,
            noise,
        })
}

impl Spelling {
    fn canonical(&self) -> String {
        let mut s = String::new();
        for seg in &self.segments {
            s.push('/');
            s.push_str(seg);
        }
        if s.is_empty() || self.trailing_dot {
            s.push('/');
        }
        s
    }

    /// `%xx` with either hex case.
    fn escape(c: u8, upper: bool) -> String {
        if upper {
            format!("%{c:02X}")
        } else {
            format!("%{c:02x}")
        }
    }

    fn spelled(&self) -> String {
        let mut s = String::new();
        for (i, seg) in self.segments.iter().enumerate() {
            let (kind, esc, upper) = &self.noise[i % self.noise.len()];
            // Noise before the segment: a no-op that a naive matcher would not see through.
            match kind {
                1 => s.push_str("/."),
                2 => s.push_str("/zz/.."),
                3 => s.push_str("/%2e"),
                4 => s.push_str("/zz/%2E%2e"),
                5 => s.push('/'),
                _ => {}
            }
            s.push('/');
            for (j, c) in seg.bytes().enumerate() {
                if esc[j % esc.len()] {
                    s.push_str(&Self::escape(c, *upper));
                } else {
                    s.push(c as char);
                }
            }
        }
        if self.trailing_dot {
            s.push_str("/.");
        }
        if s.is_empty() {
            s.push('/');
        }
        s
    }
}

const PATH_TOKENS: &[&str] = &[
    "/", "/", "/", ".", ".", "%", "2e", "2E", "2f", "2F", "5c", "5C", "00", "a", "~", "\\", "%2e",
    "%2E", "%2f", "%5c", "%00", "..", "%41", "%7e", "%25", "%zz", "%3a", "é", "?", "-", "_", "g",
];

#[test]
fn fuzz_path() {
    replay("path", |_, bytes| path_prop(&text(bytes)));
    let r = runner("path", cases(2_000));
    run(
        &r,
        "path from the dangerous alphabet",
        (
            prop::bool::weighted(0.9),
            prop::collection::vec(select(PATH_TOKENS), 0..24),
        ),
        |(slash, toks)| {
            let p = format!("{}{}", if slash { "/" } else { "" }, toks.concat());
            path_prop(&p)
        },
    );
    run(&r, "arbitrary path", "/?\\PC{0,40}", |p| path_prop(&p));
    run(&r, "arbitrary string", any::<String>(), |p| path_prop(&p));
    run(&r, "spellings of one path", spelling(), |sp| {
        let raw = sp.spelled();
        let want = sp.canonical();
        for rules in &ALL_RULES {
            if !rules.merge_slashes && raw.contains("//") {
                continue;
            }
            let got = normalize(&raw, rules);
            prop_assert_eq!(
                got.as_deref(),
                Ok(want.as_str()),
                "{:?} under {:?}",
                raw,
                rules
            );
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Target: X-Forwarded-For and Forwarded.

fn ip_rules() -> ClientIpRules {
    ClientIpRules {
        trusted: ["10.0.0.0/8", "127.0.0.1/32", "::1/128", "fd00::/8"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect(),
        ipv6_prefix: 64,
    }
}

const TRUSTED_IPS: &[&str] = &[
    "127.0.0.1",
    "10.1.2.3",
    "::1",
    "::ffff:127.0.0.1",
    "fd00::5",
];
const UNTRUSTED_IPS: &[&str] = &["8.8.8.8", "2001:db8::1", "::ffff:8.8.4.4", "1.2.3.4"];

/// Every address that some run of address characters in `values` spells, canonical (with
/// `:port` and `[...]` forms).
fn addresses_in(values: &[&[u8]]) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for v in values {
        let s = String::from_utf8_lossy(v);
        for tok in s.split(|c: char| !(c.is_ascii_hexdigit() || c == ':' || c == '.')) {
            let mut cands = vec![tok];
            if let Some((a, _)) = tok.rsplit_once(':') {
                cands.push(a);
            }
            for c in cands {
                if let Ok(ip) = c.parse::<IpAddr>() {
                    found.push(ip.to_canonical());
                }
            }
        }
    }
    found
}

fn client_ip_prop(
    peer: IpAddr,
    headers: &[(HeaderName, HeaderValue)],
) -> Result<(), TestCaseError> {
    let rules = ip_rules();
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(k.clone(), v.clone());
    }
    let got = rules.client_ip(peer, &map);
    let peer = peer.to_canonical();
    if !rules.is_trusted(peer) {
        prop_assert_eq!(got, peer, "an untrusted peer's headers were believed");
        return Ok(());
    }
    if got != peer {
        let values: Vec<&[u8]> = headers
            .iter()
            .filter(|(k, _)| k == "x-forwarded-for" || k == "forwarded")
            .map(|(_, v)| v.as_bytes())
            .collect();
        prop_assert!(
            addresses_in(&values).contains(&got),
            "{got} is neither the peer nor in the headers"
        );
    }
    Ok(())
}

/// One hop of a generated header: a real address in some spelling, or something that is not
/// an address (which stops the walk).
#[derive(Clone, Debug)]
enum Hop {
    Ip(IpAddr, u8),
    Junk(&'static str),
}

const JUNK_HOPS: &[&str] = &[
    "unknown",
    "_hidden",
    "",
    "1.2.3",
    "1.2.3.4.5",
    "300.1.1.1",
    "nonsense",
    "[::1",
    "fe80::1%eth0",
    "1.2.3.4:99999",
    "01.2.3.4",
    "::ffff:",
    "1.2.3.4/32",
    "\"\"",
    "[1.2.3.4]:",
];

impl Hop {
    fn ip(&self) -> Option<IpAddr> {
        match self {
            Hop::Ip(ip, _) => Some(ip.to_canonical()),
            Hop::Junk(_) => None,
        }
    }

    fn render(&self) -> String {
        match self {
            Hop::Junk(s) => (*s).to_owned(),
            Hop::Ip(ip, style) => match (ip, style % 6) {
                (_, 0) => ip.to_string(),
                (IpAddr::V4(v4), 1) => format!("{v4}:{}", 1000 + u16::from(*style)),
                (IpAddr::V6(v6), 1) => format!("[{v6}]:{}", 1000 + u16::from(*style)),
                (_, 2) => format!("\"{ip}\""),
                (IpAddr::V6(v6), 3) => format!("[{v6}]"),
                (IpAddr::V4(v4), 3) => v4.to_ipv6_mapped().to_string(),
                (IpAddr::V6(v6), 4) => {
                    // Uncompressed and upper case: the same address.
                    let s = v6.segments();
                    s.iter()
                        .map(|x| format!("{x:X}"))
                        .collect::<Vec<_>>()
                        .join(":")
                }
                (IpAddr::V4(v4), 4) => format!("\"{v4}:80\""),
                _ => format!(" {ip} "),
            },
        }
    }
}

fn hop() -> impl Strategy<Value = Hop> {
    let ip = prop_oneof![
        select(TRUSTED_IPS).prop_map(|s| s.parse::<IpAddr>().unwrap()),
        select(UNTRUSTED_IPS).prop_map(|s| s.parse::<IpAddr>().unwrap()),
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u8; 16]>().prop_map(IpAddr::from),
    ];
    prop_oneof![
        6 => (ip, any::<u8>()).prop_map(|(ip, s)| Hop::Ip(ip, s)),
        1 => select(JUNK_HOPS).prop_map(Hop::Junk),
    ]
}

/// Forwarded element: `for=` with other parameters around, or no `for` at all (skipped).
#[derive(Clone, Debug)]
struct Element {
    hop: Option<Hop>,
    style: u8,
}

impl Element {
    fn render(&self) -> String {
        let key = ["for", "For", "FOR", " for "][usize::from(self.style % 4)];
        let mut parts = Vec::new();
        if self.style & 4 != 0 {
            parts.push("proto=http".to_owned());
        }
        if let Some(h) = &self.hop {
            parts.push(format!("{key}={}", h.render()));
        }
        if self.style & 8 != 0 {
            parts.push("by=203.0.113.43".to_owned());
        }
        if parts.is_empty() {
            parts.push("host=example.com".to_owned());
        }
        parts.join(";")
    }
}

#[derive(Clone, Debug)]
struct Forwarding {
    peer: IpAddr,
    xff: Vec<Vec<Hop>>,
    forwarded: Vec<Vec<Element>>,
    sep: u8,
}

fn forwarding() -> impl Strategy<Value = Forwarding> {
    let element = (prop::option::weighted(0.9, hop()), any::<u8>())
        .prop_map(|(hop, style)| Element { hop, style });
    (
        prop_oneof![
            3 => select(TRUSTED_IPS),
            1 => select(UNTRUSTED_IPS),
        ]
        .prop_map(|s| s.parse::<IpAddr>().unwrap()),
        prop::collection::vec(prop::collection::vec(hop(), 1..5), 0..3),
        prop::collection::vec(prop::collection::vec(element, 1..4), 0..3),
        any::<u8>(),
    )
        .prop_map(|(peer, xff, forwarded, sep)| Forwarding {
            peer,
            xff,
            forwarded,
            sep,
        })
}

impl Forwarding {
    fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let sep = [", ", ",", " , "][usize::from(self.sep % 3)];
        let mut h = Vec::new();
        for line in &self.xff {
            let v = line.iter().map(Hop::render).collect::<Vec<_>>().join(sep);
            h.push((
                HeaderName::from_static("x-forwarded-for"),
                HeaderValue::from_str(&v).unwrap(),
            ));
        }
        for line in &self.forwarded {
            let v = line
                .iter()
                .map(Element::render)
                .collect::<Vec<_>>()
                .join(sep);
            h.push((
                HeaderName::from_static("forwarded"),
                HeaderValue::from_str(&v).unwrap(),
            ));
        }
        // Lines of different names in either order (each name's own lines keep theirs).
        if self.sep & 8 != 0 {
            h.sort_by_key(|(k, _)| k != "forwarded");
        }
        h
    }

    /// SPEC §3: the peer, or — from a trusted peer — the rightmost hop that is not trusted
    /// (X-Forwarded-For, else Forwarded `for=`); a hop that is not an address stops the walk
    /// at the last believed one.
    fn expected(&self, rules: &ClientIpRules) -> IpAddr {
        let peer = self.peer.to_canonical();
        if !rules.is_trusted(peer) {
            return peer;
        }
        let hops: Vec<Option<IpAddr>> = if !self.xff.is_empty() {
            self.xff.iter().flatten().map(Hop::ip).collect()
        } else {
            self.forwarded
                .iter()
                .flatten()
                .filter_map(|e| e.hop.as_ref().map(Hop::ip))
                .collect()
        };
        let mut client = peer;
        for h in hops.into_iter().rev() {
            match h {
                Some(ip) => {
                    client = ip;
                    if !rules.is_trusted(ip) {
                        break;
                    }
                }
                None => break,
            }
        }
        client
    }
}

/// A header line from the corpus: `name: value` (value bytes as they are).
fn header_line(line: &[u8]) -> Option<(HeaderName, HeaderValue)> {
    let i = line.iter().position(|&c| c == b':')?;
    let name = HeaderName::from_bytes(line[..i].trim_ascii()).ok()?;
    let value = HeaderValue::from_bytes(line[i + 1..].trim_ascii()).ok()?;
    Some((name, value))
}

fn header_value_bytes() -> impl Strategy<Value = Vec<u8>> {
    let tok = prop_oneof![
        select(
            &[
                ",",
                ";",
                "=",
                "\"",
                "[",
                "]",
                ":",
                " ",
                "for",
                "1.2.3.4",
                "::1",
                "127.0.0.1",
                "10.0.0.9",
                "::ffff:",
                "2001:db8::",
                "unknown",
                "%",
                "80",
                "\t",
                "8.8.8.8",
            ][..]
        )
        .prop_map(|s| s.as_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 1..3),
    ];
    prop::collection::vec(tok, 0..16).prop_map(|v| v.concat())
}

#[test]
fn fuzz_client_ip() {
    let peers: Vec<IpAddr> = TRUSTED_IPS
        .iter()
        .chain(UNTRUSTED_IPS)
        .map(|s| s.parse().unwrap())
        .collect();
    replay("client_ip", |_, bytes| {
        let headers: Vec<_> = bytes
            .split(|&c| c == b'\n')
            .filter_map(header_line)
            .collect();
        for &peer in &peers {
            client_ip_prop(peer, &headers)?;
        }
        Ok(())
    });
    let r = runner("client_ip", cases(1_000));
    run(&r, "structured forwarding headers", forwarding(), |f| {
        let h = f.headers();
        client_ip_prop(f.peer, &h)?;
        let mut map = HeaderMap::new();
        for (k, v) in &h {
            map.append(k.clone(), v.clone());
        }
        let rules = ip_rules();
        prop_assert_eq!(rules.client_ip(f.peer, &map), f.expected(&rules), "{:?}", h);
        Ok(())
    });
    run(
        &r,
        "arbitrary header bytes",
        (
            select(peers.clone()),
            prop::collection::vec(
                (
                    select(&["x-forwarded-for", "forwarded", "x-real-ip"][..]),
                    header_value_bytes(),
                ),
                0..4,
            ),
        ),
        |(peer, lines)| {
            let headers: Vec<_> = lines
                .iter()
                .filter_map(|(k, v)| {
                    Some((HeaderName::from_static(k), HeaderValue::from_bytes(v).ok()?))
                })
                .collect();
            client_ip_prop(peer, &headers)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Target: JWT users.

const SECRET: &[u8] = b"fuzz-secret";

fn jwt_sources(secret: &[u8]) -> IdentitySources {
    IdentitySources {
        api_key_header: None,
        api_key_query: None,
        user_header: Some(HeaderName::from_static("x-user-id")),
        jwt: Some(JwtSource {
            header: HeaderName::from_static("authorization"),
            secret: secret.to_vec(),
            claim: "sub".into(),
        }),
    }
}

fn user_of(secret: &[u8], value: &HeaderValue, now: u64) -> Option<String> {
    let mut h = HeaderMap::new();
    h.insert("authorization", value.clone());
    // The plain header is never believed when JWT is configured.
    h.insert("x-user-id", HeaderValue::from_static("mallory"));
    // One `Authorization` field: never ambiguous.
    let user = jwt_sources(secret).user(&h, now).expect("one field");
    user.map(|u| u.into_owned())
}

const NOW: u64 = 1_700_000_000;

/// Any value: never a panic; a user only through a `Bearer` token signed with the secret.
fn jwt_prop(value: &HeaderValue) -> Result<(), TestCaseError> {
    prop_assert_eq!(user_of(b"another-secret", value, NOW), None);
    prop_assert_eq!(user_of(b"", value, NOW), None);
    if let Some(u) = user_of(SECRET, value, NOW) {
        prop_assert!(!u.is_empty());
        let s = value.to_str().unwrap().trim();
        prop_assert!(bearer_token(s).is_some());
        prop_assert!(s[..7].eq_ignore_ascii_case("bearer "), "{s}");
        let bare = HeaderValue::from_str(bearer_token(s).unwrap()).unwrap();
        prop_assert_eq!(
            user_of(SECRET, &bare, NOW),
            None,
            "a bare token authenticated"
        );
    }
    Ok(())
}

#[derive(Clone, Debug)]
struct Token {
    alg: &'static str,
    sub: serde_json::Value,
    exp: Option<serde_json::Value>,
    secret: &'static [u8],
    scheme: &'static str,
    extra_segment: bool,
    pad: bool,
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

impl Token {
    fn encoded(&self) -> String {
        let head = b64(format!(r#"{{"alg":"{}","typ":"JWT"}}"#, self.alg).as_bytes());
        let mut claims = serde_json::Map::new();
        claims.insert("sub".into(), self.sub.clone());
        if let Some(e) = &self.exp {
            claims.insert("exp".into(), e.clone());
        }
        let body = b64(serde_json::Value::Object(claims).to_string().as_bytes());
        let mut mac = Hmac::<Sha256>::new_from_slice(self.secret).unwrap();
        mac.update(format!("{head}.{body}").as_bytes());
        let mut sig = b64(&mac.finalize().into_bytes());
        if self.pad {
            sig.push('=');
        }
        let mut t = format!("{head}.{body}.{sig}");
        if self.extra_segment {
            t.push_str(".x");
        }
        t
    }

    fn value(&self) -> String {
        format!("{}{}", self.scheme, self.encoded())
    }

    /// SPEC §3: HS256 with the verifier's secret, `Bearer` (any case), `exp` in the future if
    /// present, a non-empty string or a number as the claim.
    fn expected(&self, verifier: &[u8]) -> Option<String> {
        let scheme_ok = matches!(
            self.scheme.to_ascii_lowercase().as_str(),
            "bearer " | "bearer   "
        );
        let exp_ok = self
            .exp
            .as_ref()
            .is_none_or(|e| e.as_u64().is_some_and(|e| e > NOW));
        let user = match &self.sub {
            serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        (scheme_ok
            && self.alg == "HS256"
            && self.secret == verifier
            && exp_ok
            && !self.extra_segment
            && !self.pad)
            .then_some(user)
            .flatten()
    }
}

fn token() -> impl Strategy<Value = Token> {
    let sub = prop_oneof![
        4 => "[a-z0-9@.]{1,10}".prop_map(serde_json::Value::from),
        1 => Just(serde_json::Value::from("")),
        1 => any::<i64>().prop_map(serde_json::Value::from),
        1 => Just(serde_json::Value::Null),
        1 => Just(serde_json::json!({"id": 1})),
        1 => Just(serde_json::json!(1.5)),
    ];
    let exp = prop::option::weighted(
        0.7,
        prop_oneof![
            4 => (NOW - 10..NOW + 10).prop_map(serde_json::Value::from),
            1 => any::<u64>().prop_map(serde_json::Value::from),
            1 => any::<i64>().prop_map(serde_json::Value::from),
            1 => Just(serde_json::json!(2e9)),
            1 => Just(serde_json::json!("2000000000")),
            1 => Just(serde_json::Value::Null),
        ],
    );
    (
        prop_oneof![8 => Just("HS256"), 1 => Just("none"), 1 => Just("hs256"), 1 => Just("HS512")],
        sub,
        exp,
        prop_oneof![6 => Just(SECRET), 1 => Just(&b"other"[..]), 1 => Just(&b""[..])],
        select(
            &[
                "Bearer ",
                "Bearer ",
                "bearer ",
                "BEARER ",
                "Bearer   ",
                "",
                "Basic ",
                "Token ",
                "Bearer\t",
                "Bearer",
                "Bearer x ",
                "Bearer: ",
            ][..],
        ),
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.05),
    )
        .prop_map(
            |(alg, sub, exp, secret, scheme, extra_segment, pad)| Token {
                alg,
                sub,
                exp,
                secret,
                scheme,
                extra_segment,
                pad,
            },
        )
}

const B64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

#[test]
fn fuzz_jwt() {
    replay("jwt", |_, bytes| {
        match HeaderValue::from_bytes(bytes.trim_ascii()) {
            Ok(v) => jwt_prop(&v),
            Err(_) => Ok(()),
        }
    });
    let r = runner("jwt", cases(600));
    run(&r, "structured tokens", token(), |t| {
        let v = HeaderValue::from_str(&t.value()).unwrap();
        for verifier in [SECRET, b"other", b""] {
            prop_assert_eq!(
                user_of(verifier, &v, NOW),
                t.expected(verifier),
                "{}",
                t.value()
            );
        }
        // The same token without its scheme never authenticates.
        let bare = HeaderValue::from_str(&t.encoded()).unwrap();
        prop_assert_eq!(user_of(SECRET, &bare, NOW), None);
        Ok(())
    });
    run(
        &r,
        "one character of a valid token changed",
        (any::<prop::sample::Index>(), any::<prop::sample::Index>()),
        |(at, with)| {
            let t = Token {
                alg: "HS256",
                sub: "alice".into(),
                exp: Some((NOW + 60).into()),
                secret: SECRET,
                scheme: "Bearer ",
                extra_segment: false,
                pad: false,
            };
            let mut enc = t.encoded().into_bytes();
            // Any character but a separator, replaced by another base64url character.
            let places: Vec<usize> = (0..enc.len()).filter(|&i| enc[i] != b'.').collect();
            let i = places[at.index(places.len())];
            let others: Vec<u8> = B64URL.iter().copied().filter(|&c| c != enc[i]).collect();
            enc[i] = others[with.index(others.len())];
            let v = HeaderValue::from_str(&format!("Bearer {}", String::from_utf8(enc).unwrap()))
                .unwrap();
            prop_assert_eq!(
                user_of(SECRET, &v, NOW),
                None,
                "a modified token authenticated"
            );
            Ok(())
        },
    );
    run(
        &r,
        "arbitrary Authorization bytes",
        prop::collection::vec(any::<u8>(), 0..80),
        |b| match HeaderValue::from_bytes(&b) {
            Ok(v) => jwt_prop(&v),
            Err(_) => Ok(()),
        },
    );
    run(
        &r,
        "Bearer and three base64url-ish segments",
        "(Bearer|bearer) [A-Za-z0-9_=+/-]{0,40}\\.[A-Za-z0-9_=+/-]{0,40}\\.[A-Za-z0-9_=+/.-]{0,44}",
        |s| jwt_prop(&HeaderValue::from_str(&s).unwrap()),
    );
}

// ---------------------------------------------------------------------------------------------
// Target: the API key in the query string.

fn key_sources(header: bool) -> IdentitySources {
    IdentitySources {
        api_key_header: header.then(|| HeaderName::from_static("x-api-key")),
        api_key_query: Some("api_key".into()),
        user_header: None,
        jwt: None,
    }
}

fn api_key_prop(query: &str, header: Option<&HeaderValue>) -> Result<(), TestCaseError> {
    let mut h = HeaderMap::new();
    if let Some(v) = header {
        h.insert("x-api-key", v.clone());
    }
    // A query that may name the parameter (spelled out, as PHP reads names, or escaped).
    let may_name = query.contains("api") || query.contains('%') || query.contains('+');
    for with_header in [false, true] {
        let got = key_sources(with_header).api_key(&h, Some(query));
        let from_header = header
            .filter(|_| with_header)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty());
        match (&got, from_header) {
            (Ok(Some(k)), _) if k.is_empty() => {
                prop_assert!(false, "empty API key from {query:?}")
            }
            // Held to a header value's rules: trimmed, visible ASCII (no control byte can
            // spell another namespace's key).
            (Ok(Some(k)), _)
                if k.trim() != k || !k.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) =>
            {
                prop_assert!(false, "API key {k:?} from {query:?}")
            }
            // The header's key, or an error: the query disagrees or repeats the parameter.
            (Ok(got), Some(hv)) => prop_assert_eq!(got.as_deref(), Some(hv)),
            (Ok(Some(_)), None) | (Err(_), _) => prop_assert!(may_name, "{got:?} from {query:?}"),
            (Ok(None), None) => {}
        }
    }
    prop_assert_eq!(key_sources(false).api_key(&h, None), Ok(None));
    Ok(())
}

/// `application/x-www-form-urlencoded`, escaping more than needed at random.
fn form_encode(s: &str, all: &[bool]) -> String {
    let mut out = String::new();
    for (i, b) in s.bytes().enumerate() {
        let force = all.get(i % all.len().max(1)).copied().unwrap_or(false);
        match b {
            b' ' if !force => out.push('+'),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' if !force => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[test]
fn fuzz_api_key() {
    replay("api_key", |_, bytes| api_key_prop(&text(bytes), None));
    let r = runner("api_key", cases(1_000));
    run(&r, "arbitrary query", any::<String>(), |q| {
        api_key_prop(&q, None)
    });
    run(
        &r,
        "query from & = % + api_key",
        prop::collection::vec(
            select(
                &[
                    "&",
                    "=",
                    "%",
                    "+",
                    "api_key",
                    "api%5Fkey",
                    "a",
                    "%2",
                    "%zz",
                    "%00",
                    "%ff",
                    "é",
                    ";",
                    ".",
                    "[",
                    "api.key",
                    "%20",
                ][..],
            ),
            0..16,
        ),
        |toks| api_key_prop(&toks.concat(), None),
    );
    run(
        &r,
        "header then query",
        (any::<String>(), "[ -~]{0,12}"),
        |(q, hv)| api_key_prop(&q, Some(&HeaderValue::from_str(&hv).unwrap())),
    );
    // Round trip: a key written into the query is read back as a header value would be
    // (trimmed; none if it is not visible ASCII).
    run(
        &r,
        "encoded key round trip",
        (
            prop_oneof![any::<String>(), "[ -~\t]{1,12}"]
                .prop_filter("non-empty", |s| !s.is_empty()),
            prop::collection::vec(any::<bool>(), 1..6),
            prop::collection::vec("[a-z_]{0,6}=[a-z0-9%+]{0,6}", 0..3),
            "[a-z&=]{0,10}",
        ),
        |(key, esc, before, after)| {
            prop_assume!(!before.iter().any(|p| p.starts_with("api_key=")));
            let mut parts = before.clone();
            parts.push(format!("api_key={}", form_encode(&key, &esc)));
            let q = format!("{}&{after}", parts.join("&"));
            api_key_prop(&q, None)?;
            let none = HeaderMap::new();
            let got = key_sources(false).api_key(&none, Some(&q));
            let trimmed = key.trim_matches([' ', '\t']);
            let visible = |b: u8| b == b'\t' || (0x20..0x7f).contains(&b);
            let want = (!trimmed.is_empty() && trimmed.bytes().all(visible))
                .then(|| trimmed.to_owned().into());
            prop_assert_eq!(got, Ok(want), "{}", q);
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Target: the cost header (through the limit stage: `limit::plan`, then one decision).

struct CostRig {
    table: sluice::model::table::Table,
    n: u64,
    default: u64,
    max: u64,
}

fn cost_rig(n: u64, max: u64, default: u64) -> CostRig {
    let yaml = format!(
        "upstreams: {{u: {{targets: [http://127.0.0.1:1]}}}}\nroutes:\n  - name: r\n    match: {{path_prefix: /}}\n    upstream: u\n    limits:\n      - name: l\n        by: route\n        algorithm: fixed_window\n        rate: {n}/1m\n        cost: {{header: X-Cost, default: {default}, max: {max}}}\n"
    );
    let table = sluice::config::load_str("cost.yaml", &yaml).unwrap().table;
    CostRig {
        table,
        n,
        default,
        max,
    }
}

/// The cost the limit stage charged for `values` of X-Cost (first one counts), or BadCost.
fn charged(
    rig: &CostRig,
    rt: &tokio::runtime::Runtime,
    values: &[HeaderValue],
) -> Result<u64, GatewayError> {
    let mut headers = HeaderMap::new();
    for v in values {
        headers.append("x-cost", v.clone());
    }
    let t = &rig.table;
    let route = &t.routes[0];
    let mut who = Identity::new(
        [8, 8, 8, 8].into(),
        true,
        &headers,
        None,
        &t.client_ip,
        &t.identities,
    );
    let plan = sluice::pipeline::admit::plan(route, &mut who, &headers, &t.consumers, &mut None)?;
    let (clock, _) = Clock::manual(1 << 40);
    // 64 shards of 64 keys: at 64 keys in all, two of a request's keys in one shard would
    // evict each other.
    let store = Arc::new(MemoryStore::new(64 * 64, clock.clone()));
    let local = MemoryStore::new(64 * 64, clock);
    let store = Store::Memory(store);
    let stores = sluice::pipeline::admit::Stores {
        store: &store,
        local: &local,
        deny: None,
    };
    let (adm, verdict) = rt.block_on(sluice::pipeline::admit::decide(
        route,
        &sluice::pipeline::respond::Refusal::all(route),
        plan,
        stores,
    ));
    assert!(
        matches!(verdict, sluice::pipeline::admit::Verdict::Pass(_)),
        "{verdict:?}"
    );
    let (_, d) = adm.headline.expect("one limit decided");
    assert_eq!(d.code, Code::Allowed);
    assert_eq!(d.limit, rig.n);
    // A fresh fixed window of N admits cost c ≤ N and leaves N − c.
    Ok(rig.n - d.remaining)
}

fn cost_prop(
    rig: &CostRig,
    rt: &tokio::runtime::Runtime,
    values: &[HeaderValue],
) -> Result<(), TestCaseError> {
    let got = charged(rig, rt, values);
    // Two lines: the gateway would charge one while the upstream may act on the other.
    if values.len() > 1 {
        prop_assert!(
            matches!(got, Err(GatewayError::AmbiguousIdentity(_))),
            "{got:?}"
        );
        return Ok(());
    }
    // The number the one value spells, if it is one (HTTP whitespace around it allowed).
    let spelled = values.first().map(|v| {
        v.to_str()
            .ok()
            .map(|s| s.trim_matches([' ', '\t']))
            .and_then(|s| s.parse::<u64>().ok())
    });
    match got {
        Ok(c) => {
            prop_assert!((1..=rig.max).contains(&c), "charged {c}, max {}", rig.max);
            match spelled {
                None => prop_assert_eq!(c, rig.default, "absent header: the default"),
                Some(n) => prop_assert_eq!(Some(c), n, "charged another cost than asked"),
            }
        }
        Err(GatewayError::BadCost { header, max }) => {
            prop_assert_eq!(header, "x-cost");
            prop_assert_eq!(max, rig.max);
            match spelled {
                None => prop_assert!(false, "absent header refused"),
                Some(n) => prop_assert!(
                    n.is_none_or(|n| !(1..=rig.max).contains(&n)),
                    "cost {n:?} refused"
                ),
            }
        }
        Err(e) => prop_assert!(false, "unexpected {e}"),
    }
    Ok(())
}

#[test]
fn fuzz_cost_header() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let rigs = [cost_rig(10, 10, 1), cost_rig(100, 7, 3), cost_rig(1, 1, 1)];
    replay("cost", |_, bytes| {
        for rig in &rigs {
            let values: Vec<HeaderValue> = bytes
                .split(|&c| c == b'\n')
                .filter_map(|l| HeaderValue::from_bytes(l).ok())
                .collect();
            cost_prop(rig, &rt, &values)?;
        }
        Ok(())
    });
    let r = runner("cost", cases(1_000));
    let value = prop_oneof![
        3 => "[ \t]{0,2}\\+?[0-9]{1,4}[ \t]{0,2}".prop_map(|s| s.into_bytes()),
        1 => any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        1 => "[0-9]{19,30}".prop_map(|s| s.into_bytes()),
        1 => select(&["", "-1", "0", "1.0", "1e2", "0x5", "５", "NaN", " ", "1 2", "\u{a0}3"][..])
            .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..8),
    ];
    run(
        &r,
        "X-Cost values",
        (0usize..3, prop::collection::vec(value, 0..3)),
        |(i, vals)| {
            let values: Vec<HeaderValue> = vals
                .iter()
                .filter_map(|b| HeaderValue::from_bytes(b).ok())
                .collect();
            cost_prop(&rigs[i], &rt, &values)
        },
    );
    // Random rigs: any N, max ≤ N, default ≤ max.
    let r = runner("cost-rigs", cases(150));
    run(
        &r,
        "random cost settings",
        (
            1u64..10_000,
            any::<prop::sample::Index>(),
            any::<prop::sample::Index>(),
            "[0-9]{1,6}",
        ),
        |(n, m, d, v)| {
            let max = 1 + m.index(n as usize) as u64;
            let default = 1 + d.index(max as usize) as u64;
            let rig = cost_rig(n, max, default);
            cost_prop(&rig, &rt, &[HeaderValue::from_str(&v).unwrap()])
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Target: the Redis script's arguments and replies.

/// The Lua side's `int` (lua/lib.lua): plain decimal digits, at most 16, below 2^53.
fn lua_int(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 16 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let v: u64 = s.parse().ok()?;
    (v < MAX_EXACT).then_some(v)
}

/// The ARGV checks of lua/decide.lua, in Rust: `Err` is the error reply the script would give.
fn lua_check_argv(args: &[String], nkeys: usize, now_us: u64) -> Result<(), String> {
    if nkeys < 1 || args.len() != 2 + ARGS_PER_KEY * nkeys {
        return Err("sluice: expected 2 + 8 args per key".into());
    }
    let arg = |j: usize, lo: u64, hi: u64, what: &str| {
        lua_int(&args[j - 1])
            .filter(|v| (lo..=hi).contains(v))
            .ok_or_else(|| format!("sluice: bad {what} in ARGV[{j}]: {:?}", args[j - 1]))
    };
    arg(2, 0, 1, "commit flag")?;
    for i in 1..=nkeys {
        let b = 2 + ARGS_PER_KEY * (i - 1);
        let algorithm = &args[b];
        if Algorithm::from_name(algorithm).is_none() {
            return Err(format!("sluice: unknown algorithm in ARGV[{}]", b + 1));
        }
        let limit = arg(b + 2, 1, 10_000_000, "limit")?;
        let window = arg(b + 3, 1, MAX_EXACT - 1, "window")?;
        let capacity = arg(b + 4, 1, MAX_EXACT - 1, "capacity")?;
        let interval = arg(b + 5, 1, MAX_EXACT - 1, "interval")?;
        let unit = arg(b + 6, 1, 1000, "unit")?;
        arg(b + 7, 0, MAX_EXACT - 1, "cost")?;
        arg(b + 8, 0, 1, "shadow flag")?;
        let product = if algorithm == "sliding_window" {
            u128::from(limit) * u128::from(window / unit)
        } else {
            u128::from(capacity) * u128::from(interval)
        };
        if product >= u128::from(MAX_EXACT)
            || u128::from(now_us) + 2 * u128::from(window) >= u128::from(MAX_EXACT)
        {
            return Err(format!("sluice: parameters past 2^53 in ARGV[{}]", b + 1));
        }
    }
    Ok(())
}

/// The script accepts a limit the config accepted, at any cost the config lets through.
fn lua_accepts_limit(p: &Params, max_cost: u64) -> Result<(), TestCaseError> {
    lua_accepts_limit_strict(p, max_cost)
}

fn lua_accepts_limit_strict(p: &Params, max_cost: u64) -> Result<(), TestCaseError> {
    // Redis TIME in 2100, well past any real clock.
    let now = 4_102_444_800_000_000;
    for cost in [0, 1, max_cost] {
        let call = LimitCall {
            key: "k".into(),
            params: *p,
            cost,
            shadow: cost == 1,
            op: Default::default(),
        };
        let args = argv("nonce", true, &[call]);
        if let Err(e) = lua_check_argv(&args, 1, now) {
            return Err(TestCaseError::fail(format!(
                "config accepts {p:?} (cost {cost}) but the Redis script refuses it: {e}"
            )));
        }
    }
    Ok(())
}

fn decisions_prop(reply: &[i64], keys: usize) -> Result<(), TestCaseError> {
    let got = decisions(reply, keys);
    let valid = keys.checked_mul(5) == Some(reply.len())
        && reply
            .chunks_exact(5)
            .all(|r| (0..=2).contains(&r[0]) && r[1..].iter().all(|&v| v >= 0));
    match got {
        Ok(ds) => {
            prop_assert!(
                valid,
                "accepted a malformed reply {reply:?} for {keys} keys"
            );
            prop_assert_eq!(ds.len(), keys);
            for (d, r) in ds.iter().zip(reply.chunks_exact(5)) {
                prop_assert_eq!(d.code as i64, r[0]);
                let v = [d.limit, d.remaining, d.retry_after_us, d.reset_after_us];
                for (a, b) in v.iter().zip(&r[1..]) {
                    prop_assert_eq!(*a as i64, *b);
                }
            }
        }
        Err(e) => {
            prop_assert!(!valid, "refused a well-formed reply: {e}");
            prop_assert!(!e.is_empty());
        }
    }
    Ok(())
}

fn params() -> impl Strategy<Value = Params> {
    (
        select(Algorithm::ALL.to_vec()),
        prop_oneof![
            1u64..100,
            1u64..=10_000_000,
            1u64..=100_000_000,
            Just(10_000_001)
        ],
        // Windows are whole milliseconds (config units), 1 s ..= 7 d.
        (1_000u64..=604_800_000).prop_map(|ms| ms * 1000),
        prop::option::of(prop_oneof![1u64..100, 1u64..=1 << 40]),
    )
        .prop_filter_map("Params::new refuses", |(a, n, w, b)| {
            Params::new(a, n, w, b.filter(|_| a.is_bucket())).ok()
        })
}

#[test]
fn fuzz_script_args() {
    replay("script_reply", |_, bytes| {
        let t = text(bytes);
        let mut it = t.split_whitespace();
        let keys: usize = it.next().and_then(|k| k.parse().ok()).unwrap_or(0);
        let reply: Vec<i64> = it.filter_map(|v| v.parse().ok()).collect();
        decisions_prop(&reply, keys)
    });
    let r = runner("script_args", cases(1_000));
    run(
        &r,
        "arbitrary replies",
        (
            prop::collection::vec(prop_oneof![-3i64..8, any::<i64>()], 0..22),
            prop_oneof![0usize..6, any::<usize>()],
        ),
        |(reply, keys)| decisions_prop(&reply, keys),
    );
    run(
        &r,
        "decisions round trip",
        prop::collection::vec(
            (
                0i64..3,
                0i64..=i64::MAX,
                0i64..=i64::MAX,
                0i64..=i64::MAX,
                0i64..=i64::MAX,
            ),
            0..5,
        ),
        |ds| {
            let reply: Vec<i64> = ds
                .iter()
                .flat_map(|&(a, b, c, d, e)| [a, b, c, d, e])
                .collect();
            let got: Vec<Decision> = decisions(&reply, ds.len()).map_err(TestCaseError::fail)?;
            prop_assert_eq!(got.len(), ds.len());
            decisions_prop(&reply, ds.len())?;
            // One integer more or fewer is refused.
            if !reply.is_empty() {
                prop_assert!(decisions(&reply[1..], ds.len()).is_err());
            }
            let mut longer = reply.clone();
            longer.push(0);
            prop_assert!(decisions(&longer, ds.len()).is_err());
            Ok(())
        },
    );
    run(
        &r,
        "ARGV of valid parameters",
        (
            "\\PC{0,20}",
            any::<bool>(),
            prop::collection::vec(
                (params(), any::<prop::sample::Index>(), any::<bool>()),
                0..4,
            ),
        ),
        |(nonce, commit, limits)| {
            let calls: Vec<LimitCall> = limits
                .iter()
                .enumerate()
                .map(|(i, (p, c, shadow))| LimitCall {
                    key: format!("k{i}"),
                    params: *p,
                    cost: 1 + c.index(p.capacity.min(1 << 20) as usize) as u64,
                    shadow: *shadow,
                    op: Default::default(),
                })
                .collect();
            let args = argv(&nonce, commit, &calls);
            prop_assert_eq!(args.len(), 2 + ARGS_PER_KEY * calls.len());
            prop_assert_eq!(&args[0], &nonce);
            prop_assert_eq!(&args[1], if commit { "1" } else { "0" });
            // Round trip: each limit's 9 values read back as what was sent.
            for (c, a) in calls.iter().zip(args[2..].chunks_exact(ARGS_PER_KEY)) {
                let p = &c.params;
                prop_assert_eq!(Algorithm::from_name(&a[0]), Some(p.algorithm));
                let nums: Vec<u64> = a[1..].iter().map(|s| s.parse().unwrap()).collect();
                prop_assert_eq!(
                    nums,
                    vec![
                        p.limit,
                        p.window_us,
                        p.capacity,
                        p.interval_us,
                        p.unit_us,
                        c.cost,
                        u64::from(c.shadow),
                        c.op as u64
                    ]
                );
            }
            if !calls.is_empty() {
                // Everything Params::new accepts, the script accepts.
                for (p, _, _) in &limits {
                    lua_accepts_limit(p, p.capacity)?;
                }
                let now = 1_800_000_000_000_000;
                lua_check_argv(&args, calls.len(), now).map_err(TestCaseError::fail)?;
            }
            Ok(())
        },
    );
    // The same through the config: any rate `check` accepts is one the script decides.
    run(
        &r,
        "rates the config accepts",
        (
            select(ALGOS.to_vec()),
            prop_oneof![1u64..1000, 1u64..=20_000_000],
            select(&["s", "1s", "1m", "1h", "1d", "7d", "30s", "86399s"][..]),
            prop::option::of(1u64..1_000_000),
        ),
        |(algo, n, w, burst)| {
            let burst = burst
                .filter(|_| Algorithm::from_name(algo).unwrap().is_bucket())
                .map(|b| format!("\n        burst: {b}"))
                .unwrap_or_default();
            let yaml = format!(
                "upstreams: {{u: {{targets: [http://127.0.0.1:1]}}}}\nroutes:\n  - name: r\n    match: {{path_prefix: /}}\n    upstream: u\n    limits:\n      - name: l\n        by: ip\n        algorithm: {algo}\n        rate: {n}/{w}{burst}\n"
            );
            config_prop("rate.yaml", &yaml)
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Bugs fuzzing found, each with its minimal input, checked strictly so they stay fixed.

/// The minimal input of each bug fuzzing found; every one still failing is listed.
#[test]
fn found_bugs_stay_fixed() {
    let read = |f: &str| text(&std::fs::read(corpus_dir("config").join(f)).unwrap());
    let mut bugs = Vec::new();

    // A value with a line break made a multi-line error.
    for f in [
        "newline-in-route-name.yaml",
        "newline-in-duration.yaml",
        "block-scalars.yaml",
        "limit-name-newline.yaml",
    ] {
        if let Err(e) = sluice::config::load_str(f, &read(f)) {
            for e in e.0 {
                if e.to_string().contains(['\n', '\r']) {
                    bugs.push(format!("multi-line config error: {:?}", e.to_string()));
                }
            }
        }
    }

    // N above 10^7 was accepted by `check` and refused by the Redis script.
    let f = "rate-above-script-limit.yaml";
    match sluice::config::load_str(f, &read(f)) {
        Ok(t) => {
            for l in t.table.routes.iter().flat_map(|r| &r.limits) {
                if let Err(e) = lua_accepts_limit_strict(&l.params, max_cost(&l.cost)) {
                    bugs.push(format!("{f}: {e}"));
                }
            }
        }
        Err(e) => println!("{f} is refused now: {e}"),
    }

    // A window past u64::MAX µs wrapped.
    let f = "rate-window-wraps.yaml";
    if let Ok(t) = sluice::config::load_str(f, &read(f)) {
        let p = t.table.routes[0].limits[0].params;
        bugs.push(format!(
            "{f}: `{}` accepted, decided with a window of {} µs",
            t.file.routes[0].limits[0].describe(),
            p.window_us
        ));
    }

    // One anchor aliased n times cost n² (time and memory) before aliases were bounded.
    let n = 2400;
    let quadratic = format!(
        "upstreams: {{u: {{targets: [http://127.0.0.1:1]}}}}\nroutes:\n  - name: r\n    match: {{path_prefix: /}}\n    upstream: u\n    limits:\n      - name: l\n        algorithm: gcra\n        rate: 1/s\n        by: [&a [{}], {}]\n",
        vec!["ip"; n].join(", "),
        vec!["*a"; n].join(", ")
    );
    match sluice::config::load_str("quadratic.yaml", &quadratic) {
        Err(e) if e.to_string().contains("aliases expand this document") => {}
        other => bugs.push(format!(
            "{} bytes of YAML (one anchor aliased {n} times) were expanded: {:?}",
            quadratic.len(),
            other.map(|_| "loaded").map_err(|e| e.to_string())
        )),
    }

    assert!(
        bugs.is_empty(),
        "{} known bugs:\n{}",
        bugs.len(),
        bugs.join("\n")
    );
}
