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
