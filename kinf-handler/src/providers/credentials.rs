//! Provider credentials: resolved from a [`CredentialRef`] through a [`CredentialSource`], held in
//! [`Secret`]s whose `Debug` and `Display` never show the value.

use std::fmt;
use std::sync::Arc;

use kinf_lang::compiled::CredentialRef;

/// A secret value. `Debug` and `Display` print `***`; only [`Secret::expose`] gives the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<str>);

impl Secret {
    /// Wraps a value (surrounding whitespace and a trailing newline are removed).
    pub fn new(value: &str) -> Self {
        Secret(Arc::from(value.trim()))
    }

    /// The value, for building a request header or a signature. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether the value is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// AWS signing credentials (Bedrock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsCredentials {
    /// Access key id.
    pub access_key_id: Secret,
    /// Secret access key.
    pub secret_access_key: Secret,
    /// Session token of temporary credentials.
    pub session_token: Option<Secret>,
}

/// The credentials of one provider, resolved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ProviderCredentials {
    /// Requests go out without credentials.
    #[default]
    None,
    /// An API key or token (`Authorization: Bearer` for OpenAI, `x-api-key` for Anthropic).
    ApiKey(Secret),
    /// AWS SigV4 signing credentials (Bedrock).
    Aws(AwsCredentials),
}

impl ProviderCredentials {
    /// Every secret value held, to scrub them from upstream error messages.
    pub fn secret_values(&self) -> Vec<&str> {
        match self {
            ProviderCredentials::None => Vec::new(),
            ProviderCredentials::ApiKey(k) => vec![k.expose()],
            ProviderCredentials::Aws(a) => {
                let mut v = vec![a.access_key_id.expose(), a.secret_access_key.expose()];
                if let Some(t) = &a.session_token {
                    v.push(t.expose());
                }
                v
            }
        }
        .into_iter()
        .filter(|s| s.len() >= 4)
        .collect()
    }
}

/// Why credentials could not be resolved. Never carries the secret value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// The environment variable is not set (or not Unicode).
    #[error("environment variable `{0}` is not set")]
    EnvMissing(String),
    /// The file could not be read.
    #[error("credentials file `{path}` cannot be read: {reason}")]
    File {
        /// The path.
        path: String,
        /// The I/O error kind.
        reason: String,
    },
    /// A Secret reference and no Kubernetes source.
    #[error("credentials from Secret `{0}` need the Kubernetes credential source")]
    SecretUnsupported(String),
    /// The Secret or its key was not found.
    #[error("Secret `{0}` or its key was not found")]
    SecretMissing(String),
    /// `credentials.env` or `credentials.file` in Kubernetes mode, where the resources come
    /// from whoever may write them in a watched namespace: reading the controller's own
    /// environment or files for them would send those (its ServiceAccount token, other teams'
    /// keys) to the URL the same resource names.
    #[error(
        "credentials from {0} are not read in Kubernetes mode (the controller's own environment and files are not for namespace users to send to a provider URL): put the key in a Secret of the provider's namespace and use `credentials.secretRef`"
    )]
    LocalInKubernetes(String),
    /// The value is empty.
    #[error("the credentials from {0} are empty")]
    Empty(String),
    /// AWS credentials lack a field.
    #[error("AWS credentials from {0} lack `aws_access_key_id` or `aws_secret_access_key`")]
    AwsIncomplete(String),
    /// A Bedrock provider without a `secretRef` in Kubernetes mode, in a namespace the
    /// operator has not allowed to sign with the controller's own AWS identity
    /// (`--ambient-aws-credentials`).
    #[error(
        "the controller's own AWS credentials (`AWS_ACCESS_KEY_ID`, …) are not used for providers in namespace `{0}`: put an AWS credentials document in a Secret of that namespace and use `credentials.secretRef`, or start kinference with `--ambient-aws-credentials {0}`"
    )]
    AmbientAwsRefused(String),
}

/// Which namespaces' Bedrock providers may sign with the controller's own AWS credentials
/// (its `AWS_*` environment) in Kubernetes mode, where anyone who may write an
/// `InferenceProvider` in a watched namespace could otherwise spend that identity. Standalone
/// mode always may: one operator writes the whole configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AmbientAws {
    /// No namespace (the default).
    #[default]
    Nowhere,
    /// Every namespace (`*`).
    Everywhere,
    /// These namespaces.
    Namespaces(Vec<String>),
}

impl AmbientAws {
    /// Parses `--ambient-aws-credentials`: `*`, or namespaces separated by commas.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "*" {
            return Ok(Self::Everywhere);
        }
        let mut out = Vec::new();
        for n in s.split(',').map(str::trim) {
            let valid = !n.is_empty()
                && n.len() <= 63
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !n.starts_with('-')
                && !n.ends_with('-');
            if !valid {
                return Err(format!(
                    "`{n}` is not a namespace name (lowercase letters, digits and `-`; or `*` for every namespace)"
                ));
            }
            out.push(n.to_owned());
        }
        Ok(Self::Namespaces(out))
    }

    /// Whether providers in `namespace` may use the controller's own AWS credentials.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::Nowhere => false,
            Self::Everywhere => true,
            Self::Namespaces(v) => v.iter().any(|n| n == namespace),
        }
    }
}

