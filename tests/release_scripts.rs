//! The scripts that build and run release binaries (benchmarks, quickstart, soak, the profile
//! check) find them where cargo put them, and build them with the committed profile. A script
//! that ran `target/release/sluice` while `CARGO_TARGET_DIR` sent the build elsewhere would
//! benchmark a stale binary, or none; a release directory built with an older profile would
//! keep its crates, as cargo does not see the profile.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `script` after sourcing scripts/bench_lib.sh, in the project root, with `env` set and
/// `CARGO_TARGET_DIR` and `SLUICE_PGO` unset unless `env` sets them: its output.
fn lib(script: &str, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &format!(". scripts/bench_lib.sh && {script}")])
        .current_dir(root())
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("SLUICE_PGO")
        .envs(env.iter().copied());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
}

#[test]
fn target_dir_is_where_cargo_builds() {
    let elsewhere = tempfile::tempdir().unwrap();
    let elsewhere = elsewhere.path().to_str().unwrap();
    let env = [("CARGO_TARGET_DIR", elsewhere)];
    assert_eq!(lib("target_dir", &env), elsewhere);
    // Unset: cargo's own answer (./target, unless a cargo config on this machine says else).
    let meta = Command::new("cargo")
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root())
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    let meta: serde_json::Value = serde_json::from_slice(&meta.stdout).unwrap();
    assert_eq!(lib("target_dir", &[]), meta["target_directory"]);
}

#[test]
fn the_profile_stamp_is_the_profile_s_hash_or_off() {
    use sha2::{Digest, Sha256};
    let profile = std::fs::read(root().join("pgo/sluice.profdata")).unwrap();
    let hex: String = Sha256::digest(&profile)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(lib("profile_stamp", &[]), hex);
    assert_eq!(lib("profile_stamp", &[("SLUICE_PGO", "off")]), "off");
}

#[test]
fn a_release_directory_built_with_another_profile_is_started_over() {
    let target = tempfile::tempdir().unwrap();
    let release = target.path().join("release");
    let env = |pgo: &'static str| {
        [
            ("CARGO_TARGET_DIR", target.path().to_str().unwrap()),
            ("SLUICE_PGO", pgo),
        ]
    };
    let built = || {
        std::fs::create_dir_all(release.join("deps")).unwrap();
        std::fs::write(release.join("deps/crate.rlib"), "built").unwrap();
    };
    let clean = "clean_if_profile_changed \"$CARGO_TARGET_DIR/release\"";
    let mark = "mark_profile \"$CARGO_TARGET_DIR/release\"";

    // Built before builds were marked: which profile is unknown.
    built();
    lib(clean, &env("on"));
    assert!(!release.exists(), "an unmarked release directory is kept");
    // Built and marked with this profile: kept, and kept again.
    built();
    lib(mark, &env("on"));
    lib(clean, &env("on"));
    lib(clean, &env("on"));
    assert!(release.join("deps/crate.rlib").is_file());
    // Now without the profile: the crates built with it go.
    lib(clean, &env("off"));
    assert!(
        !release.exists(),
        "crates built with the profile kept for SLUICE_PGO=off"
    );
    // Marked by another profile.
    built();
    std::fs::write(release.join(".sluice-profile"), "0123\n").unwrap();
    lib(clean, &env("on"));
    assert!(!release.exists(), "crates built with another profile kept");
    // Nothing built yet: nothing to do.
    lib(clean, &env("on"));
    assert!(!release.exists());
}

#[test]
fn no_script_runs_a_binary_from_a_fixed_target_path() {
    let mut offenders = Vec::new();
    for entry in std::fs::read_dir(root().join("scripts")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if !line.trim_start().starts_with('#') && line.contains("target/release") {
                offenders.push(format!("{}:{}: {line}", path.display(), n + 1));
            }
        }
    }
    assert!(offenders.is_empty(), "{offenders:#?}");
}

/// build_release.sh, the one place that says where the binaries are, prints the directory it
/// built into; it starts that directory over for another profile before building anything in
/// it, builds the binary and the example each in a cargo run of its own (in one, the
/// example's dev-dependency features would rename the binary's symbols and the profile would
/// apply to none of them), and marks the directory as built with this profile after both.
#[test]
fn build_release_cleans_first_marks_last_and_says_where() {
    let build = std::fs::read_to_string(root().join("scripts/build_release.sh")).unwrap();
    assert_eq!(build.lines().last(), Some("echo \"$rel\""));
    let runs: Vec<&str> = build
        .lines()
        .filter(|l| l.trim_start().starts_with("cargo build"))
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[0].ends_with("--bin sluice") && runs[1].ends_with("--example demo_upstream"));
    let at = |needle: &str| {
        let lines: Vec<usize> = build
            .lines()
            .enumerate()
            .filter(|(_, l)| l.trim_start().starts_with(needle))
            .map(|(n, _)| n)
            .collect();
        assert_eq!(lines.len(), 1, "{needle}: {lines:?}");
        lines[0]
    };
    let order = [
        at("rel=\"$(target_dir)/release\""),
        at("clean_if_profile_changed \"$rel\""),
        at("cargo build --release \"$@\" --bin sluice"),
        at("cargo build --release \"$@\" --example demo_upstream"),
        at("mark_profile \"$rel\""),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
}

/// Cargo options that put the binaries somewhere other than `$(target_dir)/release` are
/// refused before anything is cleaned or built: the callers would run what the script prints,
/// a stale binary or none.
#[test]
fn build_release_refuses_options_that_build_elsewhere() {
    for args in [
        &["--target", "x86_64-unknown-linux-gnu"][..],
        &["--target=x86_64-unknown-linux-gnu"],
        &["--quiet", "--target-dir", "/tmp/elsewhere"],
        &["--strict", "--target-dir=/tmp/elsewhere"],
        &["--profile", "dev"],
        &["--profile=release-lto"],
        &["--artifact-dir", "/tmp/out"],
        &["--out-dir=/tmp/out"],
    ] {
        // An empty target directory: had the script gone on, it would have built into it.
        let target = tempfile::tempdir().unwrap();
        let out = Command::new("bash")
            .arg("scripts/build_release.sh")
            .args(args)
            .current_dir(root())
            .env("CARGO_TARGET_DIR", target.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("builds elsewhere"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(
            std::fs::read_dir(target.path()).unwrap().count(),
            0,
            "{args:?}"
        );
    }
}
