//! Tenants: who is calling ([`identity`]) and how much they may use ([`limiter`]), with the
//! limiter's state kept in memory ([`memory`]) or shared by replicas in Redis ([`redis_store`]).
//! See `docs/reference/tenants.md`.

pub mod identity;
pub mod limiter;
pub mod memory;
pub mod redis_sentinel;
pub mod redis_store;
pub mod store;

pub use identity::{IdentityError, TenantResolver};
pub use limiter::{
    LimitError, LimitExceeded, Limiter, RateLimitHeaders, Reservation, TokenEstimate, format_reset,
};
pub use memory::MemoryStore;
pub use redis_sentinel::{SENTINEL_SCHEME, SentinelUrl, TLS_SENTINEL_SCHEME, parse_sentinel_url};
pub use redis_store::{CLUSTER_SCHEME, RedisConfig, RedisStore, TLS_CLUSTER_SCHEME, cluster_nodes};
pub use store::{FailMode, LimitStore, StoreStats, StoreStatsSnapshot};

/// The store named by the server flags: `memory`, or a `redis://`, `rediss://`,
/// `redis+unix://`, `redis+cluster://`, `rediss+cluster://`, `redis+sentinel://` or
/// `rediss+sentinel://` URL with `fail_mode` and
/// `key_prefix` (`None`: `kinf:rl:`). A Redis store must be built inside a Tokio runtime; it
/// connects lazily, so Redis being down at startup is not an error (the fail mode applies).
pub fn store_from_flags(
    store: &str,
    fail_mode: FailMode,
    key_prefix: Option<&str>,
) -> Result<std::sync::Arc<dyn LimitStore>, String> {
    store_from_flags_with_tls(store, fail_mode, key_prefix, RedisTls::default())
}

/// TLS material for a `rediss` store, read from the server flags' files (PEM).
#[derive(Clone, Debug, Default)]
pub struct RedisTls {
    /// `--limiter-tls-ca`: the authorities that sign the servers' certificates; `None`: the
    /// system's trust store.
    pub ca: Option<Vec<u8>>,
    /// `--limiter-tls-cert` and `--limiter-tls-key`: the client's certificate chain and key,
    /// for servers that ask for one.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedisTls {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }
}

/// [`store_from_flags`], with TLS material for a `rediss://`, `rediss+cluster://` or
/// `rediss+sentinel://` store.
/// Material with a store that is not TLS is refused (it would silently not be used), as are
/// files without what they should hold.
pub fn store_from_flags_with_tls(
    store: &str,
    fail_mode: FailMode,
    key_prefix: Option<&str>,
    tls_files: RedisTls,
) -> Result<std::sync::Arc<dyn LimitStore>, String> {
    if store == "memory" {
        if !tls_files.is_empty() {
            return Err(
                "--limiter-tls-ca/--limiter-tls-cert are for a `rediss://` store, not `memory`"
                    .into(),
            );
        }
        return Ok(std::sync::Arc::new(MemoryStore::new()));
    }
    let redis = [
        "redis://",
        "redis+unix://",
        redis_store::CLUSTER_SCHEME,
        redis_sentinel::SENTINEL_SCHEME,
    ];
    let tls = [
        "rediss://",
        redis_store::TLS_CLUSTER_SCHEME,
        redis_sentinel::TLS_SENTINEL_SCHEME,
    ];
    let is = |schemes: &[&str]| schemes.iter().any(|s| store.starts_with(s));
    if is(&redis) || is(&tls) {
        if !tls_files.is_empty() && !is(&tls) {
            return Err(format!(
                "--limiter-tls-ca/--limiter-tls-cert are for TLS: use `rediss://`, \
                 `rediss+cluster://` or `rediss+sentinel://`, not `{}`",
                redact_url(store)
            ));
        }
        if let Some(pem) = &tls_files.ca {
            check_certificates("--limiter-tls-ca", pem)?;
        }
        if let Some((cert, key)) = &tls_files.client {
            check_certificates("--limiter-tls-cert", cert)?;
            check_private_key("--limiter-tls-key", key)?;
        }
        let cluster = [redis_store::CLUSTER_SCHEME, redis_store::TLS_CLUSTER_SCHEME];
        if let Some(p) = key_prefix.filter(|_| is(&cluster))
            && let Some(why) = redis_store::cluster_prefix_problem(p)
        {
            return Err(format!("--limiter-key-prefix `{p}`: {why}"));
        }
        let mut cfg = RedisConfig::new(store);
        cfg.fail_mode = fail_mode;
        cfg.tls_ca = tls_files.ca;
        cfg.tls_client = tls_files.client;
        if let Some(p) = key_prefix {
            cfg.key_prefix = p.to_string();
        }
        return Ok(std::sync::Arc::new(RedisStore::new(cfg)?));
    }
    Err(format!(
        "--limiter-store: expected `memory`, `redis://[USER][:PASS@]HOST[:PORT][/DB]` \
         (`rediss://` over TLS), `redis+unix:///PATH?db=N` or \
         `redis+cluster://[USER][:PASS@]HOST:PORT[,HOST:PORT...]` (`rediss+cluster://` over TLS) \
         or `redis+sentinel://[USER][:PASS@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]` \
         (`rediss+sentinel://` over TLS), got `{}`",
        redact_url(store)
    ))
}

