//! Tenant identity: API keys, the trusted header, the default tenant.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use kinf_handler::tenants::identity::{hash_for_file, parse_key_file};
use kinf_handler::tenants::{IdentityError, TenantResolver};
use kinf_policy::{ApiKeySource, TenantIdentity};

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn keys() -> Vec<(String, String)> {
    vec![
        ("team-a".into(), "sk-alpha-123".into()),
        ("team-b".into(), hash_for_file("sk-bravo-456")),
    ]
}

fn tenant(r: Result<Option<Arc<str>>, IdentityError>) -> Option<String> {
    r.unwrap().map(|t| t.to_string())
}

#[test]
fn bearer_and_x_api_key_resolve() {
    let r = TenantResolver::from_keys(keys()).unwrap();
    assert_eq!(
        tenant(r.resolve(&headers(&[("authorization", "Bearer sk-alpha-123")]))),
        Some("team-a".into())
    );
    assert_eq!(
        tenant(r.resolve(&headers(&[("authorization", "bearer  sk-bravo-456 ")]))),
        Some("team-b".into())
    );
    assert_eq!(
        tenant(r.resolve(&headers(&[("x-api-key", "sk-bravo-456")]))),
        Some("team-b".into())
    );
    // Both headers with the same key: fine; with different keys: refused.
    assert_eq!(
        tenant(r.resolve(&headers(&[
            ("authorization", "Bearer sk-alpha-123"),
            ("x-api-key", "sk-alpha-123")
        ]))),
        Some("team-a".into())
    );
    assert_eq!(
        r.resolve(&headers(&[
            ("authorization", "Bearer sk-alpha-123"),
            ("x-api-key", "sk-bravo-456")
        ])),
        Err(IdentityError::Conflict)
    );
}

#[test]
fn unknown_key_is_401_and_never_the_default() {
    let r = TenantResolver::from_keys(keys())
        .unwrap()
        .with_default_tenant("anonymous");
    let err = r
        .resolve(&headers(&[("authorization", "Bearer sk-nope-999")]))
        .unwrap_err();
    assert_eq!(err, IdentityError::InvalidKey);
    assert_eq!(err.status(), 401);
    assert!(!err.to_string().contains("sk-nope-999"), "{err}");
    let err = r
        .resolve(&headers(&[("x-api-key", "sk-nope-999")]))
        .unwrap_err();
    assert_eq!(err, IdentityError::InvalidKey);
    // Basic auth is not a key.
    let err = r
        .resolve(&headers(&[("authorization", "Basic c2stYWxwaGEtMTIz")]))
        .unwrap_err();
    assert_eq!(err.status(), 401);
    assert!(!err.to_string().contains("c2stYWxwaGEtMTIz"));
}

#[test]
fn missing_key_gets_default_tenant_or_401() {
    let r = TenantResolver::from_keys(keys()).unwrap();
    assert_eq!(
        r.resolve(&HeaderMap::new()),
        Err(IdentityError::MissingCredentials)
    );
    assert_eq!(IdentityError::MissingCredentials.status(), 401);
    let r = r.with_default_tenant("anonymous");
    assert_eq!(
        tenant(r.resolve(&HeaderMap::new())),
        Some("anonymous".into())
    );
}

#[test]
fn untrusted_header_is_ignored() {
    // No trustedHeader configured: a client naming its tenant in a header gets nothing from it.
    let r = TenantResolver::from_keys(keys())
        .unwrap()
        .with_default_tenant("anonymous");
    for name in ["x-tenant-id", "x-kinference-tenant", "x-tenant"] {
        assert_eq!(
            tenant(r.resolve(&headers(&[(name, "team-a")]))),
            Some("anonymous".into()),
            "{name}"
        );
        assert_eq!(
            tenant(r.resolve(&headers(&[
                (name, "team-a"),
                ("authorization", "Bearer sk-bravo-456")
            ]))),
            Some("team-b".into()),
            "{name}"
        );
    }
    let strict = TenantResolver::from_keys(keys()).unwrap();
    assert_eq!(
        strict.resolve(&headers(&[("x-tenant-id", "team-a")])),
        Err(IdentityError::MissingCredentials)
    );
}

