//! Budgets shared by replicas in Redis: one Lua script per admission checks and charges every
//! matching limit atomically, over one multiplexed connection (concurrent admissions are
//! pipelined on it). Redis's own clock (`TIME`) drives refills, so replicas' clocks don't matter.
//!
//! Keys, for each (limit, tenant): `{prefix}b:{limit}:{t:{tenant}}`, a hash with the token and
//! request buckets (`tl`/`ta`: level and time in ms, `rl`/`ra` likewise), and
//! `{prefix}c:{limit}:{t:{tenant}}`, a sorted set of the requests in flight scored by their
//! lease's expiry (a replica that dies without releasing leaks a slot only until then). Both
//! expire when idle. While a request is in flight its replica renews its lease every third of
//! the lease, so a request longer than the lease keeps its slot, and a replica that dies leaks
//! its slots for one lease at most.
//!
//! `{t:TENANT}` is a Redis Cluster hash tag: every key of one tenant is in one hash slot, so an
//! admission's script (which reads and writes all the keys of one request's tenant) runs on one
//! node of a cluster (`redis+cluster://`). `{`, `}` and `%` in a limit's name are written
//! `%7B`, `%7D` and `%25`, so that only the tenant's tag is a tag.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::Script;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use super::redis_sentinel::{
    SENTINEL_SCHEME, SentinelConnection, TLS_SENTINEL_SCHEME, parse_sentinel_url,
};

use super::store::{
    Admission, Budget, BudgetKind, Check, CheckState, FailMode, LimitStore, Settle, StoreError,
    StoreFuture, StoreStats,
};

/// Settings of a [`RedisStore`].
#[derive(Clone, Debug, PartialEq)]
pub struct RedisConfig {
    /// `redis://HOST:PORT/DB` (`rediss://` over TLS, or `redis+unix:///PATH?db=N`), or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]` for a Redis Cluster (`rediss+cluster://` over
    /// TLS; see [`cluster_nodes`]).
    pub url: String,
    /// PEM certificates of the authorities that sign the servers' TLS certificates (`rediss`
    /// URLs); `None`: the system's trust store.
    pub tls_ca: Option<Vec<u8>>,
    /// The client's certificate chain and private key (PEM), for servers that ask for one
    /// (`tls-auth-clients yes`); `None`: no client certificate.
    pub tls_client: Option<(Vec<u8>, Vec<u8>)>,
    /// Prefix of every key (`kinf:rl:` by default).
    pub key_prefix: String,
    /// What to do when Redis cannot be reached.
    pub fail_mode: FailMode,
    /// Longest wait for Redis on an admission before the fail mode applies.
    pub timeout: Duration,
    /// How long a concurrency slot is held at most if never released (a replica died). The
    /// replica holding it renews it every third of this while the request is in flight.
    pub lease: Duration,
    /// Idle keys expire after this long (at least until their bucket is full again).
    pub key_ttl: Duration,
}

impl RedisConfig {
    /// Defaults for `url`: prefix `kinf:rl:`, fail-closed, 250 ms timeout, 60 s lease (renewed
    /// every 20 s while the request runs), 2 min TTL.
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            tls_ca: None,
            tls_client: None,
            key_prefix: "kinf:rl:".into(),
            fail_mode: FailMode::Closed,
            timeout: Duration::from_millis(250),
            lease: Duration::from_secs(60),
            key_ttl: Duration::from_secs(120),
        }
    }
}

const ADMIT_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local member = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local n = #KEYS / 2
local function refill(level, at, cap)
  if not level then return cap end
  level = tonumber(level)
  at = tonumber(at)
  if now > at then level = level + (now - at) * cap / 60000 end
  if level > cap then level = cap end
  return level
end
local function waitms(level, cap, need)
  local target = need
  if target > cap then target = cap end
  local w = (target - level) * 60000 / cap
  if w < 0 then w = 0 end
  return math.ceil(w)