/// Where secret values come from. The standalone source reads environment variables and files;
/// a Kubernetes source resolves `secretRef`s.
pub trait CredentialSource: Send + Sync {
    /// The raw value referenced by `r`, for a provider in `namespace`.
    fn resolve(&self, namespace: &str, r: &CredentialRef) -> Result<Secret, CredentialError>;

    /// One of the process's own `AWS_*` variables, for Bedrock's fallback, on behalf of a
    /// provider in `namespace` (`Ok(None)`: not set). A source may refuse it
    /// ([`CredentialError::AmbientAwsRefused`]).
    fn aws_env(&self, namespace: &str, name: &str) -> Result<Option<Secret>, CredentialError> {
        let _ = namespace;
        Ok(std::env::var(name).ok().map(|v| Secret::new(&v)))
    }
}

/// Standalone mode: `env` and `file` references; `secretRef` is refused.
#[derive(Clone, Copy, Debug, Default)]
pub struct StandaloneCredentials;

impl CredentialSource for StandaloneCredentials {
    fn resolve(&self, _namespace: &str, r: &CredentialRef) -> Result<Secret, CredentialError> {
        match r {
            CredentialRef::Env(name) => std::env::var(&**name)
                .map(|v| Secret::new(&v))
                .map_err(|_| CredentialError::EnvMissing(name.to_string())),
            // Through the policy reader's guard: a FIFO would block, a huge file exhaust
            // memory.
            CredentialRef::File(path) => {
                crate::config_dir::read_text(std::path::Path::new(&**path))
                    .map(|v| Secret::new(&v))
                    .map_err(|e| CredentialError::File {
                        path: path.to_string(),
                        reason: match e {
                            crate::config_dir::ConfigDirError::Read { source, .. } => {
                                source.kind().to_string()
                            }
                            other => other.reason(),
                        },
                    })
            }
            CredentialRef::Secret { name, key } => {
                Err(CredentialError::SecretUnsupported(format!("{name}/{key}")))
            }
        }
    }
}

fn describe(r: &CredentialRef) -> String {
    match r {
        CredentialRef::Env(n) => format!("environment variable `{n}`"),
        CredentialRef::File(p) => format!("file `{p}`"),
        CredentialRef::Secret { name, key } => format!("Secret `{name}` key `{key}`"),
    }
}

/// Resolves an API key (OpenAI, Anthropic).
pub fn resolve_api_key(
    source: &dyn CredentialSource,
    namespace: &str,
    r: Option<&CredentialRef>,
) -> Result<ProviderCredentials, CredentialError> {
    let Some(r) = r else {
        return Ok(ProviderCredentials::None);
    };
    let s = source.resolve(namespace, r)?;
    if s.is_empty() {
        return Err(CredentialError::Empty(describe(r)));
    }
    Ok(ProviderCredentials::ApiKey(s))
}

/// Resolves AWS credentials (Bedrock). With a reference, its value is a credentials document
/// (see [`parse_aws_document`]); an `env` reference to `AWS_ACCESS_KEY_ID` itself reads the
/// standard trio. Without one, the standard variables `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` are read, if the source allows it for
/// `namespace` ([`CredentialSource::aws_env`]).
pub fn resolve_aws(
    source: &dyn CredentialSource,
    namespace: &str,
    r: Option<&CredentialRef>,
) -> Result<ProviderCredentials, CredentialError> {
    let standard = || -> Result<ProviderCredentials, CredentialError> {
        let id = source
            .aws_env(namespace, "AWS_ACCESS_KEY_ID")?
            .ok_or_else(|| CredentialError::EnvMissing("AWS_ACCESS_KEY_ID".into()))?;
        let secret = source
            .aws_env(namespace, "AWS_SECRET_ACCESS_KEY")?
            .ok_or_else(|| CredentialError::EnvMissing("AWS_SECRET_ACCESS_KEY".into()))?;
        Ok(ProviderCredentials::Aws(AwsCredentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: source
                .aws_env(namespace, "AWS_SESSION_TOKEN")?
                .filter(|t| !t.is_empty()),
        }))
    };
    match r {
        None => standard(),
        Some(CredentialRef::Env(n)) if &**n == "AWS_ACCESS_KEY_ID" => standard(),
        Some(r) => {
            let doc = source.resolve(namespace, r)?;
            parse_aws_document(doc.expose())
                .map(ProviderCredentials::Aws)
                .ok_or_else(|| CredentialError::AwsIncomplete(describe(r)))
        }
    }
}

