//! Tenants: who is calling ([`identity`]) and how much they may use ([`limiter`]), with the
//! limiter's state kept in memory ([`memory`]) or shared by replicas in Redis ([`redis_store`]).
//! See `docs/reference/tenants.md`.

pub mod identity;
pub mod limiter;
pub mod memory;
pub mod redis_store;
pub mod store;

pub use identity::{IdentityError, TenantResolver};
pub use limiter::{
    LimitError, LimitExceeded, Limiter, RateLimitHeaders, Reservation, TokenEstimate, format_reset,
};
pub use memory::MemoryStore;
pub use redis_store::{RedisConfig, RedisStore};
pub use store::{FailMode, LimitStore, StoreStats, StoreStatsSnapshot};

/// The store named by the server flags: `memory`, or a `redis://` / `redis+unix://` URL with
/// `fail_mode` and `key_prefix` (`None`: `kinf:rl:`); `rediss://` is refused (no TLS). A Redis store must be built inside a
/// Tokio runtime; it connects lazily, so Redis being down at startup is not an error (the fail
/// mode applies).
pub fn store_from_flags(
    store: &str,
    fail_mode: FailMode,
    key_prefix: Option<&str>,
) -> Result<std::sync::Arc<dyn LimitStore>, String> {
    if store == "memory" {
        return Ok(std::sync::Arc::new(MemoryStore::new()));
    }
    if store.starts_with("rediss://") {
        return Err(
            "--limiter-store: `rediss://` (Redis over TLS) is not supported by this build; use \
             `redis://` on a network you trust, or `redis+unix:///PATH` beside the gateway"
                .into(),
        );
    }
    if store.starts_with("redis://") || store.starts_with("redis+unix://") {
        let mut cfg = RedisConfig::new(store);
        cfg.fail_mode = fail_mode;
        if let Some(p) = key_prefix {
            cfg.key_prefix = p.to_string();
        }
        return Ok(std::sync::Arc::new(RedisStore::new(cfg)?));
    }
    Err(format!(
        "--limiter-store: expected `memory`, `redis://[USER][:PASS@]HOST[:PORT][/DB]` or \
         `redis+unix:///PATH?db=N`, got `{store}`"
    ))
}