end
local function resetms(level, cap)
  local w = (cap - level) * 60000 / cap
  if w < 0 then w = 0 end
  return math.ceil(w)
end
local tl, rl, cc, args = {}, {}, {}, {}
-- The bound that keeps the request out longest (the first of equals) is the one refused, so
-- that the wait said is when every bound passes.
local refused, kind, wait = 0, 0, -1
local function refuse(i, k, w)
  if w > wait then refused, kind, wait = i, k, w end
end
for i = 1, n do
  local a = 3 + (i - 1) * 4
  local tpm, need, rpm, conc = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  args[i] = {tpm, need, rpm, conc}
  local h = redis.call('HMGET', KEYS[2 * i - 1], 'tl', 'ta', 'rl', 'ra')
  if tpm > 0 then tl[i] = refill(h[1], h[2], tpm) end
  if rpm > 0 then rl[i] = refill(h[3], h[4], rpm) end
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2 * i], '-inf', now)
    cc[i] = redis.call('ZCARD', KEYS[2 * i])
  end
  -- A request larger than the whole capacity never fits (the limiter refuses it before).
  if tpm > 0 and need > tl[i] then refuse(i, 1, waitms(tl[i], tpm, need)) end
  if rpm > 0 and rl[i] < 1 then refuse(i, 2, waitms(rl[i], rpm, 1)) end
  if conc > 0 and cc[i] >= conc then refuse(i, 3, 1000) end
end
if wait < 0 then wait = 0 end
local out = {refused == 0 and 1 or 0, refused, kind, wait}
for i = 1, n do
  local tpm, need, rpm, conc = args[i][1], args[i][2], args[i][3], args[i][4]
  local bkey = KEYS[2 * i - 1]
  local keep = ttl
  if refused == 0 then
    if tpm > 0 then
      tl[i] = tl[i] - need
      redis.call('HSET', bkey, 'tl', string.format('%.6f', tl[i]), 'ta', string.format('%.3f', now))
      local r = resetms(tl[i], tpm) + 1000
      if r > keep then keep = r end
    end
    if rpm > 0 then
      rl[i] = rl[i] - 1
      redis.call('HSET', bkey, 'rl', string.format('%.6f', rl[i]), 'ra', string.format('%.3f', now))
    end
    if rpm > 0 then
      local r = resetms(rl[i], rpm) + 1000
      if r > keep then keep = r end
    end
    if tpm > 0 or rpm > 0 then redis.call('PEXPIRE', bkey, math.ceil(keep)) end
    if conc > 0 then
      redis.call('ZADD', KEYS[2 * i], now + lease_ms, member)
      cc[i] = cc[i] + 1
      redis.call('PEXPIRE', KEYS[2 * i], lease_ms + 1000)
    end
  end
  if tpm > 0 then
    local l = tl[i]
    if l < 0 then l = 0 end
    table.insert(out, math.floor(l))
    table.insert(out, resetms(tl[i], tpm))
  else
    table.insert(out, -1)
    table.insert(out, -1)
  end
  if rpm > 0 then
    local l = rl[i]
    if l < 0 then l = 0 end
    table.insert(out, math.floor(l))
    table.insert(out, resetms(rl[i], rpm))
  else
    table.insert(out, -1)
    table.insert(out, -1)
  end
  if conc > 0 then table.insert(out, cc[i]) else table.insert(out, -1) end
end
return out
"#;

