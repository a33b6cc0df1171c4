//! The limiter script sent to Redis, assembled at compile time from `lua/`: one file per
//! algorithm (each the twin of its module in [`crate::limiter::algo`]), the all-or-nothing driver,
//! and an entry point that reads the store's clock. One script means one name, and one call per
//! request (or per batch of requests), whatever its limits.
//!
//! It reaches Redis in two forms with the same body:
//! - a library of Redis Functions ([`Library`], called with FCALL): loaded once, so that a call
//!   only decides. An EVAL script defines the body's forty-odd functions again at every call,
//!   about a quarter of Redis's work for a lone request;
//! - a script for EVALSHA ([`SCRIPT`]), where Redis refuses `FUNCTION LOAD` or `FCALL` (an ACL
//!   that grants EVALSHA alone).

/// Helpers, the algorithms and `decide`, in order, inside `sluice()`, which builds them and
/// returns the production entry (`decide_now(keys, argv)`) and the dispatcher the tests pin
/// the clock with (`decide(now, extra_args, keys, argv)`). A function, not a chunk: a library
/// builds it at its first call, as loading may not read Lua's globals.
macro_rules! sluice_lua_body {
    () => {
        concat!(
            "local function sluice()\n",
            include_str!("../../../lua/lib.lua"),
            include_str!("../../../lua/fixed_window.lua"),
            include_str!("../../../lua/sliding_log.lua"),
            include_str!("../../../lua/sliding_window.lua"),
            include_str!("../../../lua/token_bucket.lua"),
            include_str!("../../../lua/leaky_bucket.lua"),
            include_str!("../../../lua/gcra.lua"),
            include_str!("../../../lua/concurrency.lua"),
            include_str!("../../../lua/decide.lua"),
            "return decide_now, decide\nend\n",
        )
    };
}

/// Everything but an entry point. Tests append their own entry (a pinned clock) to compare
/// each script with its Rust twin; production only ever runs [`SCRIPT`] or the [`Library`].
pub const BODY: &str = sluice_lua_body!();

/// The EVALSHA form; the entry point decides at `TIME`, the store's clock. Its flag
/// lets a batch on Redis Cluster touch keys of several slots of the node it runs on (the keys
/// then follow in ARGV: Redis routes and checks declared KEYS as one slot's). Redis itself
/// refuses a key of another node, and the script raises that error before charging the
/// request (see `lua/decide.lua`). The flag changes nothing on standalone Redis. The library
/// registers its function with the same flag.
pub const SCRIPT: &str = concat!(
    "#!lua flags=allow-cross-slot-keys\n",
    sluice_lua_body!(),
    include_str!("../../../lua/main.lua")
);

/// What follows a library's header: the body and the registration of its one function.
const LIBRARY_BODY: &str = concat!(
    sluice_lua_body!(),
    include_str!("../../../lua/function.lua")
);

/// The FCALL form: a library of Redis Functions holding one function of the same name.
pub struct Library {
    /// `sluice_` and the SHA-1 of the body: a gateway of another version brings a library of
    /// another name, so both are served side by side during a rolling upgrade.
    pub name: String,
    /// What `FUNCTION LOAD` takes.
    pub code: String,
}

impl Library {
    pub fn new() -> Library {
        let name = format!("sluice_{}", sha1_hex(LIBRARY_BODY));
        let code = format!("#!lua name={name}\nlocal FUNCTION_NAME = '{name}'\n{LIBRARY_BODY}");
        Library { name, code }
    }
}

impl Default for Library {
    fn default() -> Self {
        Library::new()
    }
}

/// SHA-1 of [`SCRIPT`], hex: what EVALSHA names.
pub fn sha1_hex(script: &str) -> String {
    fred::util::sha1_hash(script)
}

use crate::limiter::algo::Params;

/// ARGV entries per key after the two leading ones (see `lua/decide.lua`).
pub const ARGS_PER_KEY: usize = 9;

/// The ARGV of one script call: nonce, commit flag, then 9 values per limit.
pub fn argv(nonce: &str, commit: bool, calls: &[super::LimitCall]) -> Vec<String> {
    let mut a = Vec::with_capacity(2 + ARGS_PER_KEY * calls.len());
    push_request(&mut a, nonce, commit, calls);
    a
}

