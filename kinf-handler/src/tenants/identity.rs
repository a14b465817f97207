//! Who is calling: the tenant of a request, from its API key or a trusted header.
//!
//! Keys are kept only as SHA-256 hashes and compared in constant time against every known key
//! (no early exit), so neither the key table nor the timing of a lookup reveals a key. Errors
//! never repeat the presented key.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use kinf_policy::TenantIdentity;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// A SHA-256 digest of an API key.
pub type KeyHash = [u8; 32];

/// Why a request's tenant could not be established.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityError {
    /// No key (and no trusted header) and no default tenant: HTTP 401.
    MissingCredentials,
    /// A key was presented that no tenant owns: HTTP 401. Never falls back to the default.
    InvalidKey,
    /// The presented credentials name different tenants (a key and the trusted header, or
    /// `Authorization` and `x-api-key` with different keys): HTTP 401.
    Conflict,
    /// A credential header is not valid text, or `Authorization` is not a `Bearer` token:
    /// HTTP 401.
    Malformed(&'static str),
}

impl IdentityError {
    /// The HTTP status to answer with (always 401).
    pub fn status(&self) -> http::StatusCode {
        http::StatusCode::UNAUTHORIZED
    }

    /// Machine-readable code for the error body.
    pub fn code(&self) -> &'static str {
        match self {
            IdentityError::MissingCredentials => "missing_api_key",
            IdentityError::InvalidKey => "invalid_api_key",
            IdentityError::Conflict => "conflicting_credentials",
            IdentityError::Malformed(_) => "invalid_api_key",
        }
    }
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::MissingCredentials => {
                f.write_str("no API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`")
            }
            IdentityError::InvalidKey => f.write_str("the API key is not valid"),
            IdentityError::Conflict => {
                f.write_str("the request's credentials name different tenants")
            }
            IdentityError::Malformed(what) => write!(f, "malformed credentials: {what}"),
        }
    }
}

impl std::error::Error for IdentityError {}

/// Resolves the tenant of a request from its headers. Built once per policy from the front
/// door's `spec.tenants`; cheap to share.
#[derive(Clone, Default)]
pub struct TenantResolver {
    /// `(hash of key, tenant)`; checked all at once, in constant time.
    keys: Vec<(KeyHash, Arc<str>)>,
    /// Whether `apiKeys` is configured at all.
    keys_configured: bool,
    /// The header naming the tenant, when configured.
    trusted_header: Option<HeaderName>,
    /// Tenant of requests without credentials.
    default_tenant: Option<Arc<str>>,
}

impl fmt::Debug for TenantResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Hashes are not secrets, but there is no reason to print them either.
        f.debug_struct("TenantResolver")
            .field("keys", &self.keys.len())
            .field("keys_configured", &self.keys_configured)
            .field("trusted_header", &self.trusted_header)
            .field("default_tenant", &self.default_tenant)
            .finish()
    }
}

impl TenantResolver {
    /// A resolver for `spec`, reading `apiKeys.file` (relative to `base_dir` unless absolute).
    /// `apiKeys.secretRef` is not read here: a caller that reads the Secret passes its entries
    /// to [`TenantResolver::from_spec_with_keys`].
    pub fn from_spec(spec: &TenantIdentity, base_dir: &Path) -> Result<Self, String> {
        Self::from_spec_with_files(spec, base_dir, None)
    }

    /// Like [`TenantResolver::from_spec`], taking `apiKeys.file` from `files` when they hold it
    /// (read ahead, so that the content checked before a bundle is applied is the content
    /// used), else reading it.
    pub fn from_spec_with_files(
        spec: &TenantIdentity,
        base_dir: &Path,
        files: Option<&KeyFiles>,
    ) -> Result<Self, String> {
        let keys = match spec.api_keys.as_ref().and_then(|k| k.file.as_deref()) {
            Some(file) => match files.and_then(|f| f.entries(file)) {
                Some(entries) => entries?,
                None => KeyFile::read(base_dir, file).entries()?,
            },
            None => Vec::new(),
        };
        Self::from_spec_with_keys(spec, keys)
    }

    /// A resolver for `spec` with the `(tenant, key)` entries given (from a Secret: its keys are
    /// tenants, its values keys, each plain or `sha256:<hex>`).
    pub fn from_spec_with_keys(
        spec: &TenantIdentity,
        keys: Vec<(String, String)>,
    ) -> Result<Self, String> {
        let mut r = Self::from_keys(keys)?;
        r.keys_configured = spec.api_keys.is_some();
        r.trusted_header = match &spec.trusted_header {
            Some(h) => Some(
                HeaderName::from_bytes(h.trim().to_ascii_lowercase().as_bytes())
                    .map_err(|_| format!("trustedHeader `{h}` is not a valid header name"))?,
            ),
            None => None,
        };
        r.default_tenant = spec.default_tenant.as_deref().map(Arc::from);
        Ok(r)
    }