const SETTLE_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local member = ARGV[1]
local n = #KEYS / 2
for i = 1, n do
  local a = 1 + (i - 1) * 3
  local tpm, delta, release = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local bkey = KEYS[2 * i - 1]
  if tpm > 0 and delta ~= 0 then
    local h = redis.call('HMGET', bkey, 'tl', 'ta')
    -- A key that expired meanwhile (a request longer than the key's TTL) is a full bucket: a
    -- refund changes nothing, a debt is charged to it (and the key made again, with a TTL).
    if h[1] or delta < 0 then
      local level = tpm
      if h[1] then
        level = tonumber(h[1])
        local at = tonumber(h[2])
        if now > at then level = level + (now - at) * tpm / 60000 end
        if level > tpm then level = tpm end
      end
      level = level + delta
      if level > tpm then level = tpm end
      redis.call('HSET', bkey, 'tl', string.format('%.6f', level), 'ta', string.format('%.3f', now))
      local keep = math.ceil((tpm - level) * 60000 / tpm) + 1000
      if redis.call('PTTL', bkey) < keep then redis.call('PEXPIRE', bkey, keep) end
    end
  end
  if release == 1 then redis.call('ZREM', KEYS[2 * i], member) end
end
return 1
"#;

/// Renews leases: for each concurrency key `KEYS[i]`, member `ARGV[i + 1]` gets a new expiry
/// `now + ARGV[1]` ms, if it is still there (`XX`: a slot released meanwhile is not taken again).
const RENEW_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local lease_ms = tonumber(ARGV[1])
for i = 1, #KEYS do
  if redis.call('ZADD', KEYS[i], 'XX', 'CH', now + lease_ms, ARGV[i + 1]) == 1 then
    redis.call('PEXPIRE', KEYS[i], lease_ms + 1000)
  end
end
return 1
"#;

/// Most slots renewed by one script call.
const RENEW_BATCH: usize = 512;

/// The concurrency slots this store holds, by lease: the request's tenant and the slots'
/// sorted-set keys (all of that tenant, so in one hash slot of a cluster).
type Held = parking_lot::Mutex<HashMap<u64, (Arc<str>, Vec<String>)>>;

/// A connection to one Redis server (reconnecting), to a Redis Cluster (routing each command
/// to the node of its keys' slot, following `MOVED`/`ASK` redirections), or to the master of
/// a Redis Sentinel deployment (following failovers).
#[derive(Clone)]
enum Conn {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(SentinelConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

/// The scheme of a Redis Cluster's URL.
pub const CLUSTER_SCHEME: &str = "redis+cluster://";
/// The scheme of a Redis Cluster's URL over TLS.
pub const TLS_CLUSTER_SCHEME: &str = "rediss+cluster://";

/// The seed nodes of a `redis+cluster://[USER][:PASS@]HOST:PORT[,HOST:PORT...][/0]` URL, as
/// `redis://` URLs with the credentials of each (the client learns the other nodes from
/// them); of a `rediss+cluster://` URL, as `rediss://` URLs. A cluster has only database 0:
/// another is an error, as is a node without a port.
pub fn cluster_nodes(url: &str) -> Result<Vec<String>, String> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix(CLUSTER_SCHEME) {
        ("redis", rest)
    } else if let Some(rest) = url.strip_prefix(TLS_CLUSTER_SCHEME) {
        ("rediss", rest)
    } else {
        return Err(format!(
            "not a `{CLUSTER_SCHEME}` or `{TLS_CLUSTER_SCHEME}` URL"
        ));
    };
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !matches!(path, "" | "/" | "/0") {
        return Err(format!(
            "`{path}`: a Redis Cluster has only database 0; remove the path"
        ));
    }
    let (credentials, hosts) = match authority.rfind('@') {
        Some(at) => (
            authority.get(..=at).unwrap_or(""),
            authority.get(at + 1..).unwrap_or(""),
        ),
        None => ("", authority),
    };
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let port = host.rsplit_once(':').map(|(_, p)| p);
        if host.is_empty() || !port.is_some_and(|p| !p.is_empty() && p.parse::<u16>().is_ok()) {
            return Err(format!(
                "`{host}`: every node is `HOST:PORT` (nodes separated by `,`)"
            ));
        }
        nodes.push(format!("{scheme}://{credentials}{host}"));
    }
    Ok(nodes)
}

/// Why `prefix` cannot prefix the keys of a Redis Cluster, if it cannot: a `{` or `}` in it
/// would make a hash tag of (part of) the prefix, and put a tenant's keys in several slots.
pub(crate) fn cluster_prefix_problem(prefix: &str) -> Option<&'static str> {
    prefix.contains(['{', '}']).then_some(
        "`{` and `}` are not allowed with a Redis Cluster (they would make a hash tag of the \
         prefix)",
    )
}

