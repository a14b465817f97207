//! A connection to the master of a Redis Sentinel deployment that follows failovers.
//!
//! `redis+sentinel://[USER][:PASS@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?sentinel_password=P]`
//! names the sentinels and the master's name (`rediss+sentinel://`: TLS to the sentinels and
//! to the servers). The connection asks the sentinels for the master's address, checks that the
//! server there calls itself master (`ROLE`), and keeps one multiplexed connection to it. When a
//! command fails because the connection broke, or because the server turned into a replica
//! (`READONLY`: a failover demoted it), the connection is dropped and the next command asks the
//! sentinels again. A command refused with `READONLY` did not run, so it is sent once more at
//! once, to the new master; one whose connection broke may have run, so its error is returned
//! (the caller's fail mode and retry rules apply, as with a single server). Several timeouts
//! in a row drop the connection too (a master cut off by the network never closes it), and a
//! failed lookup answers every command for a short while before the sentinels are asked again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, ConnectionAddr, RedisResult, ServerError, TlsCertificates, Value,
};

/// The scheme of a Redis Sentinel URL.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";
/// The scheme of a Redis Sentinel URL over TLS.
pub const TLS_SENTINEL_SCHEME: &str = "rediss+sentinel://";

/// What a `redis+sentinel://` URL says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelUrl {
    /// `rediss+sentinel://`: TLS to the sentinels and to the servers.
    pub tls: bool,
    /// The sentinels' `(host, port)`.
    pub sentinels: Vec<(String, u16)>,
    /// The master's name, as in the sentinels' `sentinel monitor NAME ...`.
    pub master: String,
    /// The database on the master.
    pub db: i64,
    /// The servers' user (ACL), if any.
    pub username: Option<String>,
    /// The servers' password, if any.
    pub password: Option<String>,
    /// The sentinels' own password (`requirepass` in `sentinel.conf`), if any.
    pub sentinel_password: Option<String>,
}

/// Parses a `redis+sentinel://` or `rediss+sentinel://` URL (see the module docs). Credentials
/// are percent-decoded.
pub fn parse_sentinel_url(url: &str) -> Result<SentinelUrl, String> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix(SENTINEL_SCHEME) {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix(TLS_SENTINEL_SCHEME) {
        (true, rest)
    } else {
        return Err(format!(
            "not a `{SENTINEL_SCHEME}` or `{TLS_SENTINEL_SCHEME}` URL"
        ));
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let (credentials, hosts) = match authority.rfind('@') {
        Some(at) => (
            authority.get(..at).unwrap_or(""),
            authority.get(at + 1..).unwrap_or(""),
        ),
        None => ("", authority),
    };
    let (username, password) = match credentials.split_once(':') {
        Some((u, p)) => (decoded(u)?, decoded(p)?),
        None => (decoded(credentials)?, None),
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        let parsed = host
            .rsplit_once(':')
            .filter(|(h, _)| !h.is_empty())
            .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?)));
        let Some(sentinel) = parsed else {
            return Err(format!(
                "`{host}`: every sentinel is `HOST:PORT` (sentinels separated by `,`)"
            ));
        };
        sentinels.push(sentinel);
    }
    let mut segments = path.trim_start_matches('/').split('/');
    let master = match segments.next() {
        Some(m) if !m.is_empty() => decoded(m)?.unwrap_or_default(),
        _ => {
            return Err(
                "the master's name is missing: `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]`"
                    .into(),
            );
        }
    };
    let db = match segments.next() {
        None | Some("") => 0,
        Some(d) => d
            .parse::<i64>()
            .ok()
            .filter(|d| *d >= 0)
            .ok_or_else(|| format!("database `{d}` is not a number"))?,
    };
    if let Some(extra) = segments.next() {
        return Err(format!(
            "unexpected `/{extra}` after the database: `.../MASTER[/DB]`"
        ));
    }
    let mut sentinel_password = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("sentinel_password", v)) => sentinel_password = decoded(v)?,
            _ => {
                let name = pair.split('=').next().unwrap_or(pair);
                return Err(format!(
                    "unknown parameter `{name}` (the only one is `sentinel_password`)"
                ));
            }
        }
    }
    Ok(SentinelUrl {
        tls,
        sentinels,
        master,
        db,
        username,
        password,
        sentinel_password,
    })
}

