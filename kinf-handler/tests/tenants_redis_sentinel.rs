//! The limiter over a real Redis Sentinel deployment: a master, a replica and one sentinel
//! (`redis-server --sentinel`, quorum 1). A store that knows only the sentinel follows a
//! manual failover (the old master turns into a replica and refuses writes with `READONLY`)
//! without losing an admission, keeps the budgets spent before it (they were replicated), and
//! comes back after the master dies and the sentinel promotes the replica.
//!
//! Skipped (loudly) when `redis-server` is not on PATH, unless `KINF_REQUIRE_E2E=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kinf_handler::tenants::store::BudgetKind;
use kinf_handler::tenants::{
    FailMode, LimitError, Limiter, RedisConfig, RedisStore, TokenEstimate, store_from_flags,
};
use support::redis::{
    free_port, redis_cli, redis_installed, req, self_signed_localhost, spawn_redis,
    tokens_and_concurrency, wait_listening, wait_until,
};

/// A master, its replica and a sentinel monitoring them as `m`, killed on drop.
struct Deployment {
    /// Master, replica, sentinel (`None` once killed).
    children: Vec<Option<Child>>,
    /// The master's and the replica's ports, as started.
    servers: [u16; 2],
    sentinel: u16,
    /// With TLS: the certificate every process presents (PEM), self-signed.
    ca: Option<Vec<u8>>,
    /// The sentinel's configuration without its `sentinel` lines.
    sentinel_base: Vec<String>,
    dir: PathBuf,
}

impl Deployment {
    fn start(name: &str) -> Option<Deployment> {
        Self::start_with(name, false)
    }

    /// With `tls`, the servers and the sentinel speak only TLS (clients and replication), with
    /// one self-signed certificate for `127.0.0.1`.
    fn start_with(name: &str, tls: bool) -> Option<Deployment> {
        if !redis_installed() {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("kinf-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = tls.then(|| self_signed_localhost(&dir));
        let (master, replica, sentinel) = (free_port(), free_port(), free_port());
        let d = dir.to_str().unwrap().to_owned();
        let file = |f: &str| dir.join(f).to_str().unwrap().to_owned();
        // `(option, value)` pairs shared by the servers (as flags) and the sentinel (as lines).
        let tls_options: Vec<(&str, String)> = if tls {
            vec![
                ("tls-cert-file", file("cert.pem")),
                ("tls-key-file", file("key.pem")),
                ("tls-ca-cert-file", file("cert.pem")),
                ("tls-auth-clients", "no".into()),
                ("tls-replication", "yes".into()),
            ]
        } else {
            Vec::new()
        };
        let port_options = |port: u16| -> Vec<(&str, String)> {
            if tls {
                vec![("port", "0".into()), ("tls-port", port.to_string())]
            } else {
                vec![("port", port.to_string())]
            }
        };
        let server = |port: u16| {
            let mut args: Vec<String> = Vec::new();
            for (k, v) in port_options(port).into_iter().chain(tls_options.clone()) {
                args.extend([format!("--{k}"), v]);
            }
            for (k, v) in [
                ("bind", "127.0.0.1".to_owned()),
                ("save", String::new()),
                ("appendonly", "no".into()),
                ("dir", d.clone()),
                ("dbfilename", format!("dump-{port}.rdb")),
            ] {
                args.extend([format!("--{k}"), v]);
            }
            args
        };
        let m = server(master);
        let mut r = server(replica);
        r.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
        let mut sentinel_base: Vec<String> = port_options(sentinel)
            .into_iter()
            .chain(tls_options.clone())
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        sentinel_base.extend(["bind 127.0.0.1".into(), format!("dir {d}")]);
        let mut dep = Deployment {
            children: vec![Some(spawn_redis(&m)), Some(spawn_redis(&r))],
            servers: [master, replica],
            sentinel,
            ca,
            sentinel_base,
            dir,
        };
        dep.start_sentinel(master);
        wait_listening(&[master, replica, sentinel]);
        wait_until(20, "the replica did not sync", || {
            dep.cli(replica, &["info", "replication"])
                .contains("master_link_status:up")
        });
        wait_until(20, "the sentinel did not find the replica", || {
            dep.cli(sentinel, &["sentinel", "replicas", "m"])
                .contains(&replica.to_string())
        });
        Some(dep)
    }

    /// Starts the sentinel (a fresh configuration) monitoring the master on `port` as `m`.
    fn start_sentinel(&mut self, master: u16) {
        let conf = self.dir.join(format!("sentinel-{master}.conf"));
        let mut lines = self.sentinel_base.clone();
        lines.extend([
            format!("sentinel monitor m 127.0.0.1 {master} 1"),
            "sentinel down-after-milliseconds m 1000".into(),
            "sentinel failover-timeout m 4000".into(),
        ]);
        std::fs::write(&conf, lines.join("\n") + "\n").unwrap();
        let child = spawn_redis(&[conf.to_str().unwrap(), "--sentinel"]);
        self.children.truncate(2);
        self.children.push(Some(child));
        wait_listening(&[self.sentinel]);
    }

    /// `redis-cli` on `port` (over TLS, trusting the deployment's certificate, with TLS).
    fn cli(&self, port: u16, args: &[&str]) -> String {
        redis_cli(self.ca.as_ref().map(|_| self.dir.as_path()), port, args)
    }

    fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "rediss" } else { "redis" };
        format!("{scheme}+sentinel://127.0.0.1:{}/m", self.sentinel)
    }