/// Budgets in Redis, shared by every replica using the same server (or cluster) and key
/// prefix.
pub struct RedisStore {
    conn: Conn,
    config: RedisConfig,
    admit_script: Script,
    settle_script: Script,
    stats: Arc<StoreStats>,
    instance: u64,
    lease: AtomicU64,
    runtime: tokio::runtime::Handle,
    /// Slots held by requests in flight, renewed by [`renew_leases`] until released.
    held: Arc<Held>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("key_prefix", &self.config.key_prefix)
            .field("fail_mode", &self.config.fail_mode)
            .finish()
    }
}

impl RedisStore {
    /// A store for `config`. Connects lazily (Redis being down at startup is handled by the
    /// fail mode, like any outage); must be called inside a Tokio runtime.
    pub fn new(config: RedisConfig) -> Result<Self, String> {
        let invalid = |e: &dyn std::fmt::Display| {
            format!(
                "invalid Redis URL `{}`: {e}",
                super::redact_url(&config.url)
            )
        };
        let certs = || redis::TlsCertificates {
            client_tls: config.tls_client.clone().map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: config.tls_ca.clone(),
        };
        let tls = config.url.starts_with("rediss");
        // Certificates of our own, else the client's defaults (the system's trust store).
        let own_certs = tls && (config.tls_ca.is_some() || config.tls_client.is_some());
        let conn = if config.url.starts_with(CLUSTER_SCHEME)
            || config.url.starts_with(TLS_CLUSTER_SCHEME)
        {
            if let Some(why) = cluster_prefix_problem(&config.key_prefix) {
                return Err(format!("key prefix `{}`: {why}", config.key_prefix));
            }
            let nodes = cluster_nodes(&config.url).map_err(|e| invalid(&e))?;
            let mut builder = redis::cluster::ClusterClient::builder(nodes)
                .retries(1)
                .max_retry_wait(500);
            if own_certs {
                builder = builder.certs(certs());
            }
            let client = builder.build().map_err(|e| invalid(&e))?;
            let cc = redis::cluster::ClusterConfig::new()
                .set_connection_timeout(config.timeout)
                .set_response_timeout(config.timeout);
            Conn::Cluster(client.get_pending_async_connection_with_config(cc))
        } else if config.url.starts_with(SENTINEL_SCHEME)
            || config.url.starts_with(TLS_SENTINEL_SCHEME)
        {
            let url = parse_sentinel_url(&config.url).map_err(|e| invalid(&e))?;
            Conn::Sentinel(
                SentinelConnection::new(&url, own_certs.then(certs), config.timeout)
                    .map_err(|e| invalid(&e))?,
            )
        } else {
            let client = if own_certs {
                redis::Client::build_with_tls(config.url.as_str(), certs())
            } else {
                redis::Client::open(config.url.as_str())
            }
            .map_err(|e| invalid(&e))?;
            let mc = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(config.timeout))
                .set_response_timeout(Some(config.timeout))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(500));
            Conn::Server(
                ConnectionManager::new_lazy_with_config(client, mc)
                    .map_err(|e| format!("cannot create the Redis connection: {e}"))?,
            )
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "the Redis store needs a Tokio runtime".to_string())?;
        // Random per store (std's `RandomState` is seeded from the OS): replicas in containers
        // all have PID 1, and two stores sharing lease names would share concurrency slots.
        let instance = {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(std::process::id())
        };
        let held = Arc::new(Held::default());
        runtime.spawn(renew_leases(
            Arc::downgrade(&held),
            instance,
            conn.clone(),
            Script::new(RENEW_LUA),
            config.lease,
            config.timeout,
        ));
        Ok(RedisStore {
            conn,
            held,
            admit_script: Script::new(ADMIT_LUA),
            settle_script: Script::new(SETTLE_LUA),
            stats: Arc::new(StoreStats::default()),
            instance,
            lease: AtomicU64::new(1),
            runtime,
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    fn keys(&self, limit: &str, tenant: &str) -> (String, String) {
        keys(&self.config.key_prefix, limit, tenant)
    }

    /// `EVALSHA` (or `EVAL`) of the settlement script, owned so that it can run on a task.
    fn settle_command(&self, by_sha: bool, lease: u64, s: &[Settle]) -> redis::Cmd {
        let mut cmd = if by_sha {
            let mut c = redis::cmd("EVALSHA");
            c.arg(self.settle_script.get_hash());
            c
        } else {
            let mut c = redis::cmd("EVAL");
            c.arg(SETTLE_LUA);
            c
        };
        cmd.arg(s.len() * 2);
        for x in s {
            let (b, k) = self.keys(&x.limit, &x.tenant);
            cmd.arg(b).arg(k);
        }
        cmd.arg(self.member(lease));
        for x in s {
            cmd.arg(x.tokens_per_minute.unwrap_or(0))
                .arg(x.token_delta)
                .arg(u8::from(x.release_concurrency));
        }
        cmd
    }

    fn member(&self, lease: u64) -> String {
        member(self.instance, lease)
    }

    async fn admit_inner(&self, checks: &[Check]) -> Result<Admission, StoreError> {
        let lease = self.lease.fetch_add(1, Ordering::Relaxed);
        let mut inv = self.admit_script.prepare_invoke();
        inv.arg(self.member(lease))
            .arg(duration_ms(self.config.lease))
            .arg(duration_ms(self.config.key_ttl));
        for c in checks {
            let (b, k) = self.keys(&c.limit, &c.tenant);
            inv.key(b).key(k);
            inv.arg(c.tokens_per_minute.unwrap_or(0))
                .arg(c.tokens)
                .arg(c.requests_per_minute.unwrap_or(0))
                .arg(c.concurrent_requests.unwrap_or(0));
        }
        let mut conn = self.conn.clone();
        // Until an answer is in hand, the admission's slots are released behind it if it is
        // given up: timed out, failed in a way that may have let it run, or dropped by its
        // caller (the client went away while Redis was slow: hyper drops the handler's future,
        // and a slot taken then would be held by nobody until its lease expires).
        let mut lost = LostAdmission {
            store: self,
            checks,
            lease,
            armed: checks.iter().any(|c| c.concurrent_requests.is_some()),
        };
        let reply: Vec<i64> =
            match tokio::time::timeout(self.config.timeout, inv.invoke_async(&mut conn)).await {
                Ok(Ok(reply)) => reply,
                Ok(Err(e)) => {
                    if certainly_not_run(&e) {
                        lost.armed = false;
                    }
                    return Err(StoreError(format!("Redis: {e}")));
                }
                Err(_) => return Err(StoreError("Redis did not answer in time".into())),
            };
        let admission = parse_admission(&reply, checks, lease)?;
        // Answered: an admitted request's slots are now its reservation's to release.
        lost.armed = false;
        if let Admission::Admitted { .. } = admission {
            let slots: Vec<String> = checks
                .iter()
                .filter(|c| c.concurrent_requests.is_some())
                .map(|c| self.keys(&c.limit, &c.tenant).1)
                .collect();
            if let (false, Some(c)) = (slots.is_empty(), checks.first()) {
                self.held.lock().insert(lease, (c.tenant.clone(), slots));
            }
        }
        Ok(admission)
    }

    /// An admission whose answer was lost (timeout, connection broken after sending, its
    /// caller gone) may still run on Redis, taking concurrency slots nobody would release
    /// before the lease expires: release them behind it (same connection, so after it). Its
    /// tokens stay charged, as for a request dropped without usage: whether they were taken is
    /// unknown.
    fn release_lost_admission(&self, checks: &[Check], lease: u64) {
        let releases: Vec<Settle> = checks
            .iter()
            .filter(|c| c.concurrent_requests.is_some())
            .map(|c| Settle {
                limit: c.limit.clone(),
                tenant: c.tenant.clone(),
                tokens_per_minute: None,
                token_delta: 0,
                release_concurrency: true,
                lease,
            })
            .collect();
        self.settle(releases);
    }
}

/// An admission in flight: when dropped armed, its concurrency slots are released behind it
/// ([`RedisStore::release_lost_admission`]).
struct LostAdmission<'a> {
    store: &'a RedisStore,
    checks: &'a [Check],
    lease: u64,
    armed: bool,
}

