//! scripts/rustc-pgo, the rustc wrapper of release builds (.cargo/config.toml): it adds the
//! committed profile to optimized builds only, and never to a build that cannot use it, so
//! that a `cargo build --release` with any toolchain still builds. Driven with a stand-in
//! rustc that prints its arguments and the version the wrapper gave the crate.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The LLVM major version recorded with the committed profile.
fn profile_llvm() -> u32 {
    let meta = std::fs::read_to_string(root().join("pgo/sluice.meta")).unwrap();
    let line = meta.lines().find_map(|l| l.strip_prefix("llvm_major="));
    line.expect("pgo/sluice.meta has llvm_major=")
        .parse()
        .unwrap()
}

/// A stand-in rustc in `dir` whose `-vV` reports LLVM `llvm`; otherwise it prints each
/// argument on a line.
fn fake_rustc(dir: &Path, llvm: u32) -> PathBuf {
    let path = dir.join(format!("rustc-llvm{llvm}"));
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = -vV ]; then\n  printf 'rustc 1.0.0\\nhost: x\\nLLVM version: {llvm}.1.0\\n'\n  exit 0\nfi\nfor a in \"$@\"; do echo \"$a\"; done\n"
    );
    std::fs::write(&path, script).unwrap();
    Command::new("chmod").arg("+x").arg(&path).status().unwrap();
    path
}

/// The stand-in's output lines when the wrapper runs it with `args` (and `SLUICE_PGO` set to
/// `pgo` when given, unset otherwise): the arguments rustc was given.
fn wrapped(rustc: &Path, args: &[&str], pgo: Option<&str>) -> Vec<String> {
    let mut cmd = Command::new(root().join("scripts/rustc-pgo"));
    cmd.arg(rustc).args(args).env_remove("SLUICE_PGO");
    if let Some(v) = pgo {
        cmd.env("SLUICE_PGO", v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

const RELEASE: &[&str] = &["--crate-name", "x", "-C", "opt-level=3", "src/lib.rs"];

fn profile_flag() -> String {
    format!(
        "-Cprofile-use={}",
        root().join("pgo/sluice.profdata").display()
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[test]
fn an_optimized_build_gets_the_profile_and_the_cfg_its_version_shows() {
    let dir = tempfile::tempdir().unwrap();
    let rustc = fake_rustc(dir.path(), profile_llvm());
    let mut expected = strings(RELEASE);
    expected.extend([profile_flag(), "--cfg".into(), "sluice_pgo".into()]);
    assert_eq!(wrapped(&rustc, RELEASE, None), expected);
}

#[test]
fn a_newer_llvm_reads_the_profile_too() {
    let dir = tempfile::tempdir().unwrap();
    let rustc = fake_rustc(dir.path(), profile_llvm() + 1);
    assert!(wrapped(&rustc, RELEASE, None).contains(&profile_flag()));
}

#[test]
fn builds_that_cannot_or_should_not_use_it_pass_through_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let same = fake_rustc(dir.path(), profile_llvm());
    let older = fake_rustc(dir.path(), profile_llvm() - 1);
    // A debug or test build.
    let debug = ["--crate-name", "x", "-C", "debuginfo=2", "src/lib.rs"];
    assert_eq!(wrapped(&same, &debug, None), strings(&debug));
    // An LLVM older than the profile's cannot read it.
    assert_eq!(wrapped(&older, RELEASE, None), strings(RELEASE));
    // Turned off.
    assert_eq!(wrapped(&same, RELEASE, Some("off")), strings(RELEASE));
    // scripts/pgo.sh's instrumented build.
    let generate = ["-C", "opt-level=3", "-Cprofile-generate", "src/lib.rs"];
    assert_eq!(wrapped(&same, &generate, None), strings(&generate));
}

#[test]
fn cargo_s_version_probe_passes_through() {
    let dir = tempfile::tempdir().unwrap();
    let rustc = fake_rustc(dir.path(), 7);
    let out = wrapped(&rustc, &["-vV"], None);
    assert_eq!(out, ["rustc 1.0.0", "host: x", "LLVM version: 7.1.0"]);
}

/// With this toolchain's real rustc, an optimized crate builds through the wrapper without a
/// word: the committed profile is one its LLVM reads (or, were its LLVM older, it is left
/// out). rustc only warns about a profile it cannot read (`invalid instrumentation profile
/// data`) and builds on without it, so a corrupt profile would otherwise go unnoticed.
#[test]
fn the_committed_profile_builds_with_this_toolchain() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("lib.rs");
    std::fs::write(
        &src,
        "pub fn add(a: u64, b: u64) -> u64 { a.wrapping_add(b) }\n",
    )
    .unwrap();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(root().join("scripts/rustc-pgo"))
        .arg(rustc)
        .args([
            "--crate-type",
            "lib",
            "--crate-name",
            "probe",
            "-C",
            "opt-level=3",
        ])
        .arg("--out-dir")
        .arg(dir.path())
        .arg(&src)
        .env_remove("SLUICE_PGO")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.trim().is_empty(), "rustc said: {stderr}");
    assert!(dir.path().join("libprobe.rlib").exists());
}