/// `s` percent-decoded, `None` when empty.
fn decoded(s: &str) -> Result<Option<String>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|d| Some(d.into_owned()))
        .map_err(|_| "credentials are not UTF-8 once percent-decoded".to_string())
}

/// A connection to the current master of a Sentinel deployment (see the module docs). Clones
/// share the connection.
#[derive(Clone)]
pub(crate) struct SentinelConnection(Arc<Shared>);

/// Forgets its connection when the client library reports it closed.
struct ForgetOnDisconnect {
    shared: std::sync::Weak<Shared>,
    generation: u64,
}

impl redis::aio::AsyncPushSender for ForgetOnDisconnect {
    fn send(&self, info: redis::PushInfo) -> Result<(), redis::aio::SendError> {
        if info.kind == redis::PushKind::Disconnection
            && let Some(shared) = self.shared.upgrade()
        {
            shared.closed.fetch_max(self.generation, Ordering::Relaxed);
            shared.forget(self.generation);
        }
        Ok(())
    }
}

/// How long a failed lookup of the master is the answer to every command, before the
/// sentinels are asked again: while no master is reachable, commands fail at once instead of
/// each asking the sentinels.
const LOOKUP_BACKOFF: Duration = Duration::from_millis(200);

/// Timeouts in a row after which the master's connection is dropped and the master looked up
/// again: one slow answer is no reason to, but a master cut off by the network (no reset, so
/// the connection never closes) while the sentinels promoted another one is.
const TIMEOUTS_BEFORE_LOOKUP: u32 = 3;

struct Shared {
    /// Locked while the master is looked up, so that one lookup serves every waiting command.
    client: tokio::sync::Mutex<SentinelClient>,
    /// The last failed lookup, until [`LOOKUP_BACKOFF`] has passed.
    failed: parking_lot::Mutex<Option<(std::time::Instant, redis::RedisError)>>,
    /// The connection to the master and its generation, until a failure drops it.
    current: parking_lot::Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    /// The newest generation whose connection the client library reported closed.
    closed: AtomicU64,
    /// Commands in a row that timed out on the current connection.
    timeouts: AtomicU32,
    config: AsyncConnectionConfig,
    db: i64,
}

impl Shared {
    /// Drops the connection of `generation` if it is still the current one (a newer one, made
    /// after the failure, is kept).
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
            self.timeouts.store(0, Ordering::Relaxed);
        }
    }

    /// The current connection, else one to the master looked up now, unless a lookup failed
    /// less than [`LOOKUP_BACKOFF`] ago (its error, then).
    async fn current_or_look_up(self: &Arc<Self>) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut client = self.client.lock().await;
        if let Some(c) = self.current.lock().clone() {
            return Ok(c);
        }
        if let Some((at, e)) = &*self.failed.lock()
            && at.elapsed() < LOOKUP_BACKOFF
        {
            return Err(e.clone());
        }
        let found = self.look_up(&mut client).await;
        *self.failed.lock() = found
            .as_ref()
            .err()
            .map(|e| (std::time::Instant::now(), e.clone()));
        found
    }

    /// Asks the sentinels for the master, connects to it and makes the connection current.
    async fn look_up(
        self: &Arc<Self>,
        client: &mut SentinelClient,
    ) -> RedisResult<(u64, MultiplexedConnection)> {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        // A connection that closes (the master died, or was demoted: Redis then closes its
        // clients' connections) is forgotten at once, so that the next command looks the
        // master up instead of failing on the closed connection.
        let config = self.config.clone().set_push_sender(ForgetOnDisconnect {
            shared: Arc::downgrade(self),
            generation,
        });
        let conn = client
            .async_get_client()
            .await?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let mut current = self.current.lock();
        // Closed already, before it was current: its push found nothing to forget.
        if self.closed.load(Ordering::Relaxed) >= generation {
            return Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )));
        }
        *current = Some((generation, conn.clone()));
        self.timeouts.store(0, Ordering::Relaxed);
        Ok((generation, conn))
    }
}