/// The ARGV of a batch (`lua/decide.lua`, `decide_batch`): `batch`, the request count, the
/// count of distinct limits and each one's 6 static values once, then per request its nonce
/// and its shape: per key `index:cost:shadow:op` (its limit's index from 1), joined by `,`.
/// The KEYS are every request's keys, in the same order. The script checks and reads each
/// limit and each distinct shape once per call, not once per request, and Redis makes two
/// strings per request, not six.
pub fn batch_argv<'a>(
    requests: impl ExactSizeIterator<Item = (&'a str, &'a [super::LimitCall])>,
) -> Vec<String> {
    use std::fmt::Write;
    let requests: Vec<_> = requests.collect();
    let mut specs: Vec<&Params> = Vec::new();
    let mut shapes = Vec::with_capacity(requests.len());
    for (_, calls) in &requests {
        let mut shape = String::with_capacity(8 * calls.len());
        for c in calls.iter() {
            let i = match specs.iter().position(|p| **p == c.params) {
                Some(i) => i,
                None => {
                    specs.push(&c.params);
                    specs.len() - 1
                }
            };
            let [cost, shadow, op] = call_values(c);
            let sep = if shape.is_empty() { "" } else { "," };
            let _ = write!(shape, "{sep}{}:{cost}:{shadow}:{op}", i + 1);
        }
        shapes.push(shape);
    }
    let mut a = Vec::with_capacity(3 + 6 * specs.len() + 2 * requests.len());
    a.extend(["batch".to_owned(), requests.len().to_string()]);
    a.push(specs.len().to_string());
    for p in specs {
        push_spec(&mut a, p);
    }
    for ((nonce, _), shape) in requests.into_iter().zip(shapes) {
        a.push(nonce.to_owned());
        a.push(shape);
    }
    a
}

fn push_request(a: &mut Vec<String>, nonce: &str, commit: bool, calls: &[super::LimitCall]) {
    a.push(nonce.to_owned());
    a.push(if commit { "1" } else { "0" }.to_owned());
    for c in calls {
        push_spec(a, &c.params);
        push_call(a, c);
    }
}

/// A limit's static values: algorithm, N, W, C, I, unit.
fn push_spec(a: &mut Vec<String>, p: &Params) {
    a.push(p.script_name().to_owned());
    for v in [p.limit, p.window_us, p.capacity, p.interval_us, p.unit_us] {
        a.push(v.to_string());
    }
}

/// One key's call on its limit, in the order the script reads it: cost, shadow, op.
fn call_values(c: &super::LimitCall) -> [u64; 3] {
    [c.cost, u64::from(c.shadow), c.op as u64]
}

fn push_call(a: &mut Vec<String>, c: &super::LimitCall) {
    a.extend(call_values(c).map(|v| v.to_string()));
}

/// Decode a batch reply, one flat array: per request (of `keys[r]` keys) in order, its 5
/// integers per key, or in their place one string, its own error.
pub fn batch_decisions(
    reply: Vec<fred::types::Value>,
    keys: &[usize],
) -> Result<Vec<Result<Vec<crate::limiter::algo::Decision>, String>>, String> {
    use fred::types::Value;
    let mut items = reply.into_iter();
    let mut out = Vec::with_capacity(keys.len());
    let mut ints = Vec::new();
    'requests: for (r, &n) in keys.iter().enumerate() {
        ints.clear();
        while ints.len() < 5 * n {
            let error = match items.next() {
                Some(Value::Integer(v)) => {
                    ints.push(v);
                    continue;
                }
                Some(Value::String(e)) if ints.is_empty() => e.to_string(),
                Some(Value::Bytes(e)) if ints.is_empty() => String::from_utf8_lossy(&e).into(),
                Some(other) => return Err(format!("request {r} of the batch answered {other:?}")),
                None => return Err(format!("batch answered {r} of {} requests", keys.len())),
            };
            // Its error in place of its integers.
            out.push(Err(error));
            continue 'requests;
        }
        out.push(decisions(&ints, n));
    }
    match items.next() {
        Some(extra) => Err(format!(
            "batch answered more than its {} requests: {extra:?}",
            keys.len()
        )),
        None => Ok(out),
    }
}