#[test]
fn trusted_header_is_honoured_only_when_configured() {
    let spec = TenantIdentity {
        api_keys: None,
        trusted_header: Some("X-Tenant-Id".into()),
        default_tenant: None,
    };
    let r = TenantResolver::from_spec(&spec, std::path::Path::new(".")).unwrap();
    assert_eq!(
        tenant(r.resolve(&headers(&[("x-tenant-id", "team-z")]))),
        Some("team-z".into())
    );
    // Another header name is not the trusted one.
    assert_eq!(
        r.resolve(&headers(&[("x-tenant", "team-z")])),
        Err(IdentityError::MissingCredentials)
    );
    // Keys are ignored when apiKeys is not configured.
    assert_eq!(
        tenant(r.resolve(&headers(&[
            ("x-tenant-id", "team-z"),
            ("authorization", "Bearer whatever")
        ]))),
        Some("team-z".into())
    );
}

#[test]
fn forged_header_with_another_tenants_key_is_refused() {
    let r = TenantResolver::from_keys(keys())
        .unwrap()
        .with_trusted_header(HeaderName::from_static("x-tenant-id"));
    // The key says team-a, the header says team-b.
    assert_eq!(
        r.resolve(&headers(&[
            ("authorization", "Bearer sk-alpha-123"),
            ("x-tenant-id", "team-b")
        ])),
        Err(IdentityError::Conflict)
    );
    // Agreeing: fine.
    assert_eq!(
        tenant(r.resolve(&headers(&[
            ("authorization", "Bearer sk-alpha-123"),
            ("x-tenant-id", "team-a")
        ]))),
        Some("team-a".into())
    );
    // An unknown key is refused even with a trusted header.
    assert_eq!(
        r.resolve(&headers(&[
            ("authorization", "Bearer sk-forged"),
            ("x-tenant-id", "team-a")
        ])),
        Err(IdentityError::InvalidKey)
    );
}

#[test]
fn a_credential_header_sent_twice_with_different_values_is_refused() {
    let r = TenantResolver::from_keys(keys())
        .unwrap()
        .with_trusted_header(HeaderName::from_static("x-tenant-id"));
    // A proxy that appends its header after the client's: the client's must not decide, and
    // must not slip past the key check by coming second.
    for pairs in [
        &[("x-tenant-id", "team-q"), ("x-tenant-id", "team-z")][..],
        &[
            ("authorization", "Bearer sk-bravo-456"),
            ("x-tenant-id", "team-b"),
            ("x-tenant-id", "team-a"),
        ][..],
        &[
            ("authorization", "Bearer sk-alpha-123"),
            ("authorization", "Bearer sk-bravo-456"),
        ][..],
        &[("x-api-key", "sk-alpha-123"), ("x-api-key", "sk-bravo-456")][..],
    ] {
        assert_eq!(
            r.resolve(&headers(pairs)),
            Err(IdentityError::Conflict),
            "{pairs:?}"
        );
    }
    // The same value twice names one tenant.
    assert_eq!(
        tenant(r.resolve(&headers(&[
            ("x-tenant-id", "team-a"),
            ("x-tenant-id", " team-a")
        ]))),
        Some("team-a".into())
    );
}

