//! `kinference serve` flags: values that cannot work are refused at startup with exit code 2
//! and a message naming the flag, instead of being accepted and failing later (or silently).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{free_port, temp_dir, write_tiny_bundle};

/// Runs `kinference serve ARGS…` (with `--config` on a valid bundle unless `kubernetes`) for at
/// most 10 s: its exit code (`None`: still running, killed) and its standard error.
fn serve(kubernetes: bool, args: &[&str]) -> (Option<i32>, String) {
    serve_with_env(kubernetes, args, &[])
}

/// [`serve`] with environment variables set.
fn serve_with_env(kubernetes: bool, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = temp_dir("cli");
    write_tiny_bundle(&dir, &format!("127.0.0.1:{}", free_port()), "");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kinference"));
    cmd.arg("serve");
    if !kubernetes {
        cmd.arg("--config")
            .arg(&dir)
            .args(["--listen", "127.0.0.1:0"]);
    }
    let mut child = cmd
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (code, err)
}

#[test]
fn zero_durations_are_refused_naming_the_flag() {
    // `--reload-interval 0s` used to stop every reload (the polling timer panicked) while the
    // server kept serving; zero timeouts fail every request.
    for flag in [
        "--reload-interval",
        "--upstream-timeout",
        "--header-read-timeout",
        "--body-read-timeout",
    ] {
        let (code, err) = serve(false, &[flag, "0s"]);
        assert_eq!(code, Some(2), "{flag} 0s: {err}");
        assert!(
            err.contains(flag) && err.contains("more than 0"),
            "{flag}: {err}"
        );
    }
}

#[test]
fn kubernetes_flags_need_kubernetes() {
    let (code, err) = serve(false, &["--lease", "llm/kinference-leader"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("`--lease` needs `--kubernetes`"),
        "names the flag: {err}"
    );
    let (code, err) = serve(false, &["--namespace", "llm", "--identity", "pod-1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--namespace") && err.contains("--identity"),
        "{err}"
    );
}

#[test]
fn a_malformed_lease_namespace_or_identity_is_refused_naming_the_flag() {
    for (flag, value) in [
        ("--lease", "llm/kinference/leader"),
        ("--lease", "Kinference-Leader"),
        ("--lease", "llm/"),
        ("--lease", "/kinference-leader"),
        ("--namespace", "LLM"),
        ("--namespace", "team.a"),
        ("--identity", " "),
    ] {
        let (code, err) = serve(true, &["--kubernetes", flag, value]);
        assert_eq!(code, Some(2), "{flag} {value:?}: {err}");
        assert!(
            err.contains(&format!("'{flag} <")),
            "{flag} {value:?}: {err}"
        );
    }
}

#[test]
fn the_limiter_store_comes_from_the_environment_and_its_password_is_never_shown() {
    // KINF_LIMITER_STORE keeps a Redis password out of the process list; a bad URL's error
    // names the flag but not the password, whichever way the URL came.
    let url = "valkey://kinf:s3cret-pw@cache:6379/0";
    let (code, err) = serve_with_env(false, &[], &[("KINF_LIMITER_STORE", url)]);
    assert_ne!(code, None, "a bad store must stop startup: {err}");
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("--limiter-store"), "{err}");
    assert!(err.contains("valkey://***@cache:6379/0"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    let (code, err) = serve(false, &["--limiter-store", url]);
    assert_ne!(code, None, "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    // The flag wins over the environment.
    let (code, err) = serve_with_env(
        false,
        &["--limiter-store", "memory", "--reload-interval", "0s"],
        &[("KINF_LIMITER_STORE", url)],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("valkey"), "{err}");
    // `--help` names the variable without its value.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kinference"))
        .args(["serve", "--help"])
        .env("KINF_LIMITER_STORE", url)
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("KINF_LIMITER_STORE"), "{help}");
    assert!(!help.contains("s3cret"), "{help}");
}