impl SentinelConnection {
    /// A connection for `url` (see [`parse_sentinel_url`]); `certs` for TLS, if the defaults
    /// (the system's trust store, no client certificate) are not to be used. Connects on the
    /// first command; the connection to the master and its answers are bounded by `timeout`
    /// (the sentinels are asked with the client library's own timeouts).
    pub(crate) fn new(
        url: &SentinelUrl,
        certs: Option<TlsCertificates>,
        timeout: Duration,
    ) -> RedisResult<Self> {
        let addrs = url.sentinels.iter().map(|(host, port)| {
            if url.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let mut builder =
            SentinelClientBuilder::new(addrs, &url.master, SentinelServerType::Master)?
                .set_client_to_redis_db(url.db)
                // RESP3 (Redis 6 and later) tells the client library when a connection closes.
                .set_client_to_redis_protocol(redis::ProtocolVersion::RESP3);
        if let Some(u) = &url.username {
            builder = builder.set_client_to_redis_username(u);
        }
        if let Some(p) = &url.password {
            builder = builder.set_client_to_redis_password(p);
        }
        if let Some(p) = &url.sentinel_password {
            builder = builder.set_client_to_sentinel_password(p);
        }
        if url.tls {
            builder = builder
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
            if let Some(c) = certs {
                builder = builder
                    .set_client_to_sentinel_certificates(c.clone())
                    .set_client_to_redis_certificates(c);
            }
        }
        let client = builder.build()?;
        Ok(SentinelConnection(Arc::new(Shared {
            client: tokio::sync::Mutex::new(client),
            failed: parking_lot::Mutex::new(None),
            current: parking_lot::Mutex::new(None),
            generation: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            timeouts: AtomicU32::new(0),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout)),
            db: url.db,
        })))
    }

    /// The connection to the master, looked up (once for all waiting callers) if there is none.
    /// The lookup runs on a task of its own: a caller that gives up (its own timeout) does not
    /// cancel it, so a slow lookup still ends, and its outcome serves the callers after it.
    async fn master(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.0.current.lock().clone() {
            return Ok(c);
        }
        let shared = self.0.clone();
        tokio::spawn(async move { shared.current_or_look_up().await })
            .await
            .unwrap_or_else(|e| {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "the lookup of the master failed",
                    e.to_string(),
                )))
            })
    }

    /// After `e` from the connection of `generation`: forgets the master if `e` says it is
    /// gone or demoted (a closed connection, a refusal as `READONLY`, several timeouts in a
    /// row). `None`: send the command again (once: a `READONLY` refusal did not run); else the
    /// error to return.
    fn failed(
        &self,
        generation: u64,
        e: redis::RedisError,
        retried: &mut bool,
    ) -> Option<redis::RedisError> {
        if is_readonly(&e) {
            self.0.forget(generation);
            if !*retried {
                *retried = true;
                return None;
            }
        } else if e.is_timeout() {
            if self.0.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_BEFORE_LOOKUP {
                self.0.forget(generation);
            }
        } else if e.is_unrecoverable_error() || e.is_io_error() {
            self.0.forget(generation);
        }
        Some(e)
    }

    /// The master answered: timeouts count from zero again.
    fn answered(&self) {
        self.0.timeouts.store(0, Ordering::Relaxed);
    }

    /// Sends a command (`send` on a connection to the master) until it is answered or fails
    /// for good ([`Self::failed`]). An error reply that `refusal_in` finds in the answer and
    /// that says the master was demoted (`READONLY`) counts as a failure; any other answer
    /// is returned as it is.
    async fn send<'a, T, Fut>(
        &'a self,
        send: impl Fn(MultiplexedConnection) -> Fut + 'a,
        refusal_in: impl Fn(&T) -> Option<&ServerError> + 'a,
    ) -> RedisResult<T>
    where
        Fut: std::future::Future<Output = RedisResult<T>> + 'a,
    {
        let mut retried = false;
        loop {
            let (generation, conn) = self.master().await?;
            let e = match send(conn).await {
                Ok(v) => match refusal_in(&v).map(|r| redis::RedisError::from(r.clone())) {
                    Some(e) if is_readonly(&e) => e,
                    _ => {
                        self.answered();
                        return Ok(v);
                    }
                },
                Err(e) => e,
            };
            if let Some(e) = self.failed(generation, e, &mut retried) {
                return Err(e);
            }
        }
    }
}