    /// A resolver that knows only these `(tenant, key)` pairs; a key is plain text or
    /// `sha256:<64 hex digits>`. No trusted header, no default tenant.
    pub fn from_keys(keys: Vec<(String, String)>) -> Result<Self, String> {
        let mut out: Vec<(KeyHash, Arc<str>)> = Vec::with_capacity(keys.len());
        for (i, (tenant, key)) in keys.into_iter().enumerate() {
            let tenant = tenant.trim();
            if tenant.is_empty() {
                return Err(format!("entry {}: empty tenant name", i + 1));
            }
            reserved_tenant_name(tenant)?;
            let hash = key_hash(&key).map_err(|e| format!("tenant `{tenant}`: {e}"))?;
            if let Some((_, other)) = out.iter().find(|(h, _)| bool::from(h.ct_eq(&hash))) {
                if &**other != tenant {
                    return Err(format!(
                        "tenants `{other}` and `{tenant}` have the same API key"
                    ));
                }
                continue;
            }
            out.push((hash, Arc::from(tenant)));
        }
        Ok(TenantResolver {
            keys_configured: true,
            keys: out,
            trusted_header: None,
            default_tenant: None,
        })
    }

    /// Sets the trusted header (builder style; tests and callers without a spec).
    pub fn with_trusted_header(mut self, name: HeaderName) -> Self {
        self.trusted_header = Some(name);
        self
    }

    /// Sets the default tenant (builder style).
    pub fn with_default_tenant(mut self, tenant: &str) -> Self {
        self.default_tenant = Some(Arc::from(tenant));
        self
    }

    /// Number of distinct keys known.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The tenant of a request. `Ok(None)` only when nothing identifies the request and no
    /// default tenant is needed because identity is not configured at all (no `apiKeys`, no
    /// `trustedHeader`, no `defaultTenant`): such a front door serves anonymous requests.
    ///
    /// Rules, in order:
    /// 1. The key is `Authorization: Bearer KEY`, else `x-api-key: KEY`. When both are sent they
    ///    must carry the same key.
    /// 2. With `apiKeys` configured, a presented key must be known ([`IdentityError::InvalidKey`]
    ///    otherwise, never the default tenant). Without `apiKeys`, keys are ignored.
    /// 3. The trusted header is read only when configured. If it and a key both name a tenant,
    ///    they must agree ([`IdentityError::Conflict`]).
    /// 4. Nothing presented: the default tenant, else [`IdentityError::MissingCredentials`]
    ///    (unless identity is not configured at all).
    pub fn resolve(&self, headers: &HeaderMap) -> Result<Option<Arc<str>>, IdentityError> {
        let from_key = if self.keys_configured {
            match presented_key(headers)? {
                Some(key) => Some(self.lookup(key).ok_or(IdentityError::InvalidKey)?),
                None => None,
            }
        } else {
            None
        };
        let from_header = match &self.trusted_header {
            Some(name) => match single(headers, name.as_str())? {
                Some(v) => {
                    let v = v
                        .to_str()
                        .map_err(|_| IdentityError::Malformed("trusted tenant header"))?
                        .trim();
                    (!v.is_empty()).then(|| Arc::<str>::from(v))
                }
                None => None,
            },
            None => None,
        };
        match (from_key, from_header) {
            (Some(k), Some(h)) if k != h => Err(IdentityError::Conflict),
            (Some(k), _) => Ok(Some(k)),
            (None, Some(h)) => Ok(Some(h)),
            (None, None) => match &self.default_tenant {
                Some(d) => Ok(Some(d.clone())),
                None if !self.keys_configured && self.trusted_header.is_none() => Ok(None),
                None => Err(IdentityError::MissingCredentials),
            },
        }
    }

    /// The tenant owning `key`, comparing its hash with every known hash in constant time.
    fn lookup(&self, key: &str) -> Option<Arc<str>> {
        let hash: KeyHash = Sha256::digest(key.as_bytes()).into();
        let mut found = subtle::Choice::from(0u8);
        let mut index = 0u32;
        for (i, (h, _)) in self.keys.iter().enumerate() {
            let eq = h.ct_eq(&hash);
            found |= eq;
            let i = u32::try_from(i).unwrap_or(u32::MAX);
            index = u32::conditional_select(&index, &i, eq);
        }
        if bool::from(found) {
            self.keys.get(index as usize).map(|(_, t)| t.clone())
        } else {
            None
        }
    }
}