/// Refuses a flag's file without a PEM certificate (a DER file, an empty one, the wrong
/// file), or with one that does not decode: the TLS handshake would otherwise fail later, on
/// every admission.
fn check_certificates(flag: &str, pem: &[u8]) -> Result<(), String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{flag}: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{flag}: no PEM `CERTIFICATE` (`-----BEGIN CERTIFICATE-----`) in the file"
        ));
    }
    Ok(())
}

/// Refuses a flag's file without a PEM private key (`PRIVATE KEY`, `RSA PRIVATE KEY`, `EC
/// PRIVATE KEY`; an encrypted key is none), as [`check_certificates`] does certificates.
fn check_private_key(flag: &str, pem: &[u8]) -> Result<(), String> {
    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::{self, PemObject};
    PrivateKeyDer::from_pem_slice(pem)
        .map(|_| ())
        .map_err(|e| match e {
            pem::Error::NoItemsFound => format!(
                "{flag}: no PEM `PRIVATE KEY` (PKCS#8), `RSA PRIVATE KEY` (PKCS#1) or `EC \
                 PRIVATE KEY` (SEC1) in the file; encrypted keys are not supported"
            ),
            e => format!("{flag}: {e}"),
        })
}

/// `url` with the credentials between `://` and the host's `@` (and a `pass=` query
/// parameter) replaced by `***`, for error messages and logs.
pub fn redact_url(url: &str) -> String {
    let mut out = match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            match rest.get(..end).and_then(|authority| authority.rfind('@')) {
                Some(at) => format!("{scheme}://***{}", rest.get(at..).unwrap_or("")),
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    };
    for key in ["pass=", "password=", "sentinel_password="] {
        let mut from = 0;
        while let Some(i) = out.get(from..).and_then(|s| s.find(key)).map(|i| i + from) {
            let start = i + key.len();
            let end = out
                .get(start..)
                .and_then(|s| s.find('&'))
                .map_or(out.len(), |e| start + e);
            let starts_param = i > 0 && matches!(out.as_bytes().get(i - 1), Some(b'?' | b'&'));
            if starts_param {
                out.replace_range(start..end, "***");
            }
            from = start;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn credentials_never_reach_a_message() {
        for (url, shown) in [
            ("redis://:s3cret@cache:6379/0", "redis://***@cache:6379/0"),
            ("redis://user:s3cret@cache", "redis://***@cache"),
            ("valkey://u:s3cret@h/1", "valkey://***@h/1"),
            (
                "redis+unix:///run/r.sock?db=1&pass=s3cret",
                "redis+unix:///run/r.sock?db=1&pass=***",
            ),
            (
                "redis+unix:///r.sock?pass=s3cret&db=2",
                "redis+unix:///r.sock?pass=***&db=2",
            ),
            ("redis://cache:6379/0", "redis://cache:6379/0"),
            (
                "redis+sentinel://:pw@s1:26379,s2:26379/m?sentinel_password=s3cret",
                "redis+sentinel://***@s1:26379,s2:26379/m?sentinel_password=***",
            ),
            ("memroy", "memroy"),
            ("redis://cache/0?x=a@b", "redis://cache/0?x=a@b"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