/// Parses an AWS credentials document: either JSON
/// `{"accessKeyId": …, "secretAccessKey": …, "sessionToken": …}` (also `AccessKeyId`,
/// `SecretAccessKey`, `SessionToken` as `aws sts` prints them) or `key = value` lines with keys
/// `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token` (case-insensitive; the
/// `~/.aws/credentials` format; `[section]` lines and `#` comments ignored; `export ` prefixes
/// and quotes allowed, so an env file works too).
pub fn parse_aws_document(doc: &str) -> Option<AwsCredentials> {
    let (mut id, mut secret, mut token) = (None, None, None);
    if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(doc) {
        let m = m
            .get("Credentials")
            .and_then(|c| c.as_object())
            .unwrap_or(&m);
        for (k, v) in m {
            let Some(v) = v.as_str() else { continue };
            match k.to_ascii_lowercase().as_str() {
                "accesskeyid" | "aws_access_key_id" => id = Some(Secret::new(v)),
                "secretaccesskey" | "aws_secret_access_key" => secret = Some(Secret::new(v)),
                "sessiontoken" | "aws_session_token" => token = Some(Secret::new(v)),
                _ => {}
            }
        }
    } else {
        for line in doc.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('[') {
                continue;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let v = v.trim().trim_matches('"').trim_matches('\'');
            match k.trim().to_ascii_lowercase().as_str() {
                "aws_access_key_id" => id = Some(Secret::new(v)),
                "aws_secret_access_key" => secret = Some(Secret::new(v)),
                "aws_session_token" => token = Some(Secret::new(v)),
                _ => {}
            }
        }
    }
    let (id, secret) = (id?, secret?);
    if id.is_empty() || secret.is_empty() {
        return None;
    }
    Some(AwsCredentials {
        access_key_id: id,
        secret_access_key: secret,
        session_token: token.filter(|t| !t.is_empty()),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_redact() {
        let s = Secret::new("sk-very-secret\n");
        assert_eq!(s.expose(), "sk-very-secret");
        assert!(!format!("{s:?} {s}").contains("very-secret"));
        let c = ProviderCredentials::Aws(AwsCredentials {
            access_key_id: Secret::new("AKIAXXXX"),
            secret_access_key: Secret::new("topsecret"),
            session_token: Some(Secret::new("tok")),
        });
        let d = format!("{c:?}");
        assert!(!d.contains("AKIAXXXX") && !d.contains("topsecret") && !d.contains("tok\""));
    }

    #[test]
    fn credential_files_must_be_small_regular_files() {
        let dir = std::env::temp_dir().join(format!("kinf-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let resolve = |p: &std::path::Path| {
            StandaloneCredentials.resolve(
                "default",
                &CredentialRef::File(p.display().to_string().into()),
            )
        };
        let good = dir.join("key");
        std::fs::write(&good, "sk-1\n").unwrap();
        assert_eq!(resolve(&good).unwrap().expose(), "sk-1");
        // A FIFO would block the reader until someone writes to it.
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = resolve(&fifo).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // A huge file (sparse: nothing is written) is not read into memory.
        let huge = dir.join("huge");
        std::fs::File::create(&huge)
            .unwrap()
            .set_len(crate::config_dir::MAX_FILE_BYTES + 1)
            .unwrap();
        let e = resolve(&huge).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        // Missing: the I/O error's kind, as before.
        let e = resolve(&dir.join("none")).unwrap_err().to_string();
        assert!(e.contains("not found"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn aws_documents() {
        let ini = "[default]\naws_access_key_id = AKID\naws_secret_access_key=SECRET\n# c\n";
        let a = parse_aws_document(ini);
        assert!(
            a.as_ref()
                .is_some_and(|a| a.access_key_id.expose() == "AKID"
                    && a.secret_access_key.expose() == "SECRET"
                    && a.session_token.is_none())
        );
        let json = r#"{"accessKeyId":"AKID","secretAccessKey":"S","sessionToken":"T"}"#;
        let a = parse_aws_document(json);
        assert!(a.is_some_and(|a| a.session_token.is_some_and(|t| t.expose() == "T")));
        assert!(parse_aws_document("aws_access_key_id=x").is_none());
        let env = "export AWS_ACCESS_KEY_ID=\"A\"\nexport AWS_SECRET_ACCESS_KEY='B'";
        assert!(parse_aws_document(env).is_some());
    }

    #[test]
    fn ambient_aws_namespaces() {
        assert_eq!(AmbientAws::parse("*"), Ok(AmbientAws::Everywhere));
        let a = AmbientAws::parse("team-a, llm").unwrap_or_default();
        assert!(a.allows("team-a") && a.allows("llm") && !a.allows("team-b"));
        assert!(!AmbientAws::default().allows("default"));
        assert!(AmbientAws::Everywhere.allows("anything"));
        for bad in ["", "a,,b", "Team", "-a", "a_b", "a,*"] {
            let e = AmbientAws::parse(bad).unwrap_err();
            assert!(e.contains("namespace name"), "{bad}: {e}");
        }
    }
}