/// Refuses the tenant name [`ANONYMOUS`](crate::accounting::ANONYMOUS) for a tenant that holds
/// API keys: that name labels the metrics of requests without a tenant, and a keyed tenant of
/// that name would be counted with them. (`defaultTenant: anonymous` and a trusted header
/// naming it are allowed: both mean unidentified traffic, which is what the label says.)
fn reserved_tenant_name(tenant: &str) -> Result<(), String> {
    if tenant == crate::accounting::ANONYMOUS {
        return Err(format!(
            "tenant name `{tenant}` is reserved for requests without credentials (it labels \
             their metrics); a tenant with API keys needs another name"
        ));
    }
    Ok(())
}

/// The key a request presents, if any.
fn presented_key(headers: &HeaderMap) -> Result<Option<&str>, IdentityError> {
    let bearer = match single(headers, "authorization")? {
        Some(v) => {
            let v = v
                .to_str()
                .map_err(|_| IdentityError::Malformed("Authorization header"))?
                .trim();
            let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
            if !scheme.eq_ignore_ascii_case("bearer") || rest.trim().is_empty() {
                return Err(IdentityError::Malformed(
                    "Authorization must be `Bearer KEY`",
                ));
            }
            Some(rest.trim())
        }
        None => None,
    };
    let x_api_key = match single(headers, "x-api-key")? {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| IdentityError::Malformed("x-api-key header"))?
                .trim(),
        )
        .filter(|k| !k.is_empty()),
        None => None,
    };
    match (bearer, x_api_key) {
        (Some(a), Some(b)) if !bool::from(a.as_bytes().ct_eq(b.as_bytes())) => {
            Err(IdentityError::Conflict)
        }
        (Some(a), _) => Ok(Some(a)),
        (None, b) => Ok(b),
    }
}

/// The one value of credential header `name`: sent several times with different values it
/// names several identities ([`IdentityError::Conflict`]). A proxy that appends its trusted
/// header to one the client sent must not let the client's value decide; repeating the same
/// value is harmless.
fn single<'h>(
    headers: &'h HeaderMap,
    name: &str,
) -> Result<Option<&'h http::HeaderValue>, IdentityError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    match first {
        Some(f) if values.any(|v| v.as_bytes().trim_ascii() != f.as_bytes().trim_ascii()) => {
            Err(IdentityError::Conflict)
        }
        _ => Ok(first),
    }
}

