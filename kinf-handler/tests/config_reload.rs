//! Directory mode's reloads under hostile edits: a file that cannot be read refuses the bundle
//! visibly (`lastRefused`, `/readyz`, `kinference_policy_refused`) with the file (and line) at
//! fault, the last good policy stays in force, and the refusal clears once the file is fixed;
//! a save caught midway (truncated, deleted and created again, a ConfigMap's `..data` link
//! swapped before its new files are linked) is not applied.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kinf_handler::gateway::{Gateway, GatewayOptions};

/// The bundle every test starts from: a pool, a policy and two worker sets in two files.
fn model_aliases(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/policies/model-aliases")
            .join(name),
    )
    .unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kinf-reload-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A directory holding the bundle, and a gateway that applied it (generation 1).
fn applied(name: &str) -> (PathBuf, Arc<Gateway>, Option<u64>) {
    let dir = temp_dir(name);
    std::fs::write(dir.join("policy.yaml"), model_aliases("policy.yaml")).unwrap();
    std::fs::write(dir.join("workers.yaml"), model_aliases("workers.yaml")).unwrap();
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.clone(),
        ..GatewayOptions::default()
    });
    let last = reload(&gw, &dir, None);
    assert_eq!(gw.store.current().unwrap().generation, 1);
    assert!(gw.store.last_rejected().is_none());
    (dir, gw, last)
}

/// No live ingestion: the worker sets' addresses are not reachable.
fn no_ingestion() -> kinf_handler::serve::OnApplied {
    Arc::new(|_, _| {})
}

/// What `kinference serve` does at startup, and what each poll that finds a change does.
fn reload(gw: &Arc<Gateway>, dir: &Path, last: Option<u64>) -> Option<u64> {
    kinf_handler::serve::reload(gw, dir, last, &no_ingestion())
}

fn reloads(gw: &Gateway, result: &str) -> f64 {
    gw.metrics
        .value("kinference_policy_reloads_total", &[("result", result)])
        .unwrap_or(0.0)
}

fn refused_gauge(gw: &Gateway) -> f64 {
    gw.metrics.value("kinference_policy_refused", &[]).unwrap()
}

async fn readyz(gw: &Arc<Gateway>) -> (u16, serde_json::Value) {
    use tower::ServiceExt;
    let resp = gw
        .router()
        .oneshot(
            axum::http::Request::get("/readyz")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap())
}

/// The refusal recorded now: its errors.
fn refusal(gw: &Gateway) -> Vec<String> {
    gw.store
        .last_rejected()
        .map(|r| r.errors.clone())
        .unwrap_or_default()
}

/// A file saved in another encoding (here Latin-1: `é` as the single byte 0xE9) refuses the
/// bundle with the file, line and column of the first byte that is not UTF-8, in `/readyz`,
/// `lastRefused` and the metrics; the policy in force stays; the fix clears the refusal.
#[tokio::test]
async fn a_file_that_is_not_utf8_is_refused_by_file_line_and_column_until_fixed() {
    let (dir, gw, last) = applied("latin1");
    let held = gw.store.current().unwrap();
    let mut bytes = model_aliases("workers.yaml").into_bytes();
    // Line 3 is `metadata: ...`: a comment with a Latin-1 `é` after `# caf`.
    let line3 = bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(1)
        .unwrap()
        .0
        + 1;
    bytes.splice(line3..line3, b"# caf\xe9\n".iter().copied());
    std::fs::write(dir.join("workers.yaml"), &bytes).unwrap();

    let after_bad = reload(&gw, &dir, last);
    assert_ne!(after_bad, last, "the broken content is a change");
    let errors = refusal(&gw);
    let file = dir.join("workers.yaml").display().to_string();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(&format!("{file}:3:6: error: not UTF-8 text: byte 0xE9")),
        "{errors:?}"
    );
    assert!(
        Arc::ptr_eq(&held, &gw.store.current().unwrap()),
        "the last good policy stays in force, whole"
    );
    assert_eq!((reloads(&gw, "refused"), refused_gauge(&gw)), (1.0, 1.0));
    let (status, body) = readyz(&gw).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["lastRefused"]["errors"][0],
        errors[0].as_str(),
        "{body}"
    );
    // Nothing changed since: not refused again.
    assert_eq!(reload(&gw, &dir, after_bad), after_bad);
    assert_eq!(reloads(&gw, "refused"), 1.0);

    // Fixed (saved as UTF-8 again): nothing new to apply, and the refusal is cleared.
    std::fs::write(dir.join("workers.yaml"), model_aliases("workers.yaml")).unwrap();
    reload(&gw, &dir, after_bad);
    assert!(refusal(&gw).is_empty());
    assert_eq!(refused_gauge(&gw), 0.0);
    assert_eq!(gw.store.current().unwrap().generation, 1);
    assert_eq!(readyz(&gw).await.1["lastRefused"], serde_json::Value::Null);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `*.yaml` over the size limit is refused without being read whole, and a FIFO named
