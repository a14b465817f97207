//! A bundle that does not compile is refused and the last good policy stays in force; readers
//! holding the old policy keep a consistent view while a new one is swapped in.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;

use kinf_handler::config_dir::read_dir;
use kinf_handler::{ApplyOutcome, PolicyStore};

fn seed(name: &str) -> kinf_lang::Sources {
    read_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/policies")
            .join(name),
    )
    .unwrap()
}

#[test]
fn last_good_policy_stays_when_a_broken_bundle_arrives() {
    let store = PolicyStore::new();
    assert!(!store.is_ready());
    assert_eq!(
        store.apply(&seed("burst-to-cloud")),
        ApplyOutcome::Applied { generation: 1 }
    );
    assert_eq!(
        store.apply(&seed("burst-to-cloud")),
        ApplyOutcome::Unchanged
    );
    let held = store.current().unwrap();

    // The same bundle with a typo in the policy: refused, nothing half-applied.
    let mut broken = kinf_lang::Sources::new();
    for (_, f) in seed("burst-to-cloud").iter() {
        broken.add(
            f.name.clone(),
            f.text.replace(
                "order: [bedrock, databricks]",
                "order: [bedrok, databricks]",
            ),
        );
    }
    assert_eq!(store.apply(&broken), ApplyOutcome::Refused { errors: 1 });
    let now = store.current().unwrap();
    assert!(
        Arc::ptr_eq(&held.policy, &now.policy),
        "the last good policy stays in force"
    );
    let rej = store.last_rejected().unwrap();
    assert_eq!(rej.codes, vec!["KINF0302"]);
    assert!(
        rej.errors[0].contains("policy.yaml:19:"),
        "{}",
        rej.errors[0]
    );
    assert!(
        rej.errors[0].contains("did you mean `bedrock`?"),
        "{}",
        rej.errors[0]
    );

    // Fixed: applied as generation 2, the refusal is cleared; the old reader still has gen 1.
    assert_eq!(
        store.apply(&seed("pii-stays-local")),
        ApplyOutcome::Applied { generation: 2 }
    );
    assert!(store.last_rejected().is_none());
    assert_eq!(held.generation, 1);
    assert_eq!(store.current().unwrap().generation, 2);
}

#[test]
fn unreadable_directory_is_an_error_naming_the_path() {
    let err = read_dir(Path::new("/nonexistent/kinference")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/kinference"), "{err}");
}

/// A refusal made outside the compiler (directory mode: a bundle refused for an API key file)
/// is recorded in the store, so that every reader of `last_rejected` sees it; the policy in
/// force stays, and the refusal is cleared like any other when a bundle compiles.
#[test]
fn a_refusal_recorded_beside_the_compiler_is_the_stores_last_refusal() {
    let store = PolicyStore::new();
    store.apply(&seed("burst-to-cloud"));
    let held = store.current().unwrap();
    store.record_refusal(kinf_handler::policy_store::Rejected {
        fingerprint: 7,
        errors: vec!["keys.txt: line 2: expected `tenant: key`".into()],
        codes: Vec::new(),
        namespaces: None,
    });
    let rej = store.last_rejected().unwrap();
    assert_eq!(rej.errors, ["keys.txt: line 2: expected `tenant: key`"]);
    assert!(rej.codes.is_empty() && rej.namespaces.is_none());
    assert!(Arc::ptr_eq(&held, &store.current().unwrap()));
    assert_eq!(
        store.apply(&seed("burst-to-cloud")),
        ApplyOutcome::Unchanged
    );
    assert!(
        store.last_rejected().is_none(),
        "cleared by a bundle that compiles"
    );
}

/// Directory mode's API key files count in the policy's fingerprint as Secret values do in
/// Kubernetes mode: the same content is `Unchanged`, new content is a new generation (also when
/// the policy in force is applied again while a bundle is refused); no key file named leaves
/// the fingerprint of the sources alone.
#[test]
fn api_key_files_count_in_the_fingerprint_so_an_edit_is_a_new_generation() {
    use kinf_handler::bundle::Resolved;
    use kinf_handler::tenants::identity::KeyFiles;

    let dir = std::env::temp_dir().join(format!("kinf-store-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let with_keys = |text: &str| {
        std::fs::write(dir.join("keys.txt"), text).unwrap();
        Resolved {
            key_files: Some(Arc::new(KeyFiles::read(&dir, ["keys.txt".to_owned()]))),
            ..Resolved::default()
        }
    };
    let store = PolicyStore::new();
    let bundle = seed("burst-to-cloud");
    let plain = kinf_lang::compile(&bundle).policy.unwrap().fingerprint;
    let (outcome, _) = store.apply_resolved(&bundle, &with_keys("team-a: sk-1\n"));
    assert_eq!(outcome, ApplyOutcome::Applied { generation: 1 });
    let first = store.current().unwrap().fingerprint;
    assert_ne!(first, plain);
    assert_eq!(
        store
            .apply_resolved(&bundle, &with_keys("team-a: sk-1\n"))
            .0,
        ApplyOutcome::Unchanged,
        "the same key files: nothing to apply"
    );
    assert_eq!(
        store
            .apply_resolved(&bundle, &with_keys("team-a: sk-1\nteam-b: sk-2\n"))
            .0,
        ApplyOutcome::Applied { generation: 2 },
        "a key added"
    );
    assert!(![first, plain].contains(&store.current().unwrap().fingerprint));
    // Re-applying the policy in force (its bundle's successor refused) follows the key files.
    assert_eq!(
        store.reapply_in_force(&with_keys("team-b: sk-2\n")),
        Some(ApplyOutcome::Applied { generation: 3 })
    );
    assert_eq!(
        store.reapply_in_force(&with_keys("team-b: sk-2\n")),
        Some(ApplyOutcome::Unchanged)
    );
    // No key file named: the sources' fingerprint alone.
    let none = Resolved {
        key_files: Some(Arc::new(KeyFiles::read(&dir, Vec::new()))),
        ..Resolved::default()
    };
    assert_eq!(
        store.apply_resolved(&bundle, &none).0,
        ApplyOutcome::Applied { generation: 4 }
    );
    assert_eq!(store.current().unwrap().fingerprint, plain);
    let _ = std::fs::remove_dir_all(&dir);
}