/// The hash of a key written plain or as `sha256:<64 hex digits>`.
pub fn key_hash(key: &str) -> Result<KeyHash, String> {
    let key = key.trim();
    if key.is_empty() {
        return Err("empty API key".into());
    }
    if let Some(hex) = key.strip_prefix("sha256:") {
        let hex = hex.trim().as_bytes();
        if hex.len() != 64 {
            return Err("a `sha256:` key needs 64 hex digits".into());
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.chunks(2).enumerate() {
            let hi = hex_digit(pair[0]);
            let lo = hex_digit(pair[1]);
            match (hi, lo, out.get_mut(i)) {
                (Some(h), Some(l), Some(b)) => *b = (h << 4) | l,
                _ => return Err("a `sha256:` key needs 64 hex digits".into()),
            }
        }
        Ok(out)
    } else {
        Ok(Sha256::digest(key.as_bytes()).into())
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// `sha256:<hex>` of a key, for writing key files and Secrets without the plain key.
pub fn hash_for_file(key: &str) -> String {
    let h: KeyHash = Sha256::digest(key.trim().as_bytes()).into();
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in h {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The API key files that front doors with these specs name (`spec.tenants.apiKeys.file`), as
/// written, sorted, without repeats.
pub fn key_files_named<'a>(
    specs: impl IntoIterator<Item = &'a kinf_policy::GatewayBackendSpec>,
) -> Vec<String> {
    let mut names: Vec<String> = specs
        .into_iter()
        .filter_map(|s| s.tenants.as_ref()?.api_keys.as_ref()?.file.clone())
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// One API key file as read: its path, and its text or why it could not be read.
#[derive(Clone)]
struct KeyFile {
    path: PathBuf,
    text: Result<String, String>,
}

impl KeyFile {
    /// Reads the file named `name` (as written; a relative one relative to `base_dir`).
    fn read(base_dir: &Path, name: &str) -> Self {
        let path = base_dir.join(name);
        // Through the policy reader's guard: a FIFO would block the reload, a huge file
        // exhaust memory.
        let text = crate::config_dir::read_text(&path).map_err(|e| {
            format!(
                "cannot read API key file {}: {}",
                path.display(),
                e.reason()
            )
        });
        KeyFile { path, text }
    }

    /// Its `(tenant, key)` entries, or what is wrong with it (naming the path and the line,
    /// never a key).
    fn entries(&self) -> Result<Vec<(String, String)>, String> {
        let text = self.text.as_deref().map_err(Clone::clone)?;
        parse_key_file(text).map_err(|e| format!("{}: {e}", self.path.display()))
    }
}

/// API key files read ahead of building a runtime (directory mode): each file that front doors
/// name in `apiKeys.file`, by the name as written, with its text or why it could not be read.
/// `Debug` shows the names only, never the text.
#[derive(Clone, Default)]
pub struct KeyFiles {
    files: BTreeMap<String, KeyFile>,
}

impl fmt::Debug for KeyFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.files.keys()).finish()
    }
}

impl KeyFiles {
    /// Reads every file of `names` (as written in `apiKeys.file`; a relative one relative to
    /// `base_dir`). A file that cannot be read is recorded as such ([`KeyFiles::errors`]).
    pub fn read(base_dir: &Path, names: impl IntoIterator<Item = String>) -> Self {
        KeyFiles {
            files: names
                .into_iter()
                .map(|n| {
                    let f = KeyFile::read(base_dir, &n);
                    (n, f)
                })
                .collect(),
        }
    }

    /// The `(tenant, key)` entries of the file named `name` (as written), or what is wrong with
    /// it; `None` when it was not read.
    pub fn entries(&self, name: &str) -> Option<Result<Vec<(String, String)>, String>> {
        self.files.get(name).map(KeyFile::entries)
    }

    /// What is wrong with each file that cannot be read or parsed (naming its path and line,
    /// never a key); empty when every file loads.
    pub fn errors(&self) -> Vec<String> {
        self.files
            .values()
            .filter_map(|f| f.entries().err())
            .collect()
    }

    /// Whether no file was read.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// A hash of the files' names and contents (0 for none), telling whether a policy was
    /// applied with the same keys (it counts in the policy's fingerprint in directory mode:
    /// [`crate::bundle::Resolved::fingerprint`]). Not a secret's digest: never shown as such.
    pub fn fingerprint(&self) -> u64 {
        use crate::bundle::fnv;
        if self.files.is_empty() {
            return 0;
        }
        let mut h = crate::bundle::FNV_OFFSET;
        for (name, f) in &self.files {
            h = fnv(h, name.as_bytes());
            h = match &f.text {
                Ok(t) => fnv(fnv(h, b"\0ok\0"), t.as_bytes()),
                Err(e) => fnv(fnv(h, b"\0err\0"), e.as_bytes()),
            };
        }
        h
    }
}

/// Parses a key file: one `tenant: key` per line, split at the first `:`; the key is plain or
/// `sha256:<hex>`; blank lines and lines starting with `#` are ignored; a tenant may have several
/// lines (several keys). The same key for two tenants is an error naming both lines. Errors name
/// the line, never the key.
pub fn parse_key_file(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    // Each key's hash so far, with its tenant and line number, to name both lines of a key
    // given to two tenants. (Loading is not a timing side channel: no request is involved.)
    let mut seen: std::collections::HashMap<KeyHash, (&str, usize)> =
        std::collections::HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((tenant, key)) = line.split_once(':') else {
            return Err(format!("line {}: expected `tenant: key`", n + 1));
        };
        let (tenant, key) = (tenant.trim(), key.trim());
        if tenant.is_empty() || key.is_empty() {
            return Err(format!("line {}: expected `tenant: key`", n + 1));
        }
        reserved_tenant_name(tenant).map_err(|e| format!("line {}: {e}", n + 1))?;
        let hash = key_hash(key).map_err(|e| format!("line {}: {e}", n + 1))?;
        match seen.get(&hash) {
            Some((other, at)) if *other != tenant => {
                return Err(format!(
                    "line {}: tenant `{tenant}` has the same API key as tenant `{other}` on line \
                     {at}",
                    n + 1
                ));
            }
            Some(_) => {}
            None => {
                seen.insert(hash, (tenant, n + 1));
            }
        }
        out.push((tenant.to_string(), key.to_string()));
    }
    Ok(out)
}