/// `*.yaml` is refused without being opened (reading it would block the reloads for good).
#[tokio::test]
async fn a_file_too_large_or_no_regular_file_is_refused_without_being_read() {
    let (dir, gw, last) = applied("huge");
    // Valid YAML (one long comment), a little over the limit.
    let mut huge = model_aliases("workers.yaml");
    huge.push_str("# ");
    huge.push_str(&"x".repeat(kinf_handler::config_dir::MAX_FILE_BYTES as usize));
    huge.push('\n');
    std::fs::write(dir.join("workers.yaml"), huge).unwrap();
    let after = reload(&gw, &dir, last);
    let errors = refusal(&gw);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("workers.yaml: error: the file is larger than 8388608 bytes"),
        "{errors:?}"
    );
    assert_eq!(gw.store.current().unwrap().generation, 1);
    std::fs::write(dir.join("workers.yaml"), model_aliases("workers.yaml")).unwrap();

    let fifo = dir.join("pipe.yaml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let (gw2, dir2) = (gw.clone(), dir.clone());
    let read = tokio::task::spawn_blocking(move || reload(&gw2, &dir2, after));
    let after = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("reading a FIFO blocked the reload")
        .unwrap();
    let errors = refusal(&gw);
    assert!(
        errors.len() == 1 && errors[0].contains("pipe.yaml: error: not a regular file"),
        "{errors:?}"
    );
    assert_eq!(gw.store.current().unwrap().generation, 1);
    std::fs::remove_file(&fifo).unwrap();
    reload(&gw, &dir, after);
    assert!(refusal(&gw).is_empty());
    assert_eq!(gw.store.current().unwrap().generation, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A directory whose files are gone (all deleted before new ones are written, or the mount
/// replaced) is no bundle without resources: applying it would drop every route. It is
/// refused as `kinfctl lint` refuses it; so is a `*.yaml` link whose target is gone. The
/// files back, the refusal clears.
#[tokio::test]
async fn a_directory_left_without_policy_files_or_with_a_dangling_link_is_refused() {
    let (dir, gw, last) = applied("emptied");
    for f in ["policy.yaml", "workers.yaml"] {
        std::fs::rename(dir.join(f), dir.join(format!("{f}.bak"))).unwrap();
    }
    let after = reload(&gw, &dir, last);
    let errors = refusal(&gw);
    assert!(
        errors.len() == 1 && errors[0].contains("no policy files found"),
        "{errors:?}"
    );
    assert_eq!(gw.store.current().unwrap().generation, 1, "nothing applied");
    assert_eq!(refused_gauge(&gw), 1.0);

    for f in ["policy.yaml", "workers.yaml"] {
        std::fs::rename(dir.join(format!("{f}.bak")), dir.join(f)).unwrap();
    }
    std::os::unix::fs::symlink(dir.join("gone.yaml"), dir.join("extra.yaml")).unwrap();
    let after = reload(&gw, &dir, after);
    let errors = refusal(&gw);
    assert!(
        errors.len() == 1
            && errors[0].starts_with(&format!(
                "{}: error: cannot read the file",
                dir.join("extra.yaml").display()
            )),
        "{errors:?}"
    );
    assert_eq!(gw.store.current().unwrap().generation, 1);

    std::fs::remove_file(dir.join("extra.yaml")).unwrap();
    let after = reload(&gw, &dir, after);
    assert!(refusal(&gw).is_empty());
    assert_eq!(refused_gauge(&gw), 0.0);
    assert_eq!(gw.store.current().unwrap().generation, 1);

    // A link back up the tree: the directory is read once (it listed every file again at each
    // level of `loop/loop/...` until the path no longer resolved: each resource defined dozens
    // of times).
    std::os::unix::fs::symlink(".", dir.join("loop")).unwrap();
    reload(&gw, &dir, after);
    assert!(refusal(&gw).is_empty(), "{:?}", refusal(&gw));
    assert_eq!(refused_gauge(&gw), 0.0);
    assert_eq!(gw.store.current().unwrap().generation, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls every 5 ms, as `kinference serve --reload-interval 5ms` would.
const FAST: Duration = Duration::from_millis(5);

fn watch(gw: &Arc<Gateway>, dir: &Path, last: Option<u64>) -> tokio::task::JoinHandle<()> {
    kinf_handler::serve::watch_directory(gw.clone(), dir.to_path_buf(), FAST, last, no_ingestion())
}

/// Waits until `done` holds, for at most 10 s.
async fn until(mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// A file saved by truncating it and then writing it, or by deleting it and writing it anew,
/// is empty or missing for a moment; a poll in that moment saw a bundle without that file's
/// resources, which was applied (every route of the file dropped) or refused, and applied again
/// a poll later. Only content that reads the same once settled is applied now; two quick edits
/// in a row end with the second in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_save_caught_midway_is_not_applied() {
    let (dir, gw, last) = applied("midway");
    let watcher = watch(&gw, &dir, last);
    let workers = dir.join("workers.yaml");
    let text = model_aliases("workers.yaml");
    // How long the file was caught midway, at the longest: on a machine loaded enough to hold
    // this task up for most of the settle time, a midway state may truly have lasted it.
    let mut longest_gap = Duration::ZERO;
    for round in 0..12 {
        let gap = std::time::Instant::now();
        if round % 2 == 0 {
            // Truncate, then write.
            std::fs::write(&workers, "").unwrap();
        } else {
            std::fs::remove_file(&workers).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
        std::fs::write(&workers, &text).unwrap();
        longest_gap = longest_gap.max(gap.elapsed());
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    if longest_gap < kinf_handler::bundle::SETTLE * 4 / 5 {
        assert_eq!(
            (
                gw.store.current().unwrap().generation,
                reloads(&gw, "applied"),
                reloads(&gw, "refused"),
            ),
            (1, 1.0, 0.0),
            "a half-saved bundle was applied or refused: {:?}",
            refusal(&gw)
        );
    } else {
        // Held up: only the end state can be asserted, the whole file in force.
        eprintln!("midway check skipped: a midway state lasted {longest_gap:?}");
        assert!(
            until(|| refusal(&gw).is_empty()
                && gw
                    .store
                    .current()
                    .unwrap()
                    .sources
                    .iter()
                    .any(|(_, f)| { f.name.ends_with("workers.yaml") && *f.text == *text }))
            .await,
            "{:?}",
            refusal(&gw)
        );
    }

    // Two edits in quick succession: the second is in force at the end.
    let edit = |model: &str| {
        let policy = model_aliases("policy.yaml").replace(
            "- name: fastest-standard-model",
            &format!("- name: {model}"),
        );
        std::fs::write(dir.join("policy.yaml"), policy).unwrap();
    };
    edit("first-edit");
    tokio::time::sleep(Duration::from_millis(20)).await;
    edit("second-edit");
    let has = |gw: &Gateway, s: &str| {
        gw.store
            .current()
            .unwrap()
            .sources
            .iter()
            .any(|(_, f)| f.text.contains(s))
    };
    assert!(
        until(|| has(&gw, "second-edit")).await,
        "the second edit never came into force"
    );
    assert!(refusal(&gw).is_empty());
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Kubernetes ConfigMap volume: each key is a link `key -> ..data/key`, `..data` a link to a
/// timestamped directory, swapped by renaming a new link over it; the links of keys added come
/// after the swap. The dot entries are not read; a poll between the swap and the new key's link
/// saw the new policy without the worker set it names (refused, then applied). Now the edit is
/// applied once, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_symlink_swap_is_applied_once_whole() {
    use std::os::unix::fs::symlink;
    let dir = temp_dir("configmap");
    let data = |version: &str, files: &[(&str, String)]| {
        let d = dir.join(format!("..2026_12_03_{version}"));
        std::fs::create_dir_all(&d).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(name), text).unwrap();
        }
        d
    };
    let v1 = data(
        "v1",
        &[
            ("policy.yaml", model_aliases("policy.yaml")),
            ("workers.yaml", model_aliases("workers.yaml")),
        ],
    );
    symlink(v1.file_name().unwrap(), dir.join("..data")).unwrap();
    for key in ["policy.yaml", "workers.yaml"] {
        symlink(Path::new("..data").join(key), dir.join(key)).unwrap();
    }
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.clone(),
        ..GatewayOptions::default()
    });
    let last = reload(&gw, &dir, None);
    let names: Vec<String> = gw
        .store
        .current()
        .unwrap()
        .sources
        .iter()
        .map(|(_, f)| f.name.clone())
        .collect();
    assert_eq!(
        names,
        [
            dir.join("policy.yaml").display().to_string(),
            dir.join("workers.yaml").display().to_string()
        ],
        "the keys, by their links' names; the dot entries are not read"
    );
    let watcher = watch(&gw, &dir, last);

    // v2: the pool moves its second destination to a worker set of a new key, `more.yaml`.
    let more = model_aliases("workers.yaml")
        .replace("glm-worker", "glm-worker-2")
        .replace("qwen-worker", "qwen-worker-2");
    let policy = model_aliases("policy.yaml").replace("name: glm-worker", "name: glm-worker-2");
    let mut held_up = false;
    for round in 0..4 {
        let (policy, more) = if round % 2 == 0 {
            (policy.clone(), more.clone())
        } else {
            (model_aliases("policy.yaml"), String::new())
        };
        let version = format!("v{}", round + 2);
        let mut files = vec![
            ("policy.yaml", policy),
            ("workers.yaml", model_aliases("workers.yaml")),
        ];
        if !more.is_empty() {
            files.push(("more.yaml", more));
        }
        let next = data(&version, &files);
        let gap = std::time::Instant::now();
        symlink(next.file_name().unwrap(), dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        // The kubelet links a new key, or unlinks a removed one, after the swap.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if round % 2 == 0 {
            symlink(Path::new("..data").join("more.yaml"), dir.join("more.yaml")).unwrap();
        } else {
            std::fs::remove_file(dir.join("more.yaml")).unwrap();
        }
        let gap = gap.elapsed();
        let generation = u64::try_from(round).unwrap() + 2;
        assert!(
            until(|| gw.store.current().unwrap().generation >= generation).await,
            "round {round}: not applied"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        held_up |= gap >= kinf_handler::bundle::SETTLE * 4 / 5;
        if held_up {
            // A machine loaded enough to hold this task up for most of the settle time: the
            // midway state may truly have settled (and been refused or applied), here or in an
            // earlier round. Only the outcome counts.
            eprintln!("round {round}: midway check skipped, a swap took {gap:?} or more");
            assert!(
                until(|| refusal(&gw).is_empty()).await,
                "round {round}: {:?}",
                refusal(&gw)
            );
            continue;
        }
        assert_eq!(
            (
                gw.store.current().unwrap().generation,
                reloads(&gw, "refused")
            ),
            (generation, 0.0),
            "round {round}: applied once, never refused: {:?}",
            refusal(&gw)
        );
    }
    watcher.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// At startup too, a file caught mid-save is not applied: the configuration is read again
/// until two reads a settle interval apart agree. Here `workers.yaml` is first written without
/// its last line (still valid YAML that compiles) and completed a moment later (5 ms: should
/// the write come before the first read, the complete file is all there is to apply); what is
/// applied is the complete file. A writer held up for most of a settle interval (a loaded
/// machine) lets the truncated file truly settle: then either outcome is right.
#[test]
fn startup_applies_a_save_only_once_it_has_settled() {
    let dir = temp_dir("startup-settle");
    std::fs::write(dir.join("policy.yaml"), model_aliases("policy.yaml")).unwrap();
    let full = model_aliases("workers.yaml");
    let cut = full.trim_end().rsplit_once('\n').unwrap().0.to_owned() + "\n";
    assert!(cut.len() < full.len());
    std::fs::write(dir.join("workers.yaml"), &cut).unwrap();
    let truncated = kinf_handler::config_dir::Watch::new(&dir).read().unwrap().1;
    let writer = {
        let (path, full) = (dir.join("workers.yaml"), full.clone());
        let started = std::time::Instant::now();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            std::fs::write(path, full).unwrap();
            // How long the truncated file stood.
            started.elapsed()
        })
    };
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.clone(),
        ..GatewayOptions::default()
    });
    let applied = reload(&gw, &dir, None);
    let stood = writer.join().unwrap();
    let complete = kinf_handler::config_dir::Watch::new(&dir).read().unwrap().1;
    assert_ne!(truncated, complete);
    if stood < kinf_handler::bundle::SETTLE * 4 / 5 {
        assert_eq!(applied, Some(complete), "the truncated save was applied");
    } else {
        // The writer was held up for most of the settle time: the truncated file may truly
        // have settled before the write.
        eprintln!("settle check skipped: the truncated file stood {stood:?}");
        assert!(applied == Some(complete) || applied == Some(truncated));
    }
    assert_eq!(gw.store.current().unwrap().generation, 1);
    let _ = std::fs::remove_dir_all(&dir);
}