impl Drop for LostAdmission<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.store.release_lost_admission(self.checks, self.lease);
        }
    }
}

/// The bucket and concurrency keys of `limit` for `tenant` (see the module docs): the
/// tenant's hash tag last, the limit's name with its braces (and `%`) escaped.
fn keys(prefix: &str, limit: &str, tenant: &str) -> (String, String) {
    let limit = if limit.contains(['{', '}', '%']) {
        limit
            .replace('%', "%25")
            .replace('{', "%7B")
            .replace('}', "%7D")
    } else {
        limit.to_owned()
    };
    (
        format!("{prefix}b:{limit}:{{t:{tenant}}}"),
        format!("{prefix}c:{limit}:{{t:{tenant}}}"),
    )
}

/// The sorted-set member of lease `lease` of store `instance`.
fn member(instance: u64, lease: u64) -> String {
    format!("{instance:016x}-{lease}")
}

/// Renews the leases of the slots in `held` every third of `lease` until the store is dropped
/// (`held` gone). A renewal that fails is logged and tried at the next round; a slot whose
/// renewals keep failing expires one lease after the last that got through.
async fn renew_leases(
    held: Weak<Held>,
    instance: u64,
    conn: Conn,
    script: Script,
    lease: Duration,
    timeout: Duration,
) {
    let every = (lease / 3).max(Duration::from_millis(100));
    let lease_ms = duration_ms(lease);
    loop {
        tokio::time::sleep(every).await;
        let Some(held) = held.upgrade() else {
            return;
        };
        // By tenant: one script call touches the keys of one hash slot (a cluster refuses
        // keys of several).
        let mut by_tenant: HashMap<Arc<str>, Vec<(String, u64)>> = HashMap::new();
        for (lease, (tenant, keys)) in held.lock().iter() {
            by_tenant
                .entry(tenant.clone())
                .or_default()
                .extend(keys.iter().map(|k| (k.clone(), *lease)));
        }
        drop(held);
        for batch in by_tenant
            .values()
            .flat_map(|slots| slots.chunks(RENEW_BATCH))
        {
            let mut inv = script.prepare_invoke();
            inv.arg(lease_ms);
            for (key, lease) in batch {
                inv.key(key).arg(member(instance, *lease));
            }
            let mut conn = conn.clone();
            match tokio::time::timeout(timeout * 4, inv.invoke_async::<i64>(&mut conn)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "renewing concurrency leases in Redis failed")
                }
                Err(_) => tracing::warn!("renewing concurrency leases in Redis timed out"),
            }
        }
    }
}