    /// The port of the server the sentinel names as master now.
    fn master_port(&self) -> u16 {
        let out = self.cli(self.sentinel, &["sentinel", "get-master-addr-by-name", "m"]);
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0)
    }

    /// How many commands the sentinel has processed (its own `INFO stats`, less the
    /// `INFO` that asks).
    fn sentinel_commands(&self) -> u64 {
        let info = self.cli(self.sentinel, &["info", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether the server on `port` says it is a master.
    fn is_master(&self, port: u16) -> bool {
        self.cli(port, &["role"]).starts_with("master")
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children.get_mut(i).and_then(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn store(dep: &Deployment) -> Limiter {
    let mut c = RedisConfig::new(dep.url());
    c.key_prefix = "test:sn:".into();
    c.tls_ca = dep.ca.clone();
    Limiter::new(
        &tokens_and_concurrency(),
        Arc::new(RedisStore::new(c).unwrap()),
    )
}

fn estimate(prompt: u64, output: u64) -> TokenEstimate {
    TokenEstimate { prompt, output }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_loses_no_admission_and_keeps_the_budgets() {
    let Some(dep) = Deployment::start("sentinel-failover") else {
        return;
    };
    failover_keeps_budgets(&dep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_over_tls_is_followed_too() {
    let Some(dep) = Deployment::start_with("sentinel-tls", true) else {
        return;
    };
    failover_keeps_budgets(&dep).await;
    // Without the CA the handshake with the sentinel fails: closed.
    let mut c = RedisConfig::new(dep.url());
    c.key_prefix = "test:sn:".into();
    let untrusting = Limiter::new(
        &tokens_and_concurrency(),
        Arc::new(RedisStore::new(c).unwrap()),
    );
    assert!(matches!(
        untrusting.admit(&req("x", 1, 1), estimate(1, 1)).await,
        Err(LimitError::Unavailable(_))
    ));
}

/// A manual failover on `dep`, between admissions of one store that knows only the sentinel.
async fn failover_keeps_budgets(dep: &Deployment) {
    let [first, second] = dep.servers;
    let l = store(dep);
    // 4,000 of tenant a's 6,000 tokens, on the first master; one of its two slots held.
    let held = l
        .admit(&req("a", 3000, 1000), estimate(3000, 1000))
        .await
        .unwrap();
    assert_eq!(held.headers().tokens.unwrap().remaining, 2000);
    let spent = Instant::now();
    assert_eq!(
        dep.cli(first, &["exists", "test:sn:b:p/tpm:{t:a}"]).trim(),
        "1"
    );
    wait_until(10, "the budget did not reach the replica", || {
        dep.cli(second, &["exists", "test:sn:b:p/tpm:{t:a}"]).trim() == "1"
    });

    // Until the sentinel has the replica's own `INFO`, it has no replica to promote
    // (`NOGOODSLAVE`).
    let mut out = String::new();
    wait_until(20, "the sentinel refused the failover", || {
        out = dep.cli(dep.sentinel, &["sentinel", "failover", "m"]);
        out.contains("OK")
    });
    wait_until(20, "the sentinel did not switch masters", || {
        dep.master_port() == second && dep.is_master(second)
    });
    // The old master is a replica now (it refuses writes): the store follows the sentinel.
    wait_until(20, "the old master did not turn into a replica", || {
        !dep.is_master(first)
    });
    let b = l
        .admit(&req("a", 1000, 500), estimate(1000, 500))
        .await
        .unwrap_or_else(|e| panic!("the first admission after the failover: {e:?}"));
    // The tokens spent before the failover are still spent: 2,000 were left, 1,500 are taken
    // now, plus what refilled meanwhile (100 a second). A new master without the replicated
    // budget would have 4,500 left.
    let left = b.headers().tokens.unwrap().remaining;
    let refilled = (100.0 * spent.elapsed().as_secs_f64()).ceil() as u64;
    assert!(
        left <= 500 + refilled && left < 4000,
        "{left} ({refilled} refilled)"
    );
    // Both slots are held (one taken before the failover, on the other server).
    match l.admit(&req("a", 1, 1), estimate(0, 0)).await {
        Err(LimitError::Exceeded(e)) => assert_eq!(e.kind, BudgetKind::Concurrency),
        other => panic!("{other:?}"),
    }
    // The new master holds what was written after the failover.
    assert_eq!(
        dep.cli(second, &["exists", "test:sn:b:p/tpm:{t:a}"]).trim(),
        "1"
    );
    // A slot taken before the failover is released on the new master.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match l.admit(&req("a", 1, 1), estimate(0, 0)).await {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "slot not released: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A master demoted behind the sentinel's back (`REPLICAOF` by hand: nothing closes the
/// clients' connections) refuses the admission's script with `READONLY`: the store drops the
/// connection, asks the sentinel again and sends the admission to the new master at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readonly_refusal_sends_the_admission_to_the_new_master() {
    let Some(mut dep) = Deployment::start("sentinel-readonly") else {
        return;
    };
    let [first, second] = dep.servers;
    let l = store(&dep);
    drop(l.admit(&req("r", 10, 10), estimate(10, 10)).await.unwrap());
    // Swap the roles with the sentinel down, then start it again naming the new master.
    dep.kill(2);
    assert!(dep.cli(second, &["replicaof", "no", "one"]).contains("OK"));
    let first_replicates = dep.cli(first, &["replicaof", "127.0.0.1", &second.to_string()]);
    assert!(first_replicates.contains("OK"), "{first_replicates}");
    wait_until(10, "the old master is still a master", || {
        !dep.is_master(first)
    });
    dep.start_sentinel(second);
    wait_until(10, "the sentinel does not name the new master", || {
        dep.master_port() == second
    });
    let admitted = l.admit(&req("r", 10, 10), estimate(10, 10)).await;
    assert!(admitted.is_ok(), "{admitted:?}");
    assert_eq!(
        dep.cli(second, &["exists", "test:sn:b:p/tpm:{t:r}"]).trim(),
        "1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_resume_on_the_promoted_replica_when_the_master_dies() {
    let Some(mut dep) = Deployment::start("sentinel-dies") else {
        return;
    };
    let [_, second] = dep.servers;
    let l = store(&dep);
    drop(l.admit(&req("t", 10, 10), estimate(10, 10)).await.unwrap());
    dep.kill(0);
    // While the master is gone and the sentinel still names it, a burst of admissions fails
    // at once without asking the sentinel for each: one failed lookup answers them all for a
    // while.
    let asked = || dep.sentinel_commands();
    let before = asked();
    let request = req("t", 10, 10);
    let burst =
        futures_util::future::join_all((0..200).map(|_| l.admit(&request, estimate(10, 10)))).await;
    let lookups = asked() - before;
    assert!(
        burst
            .iter()
            .all(|r| matches!(r, Err(LimitError::Unavailable(_)))),
        "{burst:?}"
    );
    assert!(
        lookups < 40,
        "{lookups} commands on the sentinel for 200 admissions"
    );
    // Closed while there is no master; open again once the sentinel has promoted the replica
    // (down after 1 s, then the election).
    let started = Instant::now();
    let mut refused = 0;
    loop {
        match l.admit(&req("t", 10, 10), estimate(10, 10)).await {
            Ok(_) => break,
            Err(LimitError::Unavailable(_)) => refused += 1,
            Err(e) => panic!("{e:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no admission 30 s after the master died"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused > 0, "the master's death went unnoticed");
    assert_eq!(dep.master_port(), second);
    assert_eq!(
        dep.cli(second, &["exists", "test:sn:b:p/tpm:{t:t}"]).trim(),
        "1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_flag_takes_a_sentinel_url_and_names_what_is_wrong() {
    let Some(dep) = Deployment::start("sentinel-flag") else {
        return;
    };
    let s = store_from_flags(&dep.url(), FailMode::Closed, Some("flag:")).unwrap();
    let l = Limiter::new(&tokens_and_concurrency(), s);
    let r = l
        .admit(&req("x", 100, 100), estimate(100, 100))
        .await
        .unwrap();
    assert_eq!(r.headers().tokens.unwrap().remaining, 5800);
    let [master, _] = dep.servers;
    assert_eq!(
        dep.cli(master, &["exists", "flag:b:p/tpm:{t:x}"]).trim(),
        "1"
    );
    // A master name the sentinel does not monitor: closed, not a panic or a hang.
    let url = format!("redis+sentinel://127.0.0.1:{}/other", dep.sentinel);
    let l = Limiter::new(
        &tokens_and_concurrency(),
        store_from_flags(&url, FailMode::Closed, None).unwrap(),
    );
    assert!(matches!(
        l.admit(&req("x", 1, 1), estimate(1, 1)).await,
        Err(LimitError::Unavailable(_))
    ));
    let e = store_from_flags(
        "redis+sentinel://:pw@127.0.0.1:26379",
        FailMode::Closed,
        None,
    )
    .err()
    .unwrap();
    assert!(e.contains("the master's name is missing"), "{e}");
    assert!(!e.contains("pw"), "{e}");
}