#[test]
fn key_file_from_spec() {
    let dir = std::env::temp_dir().join(format!("kinf-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.txt");
    std::fs::write(
        &file,
        format!(
            "# tenants\n\nteam-a: sk-alpha-123\nteam-b: {}\nteam-a: sk-alpha-second\n",
            hash_for_file("sk-bravo-456")
        ),
    )
    .unwrap();
    let spec = TenantIdentity {
        api_keys: Some(ApiKeySource {
            secret_ref: None,
            file: Some("keys.txt".into()),
        }),
        trusted_header: None,
        default_tenant: Some("anonymous".into()),
    };
    let r = TenantResolver::from_spec(&spec, &dir).unwrap();
    assert_eq!(r.key_count(), 3);
    for (key, t) in [
        ("sk-alpha-123", "team-a"),
        ("sk-alpha-second", "team-a"),
        ("sk-bravo-456", "team-b"),
    ] {
        assert_eq!(
            tenant(r.resolve(&headers(&[("x-api-key", key)]))),
            Some(t.into())
        );
    }
    // The hashed form itself is not a key.
    let hashed = hash_for_file("sk-bravo-456");
    assert_eq!(
        r.resolve(&headers(&[("x-api-key", &hashed)])),
        Err(IdentityError::InvalidKey)
    );
    // Errors name the line, never the key.
    let err = parse_key_file("team-a: sk-ok\nno colon here sk-secret\n").unwrap_err();
    assert!(
        err.contains("line 2") && !err.contains("sk-secret"),
        "{err}"
    );
    let err = parse_key_file("team-a: sha256:abc\n").unwrap_err();
    assert!(err.contains("line 1"), "{err}");
    // The same key for two tenants is refused.
    let err = TenantResolver::from_keys(vec![("a".into(), "k".into()), ("b".into(), "k".into())])
        .unwrap_err();
    assert!(
        err.contains("same API key") && !err.contains(": k"),
        "{err}"
    );
    // A missing file is an error naming the file.
    let err = TenantResolver::from_spec(&spec, &dir.join("nowhere")).unwrap_err();
    assert!(err.contains("keys.txt"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_key_shared_by_two_tenants_in_the_key_file_names_both_lines_never_the_key() {
    // Plain on line 2, hashed on line 4: the same key either way.
    let text = format!(
        "# tenants\nteam-a: sk-shared-9f1\nteam-a: sk-other\nteam-b: {}\n",
        hash_for_file("sk-shared-9f1")
    );
    let err = parse_key_file(&text).unwrap_err();
    assert!(
        err.contains("line 4") && err.contains("line 2") && err.contains("team-a"),
        "{err}"
    );
    assert!(
        !err.contains("sk-shared") && !err.contains("sha256"),
        "{err}"
    );
    // Through the front door's spec: the file's path, then the lines.
    let dir = std::env::temp_dir().join(format!("kinf-tenants-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("keys.txt"), &text).unwrap();
    let spec = TenantIdentity {
        api_keys: Some(ApiKeySource {
            secret_ref: None,
            file: Some("keys.txt".into()),
        }),
        trusted_header: None,
        default_tenant: None,
    };
    let err = TenantResolver::from_spec(&spec, &dir).unwrap_err();
    assert!(err.contains("keys.txt: line 4"), "{err}");
    // One tenant listing the same key twice is harmless.
    assert_eq!(
        parse_key_file("team-a: sk-1\nteam-a: sk-1\n").map(|v| v.len()),
        Ok(2)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_identity_configured_is_anonymous() {
    let r =
        TenantResolver::from_spec(&TenantIdentity::default(), std::path::Path::new(".")).unwrap();
    assert_eq!(r.resolve(&HeaderMap::new()), Ok(None));
    assert_eq!(r.resolve(&headers(&[("x-tenant-id", "team-a")])), Ok(None));
}

#[test]
fn constant_time_compare_is_used() {
    // Keys are compared as SHA-256 hashes with `subtle`'s constant-time equality over every
    // entry (no early exit); no plain `==` on key material.
    let src = include_str!("../src/tenants/identity.rs");
    let lookup = src
        .split("fn lookup(")
        .nth(1)
        .and_then(|s| s.split("\n    }\n").next())
        .unwrap();
    assert!(lookup.contains("ct_eq"), "lookup must use ct_eq");
    assert!(lookup.contains("conditional_select"));
    assert!(!lookup.contains("return"), "lookup must not exit early");
    assert!(!lookup.contains(" == "), "lookup must not compare with ==");
}

/// `anonymous` labels the metrics of requests without a tenant: a tenant holding API keys may
/// not be named so (it would be counted with them). `defaultTenant: anonymous` and a trusted
/// header naming it stay allowed: both mean unidentified traffic.
#[test]
fn a_tenant_with_api_keys_cannot_be_named_anonymous() {
    // A key file's line, named by its number.
    let e = parse_key_file("team-a: sk-1\nanonymous: sk-2\n").unwrap_err();
    assert!(
        e.starts_with("line 2: tenant name `anonymous` is reserved"),
        "{e}"
    );
    assert!(!e.contains("sk-2"), "never the key: {e}");
    // A Secret's entries (its keys are tenant names).
    let e = TenantResolver::from_keys(vec![("anonymous".into(), "sk-3".into())])
        .err()
        .unwrap();
    assert!(e.contains("`anonymous` is reserved"), "{e}");
    // Other names, `Anonymous` included, are tenants like any other.
    let r = TenantResolver::from_keys(vec![("Anonymous".into(), "sk-4".into())]).unwrap();
    assert_eq!(
        tenant(r.resolve(&headers(&[("x-api-key", "sk-4")]))),
        Some("Anonymous".into())
    );
    // The default tenant may be `anonymous`.
    let spec = TenantIdentity {
        api_keys: None,
        trusted_header: None,
        default_tenant: Some("anonymous".into()),
    };
    let r = TenantResolver::from_spec(&spec, std::path::Path::new(".")).unwrap();
    assert_eq!(tenant(r.resolve(&headers(&[]))), Some("anonymous".into()));
}