/// Whether a failed command certainly did not run on the server: Redis answered with an error
/// (`NOSCRIPT`, `LOADING`, `BUSY`, ...) or the connection was refused.
fn certainly_not_run(e: &redis::RedisError) -> bool {
    matches!(e.kind(), redis::ErrorKind::Server(_)) || e.is_connection_refusal()
}

/// How one try of a settlement went.
enum Attempt {
    Done,
    /// Failed before running: it can be sent again as is.
    NotRun,
    /// Failed, and may or may not have run (timeout, connection lost after sending).
    Unknown,
}

/// One try of a settlement: `EVALSHA`, then `EVAL` if the script is not cached.
async fn settle_once(
    conn: &mut Conn,
    (by_sha, full): &(redis::Cmd, redis::Cmd),
    timeout: Duration,
) -> Attempt {
    let classify = |r: Result<redis::RedisResult<i64>, tokio::time::error::Elapsed>| match r {
        Ok(Ok(_)) => Attempt::Done,
        Ok(Err(e)) if certainly_not_run(&e) => Attempt::NotRun,
        _ => Attempt::Unknown,
    };
    let first = tokio::time::timeout(timeout, by_sha.query_async(conn)).await;
    match first {
        // The script is not cached on this server yet (or it was flushed): send it.
        Ok(Err(e)) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            classify(tokio::time::timeout(timeout, full.query_async(conn)).await)
        }
        other => classify(other),
    }
}