/// A write refused because the server is a replica now (Redis 7 keeps the `READONLY` code of
/// a write refused inside a script; Redis 6 answers `ERR ... -READONLY ...`).
fn is_readonly(e: &redis::RedisError) -> bool {
    e.code() == Some("READONLY") || e.detail().is_some_and(|d| d.contains("READONLY"))
}

/// The error reply of a command's answer, if it is one.
fn refusal(v: &Value) -> Option<&ServerError> {
    match v {
        Value::ServerError(e) => Some(e),
        _ => None,
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(self.send(
            move |mut c| async move { c.req_packed_command(cmd).await },
            refusal,
        ))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(self.send(
            move |mut c| async move { c.req_packed_commands(pipeline, offset, count).await },
            |vs: &Vec<Value>| vs.iter().find_map(refusal),
        ))
    }

    fn get_db(&self) -> i64 {
        self.0.db
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn parses_sentinels_master_db_and_credentials() {
        let u = parse_sentinel_url(
            "redis+sentinel://app:p%40ss@s1:26379,[::1]:26380/mymaster/2?sentinel_password=x%26y",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            u,
            SentinelUrl {
                tls: false,
                sentinels: vec![("s1".into(), 26379), ("::1".into(), 26380)],
                master: "mymaster".into(),
                db: 2,
                username: Some("app".into()),
                password: Some("p@ss".into()),
                sentinel_password: Some("x&y".into()),
            }
        );
        let t = parse_sentinel_url("rediss+sentinel://:pw@s1:26379/m")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(t.tls);
        assert_eq!((t.username, t.password, t.db), (None, Some("pw".into()), 0));
    }

    #[test]
    fn refuses_what_it_cannot_use_naming_the_part() {
        for (url, says) in [
            ("redis+sentinel://s1:26379", "master's name is missing"),
            ("redis+sentinel://s1:26379/", "master's name is missing"),
            (
                "redis+sentinel://s1/m",
                "`s1`: every sentinel is `HOST:PORT`",
            ),
            ("redis+sentinel://s1:26379,/m", "``: every sentinel"),
            ("redis+sentinel://s1:99999/m", "`s1:99999`"),
            ("redis+sentinel://s1:26379/m/x", "database `x`"),
            ("redis+sentinel://s1:26379/m/0/1", "unexpected `/1`"),
            (
                "redis+sentinel://s1:26379/m?password=x",
                "unknown parameter `password`",
            ),
            ("redis://s1:26379/m", "not a `redis+sentinel://`"),
        ] {
            let err = parse_sentinel_url(url).expect_err(url);
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn only_a_readonly_refusal_is_sent_again_and_only_once() {
        let url =
            parse_sentinel_url("redis+sentinel://127.0.0.1:1/m").unwrap_or_else(|e| panic!("{e}"));
        let conn = SentinelConnection::new(&url, None, Duration::from_millis(100))
            .unwrap_or_else(|e| panic!("{e}"));
        let readonly = || {
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "You can't write against a read only replica.",
            ))
        };
        let mut retried = false;
        assert!(conn.failed(1, readonly(), &mut retried).is_none());
        assert!(conn.failed(1, readonly(), &mut retried).is_some());
        // A broken connection may have run the command; a script error certainly did not,
        // but says nothing about the master.
        for e in [
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
            redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
                "No matching script.",
            )),
        ] {
            let mut retried = false;
            assert!(conn.failed(1, e, &mut retried).is_some());
        }
    }

    /// One slow answer keeps the connection; timeouts in a row count toward a new lookup, and
    /// an answer starts the count again.
    #[test]
    fn timeouts_count_in_a_row_and_an_answer_resets_them() {
        let url = parse_sentinel_url("redis+sentinel://127.0.0.1:1/m").unwrap();
        let conn = SentinelConnection::new(&url, None, Duration::from_millis(100)).unwrap();
        let timeout =
            || redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        let mut retried = false;
        assert!(conn.failed(1, timeout(), &mut retried).is_some());
        assert!(conn.failed(1, timeout(), &mut retried).is_some());
        assert_eq!(conn.0.timeouts.load(Ordering::Relaxed), 2);
        conn.answered();
        assert_eq!(conn.0.timeouts.load(Ordering::Relaxed), 0);
        assert!(!retried, "a timeout is never sent again");
    }
}
