//! The scripts that build and run release binaries (benchmarks, quickstart, soak, the profile
//! check) find them where cargo put them. A script that ran `target/release/sluice` while
//! `CARGO_TARGET_DIR` sent the build elsewhere would benchmark a stale binary, or none.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target_dir` from scripts/bench_lib.sh, run in the project root with `CARGO_TARGET_DIR`
/// set to `dir`, or unset.
fn target_dir(dir: Option<&str>) -> String {
    let mut cmd = Command::new("bash");
    cmd.args(["-c", ". scripts/bench_lib.sh && target_dir"])
        .current_dir(root())
        .env_remove("CARGO_TARGET_DIR");
    if let Some(d) = dir {
        cmd.env("CARGO_TARGET_DIR", d);
    }
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
    assert_eq!(target_dir(Some(elsewhere)), elsewhere);
    assert_eq!(target_dir(None), root().join("target").to_str().unwrap());
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
    // The one place that says where: build_release.sh prints the directory it built into.
    let build = std::fs::read_to_string(root().join("scripts/build_release.sh")).unwrap();
    assert_eq!(build.lines().last(), Some("echo \"$rel\""));
    assert!(build.contains("rel=\"$(target_dir)/release\""));
}