/// Waits between the tries of a settlement (about 30 s in all): a concurrency slot is not
/// left held until its lease expires because Redis was unreachable for a moment.
const SETTLE_RETRIES_MS: [u64; 7] = [250, 500, 1000, 2000, 4000, 8000, 15_000];

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn parse_admission(reply: &[i64], checks: &[Check], lease: u64) -> Result<Admission, StoreError> {
    let bad = || StoreError("unexpected reply from the admission script".into());
    let head = reply.get(..4).ok_or_else(bad)?;
    let body = reply.get(4..).ok_or_else(bad)?;
    if body.len() != checks.len() * 5 {
        return Err(bad());
    }
    let u = |v: i64| u64::try_from(v).ok();
    let states: Vec<CheckState> = body
        .chunks(5)
        .zip(checks)
        .map(|(s, c)| {
            let budget = |limit: Option<u64>, rem: i64, reset: i64| {
                limit.zip(u(rem)).map(|(limit, remaining)| Budget {
                    limit,
                    remaining,
                    reset_ms: u(reset).unwrap_or(0),
                })
            };
            CheckState {
                tokens: budget(c.tokens_per_minute, s[0], s[1]),
                requests: budget(c.requests_per_minute, s[2], s[3]),
                in_flight: u(s[4]),
            }
        })
        .collect();
    if head[0] == 1 {
        Ok(Admission::Admitted { states, lease })
    } else {
        let index = usize::try_from(head[1] - 1).map_err(|_| bad())?;
        let kind = match head[2] {
            1 => BudgetKind::Tokens,
            2 => BudgetKind::Requests,
            _ => BudgetKind::Concurrency,
        };
        Ok(Admission::Refused {
            index,
            kind,
            retry_after_ms: u(head[3]).unwrap_or(1000),
            states,
        })
    }
}

impl LimitStore for RedisStore {
    fn admit<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a, Result<Admission, StoreError>> {
        Box::pin(self.admit_inner(checks))
    }