/// Decode a reply of 5 integers per key into decisions.
pub fn decisions(
    reply: &[i64],
    keys: usize,
) -> Result<Vec<crate::limiter::algo::Decision>, String> {
    use crate::limiter::algo::{Code, Decision};
    if keys.checked_mul(5) != Some(reply.len()) {
        return Err(format!(
            "script answered {} integers for {keys} keys",
            reply.len()
        ));
    }
    reply
        .chunks_exact(5)
        .map(|r| {
            let code = Code::from_i64(r[0]).ok_or_else(|| format!("bad code {}", r[0]))?;
            let u = |v: i64| u64::try_from(v).map_err(|_| format!("negative value {v}"));
            Ok(Decision {
                code,
                limit: u(r[1])?,
                remaining: u(r[2])?,
                retry_after_us: u(r[3])?,
                reset_after_us: u(r[4])?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_starts_with_the_shebang_and_has_every_algorithm() {
        // Redis 7 reads flags only from the first line; Cluster batches need this one.
        assert!(SCRIPT.starts_with("#!lua flags=allow-cross-slot-keys\n"));
        use crate::limiter::algo::Algorithm;
        for a in Algorithm::ALL.into_iter().chain([Algorithm::Concurrency]) {
            assert!(
                BODY.contains(&format!("ALGO.{} = function", a.name())),
                "{a:?}"
            );
        }
        assert_eq!(sha1_hex(SCRIPT).len(), 40);
    }

    #[test]
    fn the_library_is_named_by_its_body_and_registers_one_function_of_that_name() {
        let lib = Library::new();
        let hex = lib.name.strip_prefix("sluice_").unwrap();
        assert!(hex.len() == 40 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
        // Redis reads the library's name only from the first line.
        let first = lib.code.lines().next().unwrap();
        assert_eq!(first, format!("#!lua name={}", lib.name));
        assert!(lib
            .code
            .contains(&format!("local FUNCTION_NAME = '{}'", lib.name)));
        assert!(lib.code.contains("flags = {'allow-cross-slot-keys'}"));
        assert!(lib
            .code
            .ends_with(include_str!("../../../lua/function.lua")));
    }

    #[test]
    fn replies_decode_and_reject_garbage() {
        let d = decisions(&[1, 5, 0, 1_000_000, 2_000_000], 1).unwrap();
        assert_eq!(d[0].code, crate::limiter::algo::Code::Limited);
        assert_eq!(d[0].retry_after_us, 1_000_000);
        assert!(decisions(&[0, 5, 1, 0], 1).is_err());
        assert!(decisions(&[7, 5, 1, 0, 0], 1).is_err());
        assert!(decisions(&[0, 5, -1, 0, 0], 1).is_err());
    }

    #[test]
    fn a_flat_batch_reply_decodes_per_request_with_errors_in_place() {
        use fred::types::Value::{self, Integer as Int, Null};
        let ok = |code| [Int(code), Int(5), Int(4), Int(0), Int(60)];
        let reply = || {
            let mut r: Vec<Value> = ok(0).into();
            r.push(Value::String("sluice: bad limit in ARGV[5]".into()));
            r.extend(ok(1));
            r.extend(ok(0));
            r
        };
        // Requests of 1, 1 (its error) and 2 keys.
        let got = batch_decisions(reply(), &[1, 1, 2]).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].as_ref().unwrap()[0].remaining, 4);
        assert!(got[1].as_ref().unwrap_err().contains("bad limit"));
        let two = got[2].as_ref().unwrap();
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].code, crate::limiter::algo::Code::Limited);
        // Counted wrong either way, or an error inside a request's integers: the reply is
        // refused whole, never read out of step.
        assert!(batch_decisions(reply(), &[1, 1, 1]).is_err());
        assert!(batch_decisions(reply(), &[1, 1, 3]).is_err());
        assert!(batch_decisions(reply(), &[2, 1]).is_err());
        assert!(batch_decisions(vec![Int(0), Null], &[1]).is_err());
        // A request answers with the codes the script sends, or its own error.
        let bad = batch_decisions(ok(7).into(), &[1]).unwrap();
        assert!(bad[0].is_err());
    }
}