    fn settle(&self, settlements: Vec<Settle>) {
        let Some(lease) = settlements.first().map(|s| s.lease) else {
            return;
        };
        if settlements.iter().any(|s| s.release_concurrency) {
            // Released (or being released): no longer renewed.
            self.held.lock().remove(&lease);
        }
        let whole = (
            self.settle_command(true, lease, &settlements),
            self.settle_command(false, lease, &settlements),
        );
        // What may be sent again when a try may have run: releasing a slot twice is harmless,
        // giving back (or charging) tokens twice is not.
        let releases: Vec<Settle> = settlements
            .iter()
            .filter(|s| s.release_concurrency)
            .map(|s| Settle {
                token_delta: 0,
                ..s.clone()
            })
            .collect();
        let releases = (!releases.is_empty()).then(|| {
            (
                self.settle_command(true, lease, &releases),
                self.settle_command(false, lease, &releases),
            )
        });
        let mut conn = self.conn.clone();
        let stats = self.stats.clone();
        let timeout = self.config.timeout * 4;
        self.runtime.spawn(async move {
            let mut cmds = whole;
            let mut releases = releases;
            let mut release_only = false;
            let mut counted = false;
            let mut waits = SETTLE_RETRIES_MS.iter();
            loop {
                match settle_once(&mut conn, &cmds, timeout).await {
                    Attempt::Done => return,
                    Attempt::NotRun => {}
                    Attempt::Unknown if release_only => {}
                    Attempt::Unknown => match releases.take() {
                        Some(r) => {
                            cmds = r;
                            release_only = true;
                        }
                        // Only token deltas: nothing that is safe to send again.
                        None => break,
                    },
                }
                if !counted {
                    StoreStats::bump(&stats.redis_errors);
                    counted = true;
                }
                match waits.next() {
                    Some(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
                    None => break,
                }
            }
            if !counted {
                StoreStats::bump(&stats.redis_errors);
            }
            tracing::warn!(
                "rate-limit settlement failed or unconfirmed: Redis unreachable (a concurrency \
                 slot not released is held until its lease expires)"
            );
        });
    }

    fn fail_mode(&self) -> FailMode {
        self.config.fail_mode
    }

    fn stats(&self) -> &StoreStats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{cluster_nodes, keys};

    #[test]
    fn a_cluster_url_names_its_seed_nodes_with_their_credentials() {
        assert_eq!(
            cluster_nodes("redis+cluster://10.0.0.1:7000,10.0.0.2:7001").unwrap(),
            ["redis://10.0.0.1:7000", "redis://10.0.0.2:7001"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://app:s3cr@t@r1:6379,r2:6379/0").unwrap(),
            ["redis://app:s3cr@t@r1:6379", "redis://app:s3cr@t@r2:6379"]
        );
        assert_eq!(
            cluster_nodes("redis+cluster://[::1]:7000/").unwrap(),
            ["redis://[::1]:7000"]
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://:pw@r1:6380,r2:6380").unwrap(),
            ["rediss://:pw@r1:6380", "rediss://:pw@r2:6380"]
        );
        for (url, why) in [
            ("redis+cluster://r1:6379/2", "only database 0"),
            (
                "redis+cluster://r1,r2:6379",
                "`r1`: every node is `HOST:PORT`",
            ),
            ("redis+cluster://r1:6379,", "every node is `HOST:PORT`"),
            ("redis+cluster://r1:http", "every node is `HOST:PORT`"),
            ("redis+cluster://", "every node is `HOST:PORT`"),
        ] {
            let e = cluster_nodes(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
    }

    #[test]
    fn every_key_of_a_tenant_has_its_hash_tag_and_only_that() {
        // What Redis Cluster hashes: between the first `{` and the next `}`.
        fn tag(key: &str) -> &str {
            let open = key.find('{').unwrap();
            let close = key[open + 1..].find('}').unwrap() + open + 1;
            &key[open + 1..close]
        }
        for limit in ["ns/p/tpm", "ns/p/{odd}", "ns/p/}x{", "ns/p/%7B"] {
            let (b, c) = keys("kinf:rl:", limit, "acme");
            assert_eq!((tag(&b), tag(&c)), ("t:acme", "t:acme"), "{b} {c}");
        }
        let (b, c) = keys("kinf:rl:", "ns/p/tpm", "");
        assert_eq!((tag(&b), tag(&c)), ("t:", "t:"));
        // Names that differ only by what is escaped stay distinct.
        assert_ne!(keys("p:", "a{b", "t").0, keys("p:", "a%7Bb", "t").0);
        assert_eq!(
            keys("p:", "l", "t"),
            ("p:b:l:{t:t}".into(), "p:c:l:{t:t}".into())
        );
    }
}
