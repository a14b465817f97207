//! The limiter over a real Redis Cluster: three `redis-server` masters in cluster mode, joined
//! with `redis-cli --cluster create`. Budgets are shared by replicas that know only one seed
//! node, the keys of different tenants land on different nodes, and concurrency leases of
//! tenants on different nodes are renewed (a renewal over keys of several hash slots would be
//! refused with `CROSSSLOT`).
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
    redis_cli, redis_installed, req, self_signed_localhost, spawn_redis, tokens_and_concurrency,
    wait_listening, wait_until,
};

/// Three cluster-mode masters sharing the 16,384 slots, killed on drop.
struct Cluster {
    children: Vec<Child>,
    /// Each node's `redis-server` arguments (to restart it as it was).
    args: Vec<Vec<String>>,
    ports: Vec<u16>,
    dir: PathBuf,
    /// With TLS (clients and the cluster bus): the nodes' certificate, their own CA (PEM).
    ca: Option<Vec<u8>>,
}

/// A free port whose cluster bus port (`port + 10000`) is free too.
fn free_port_pair() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if port > 55_000 {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    redis_cli(None, port, args)
}

impl Cluster {
    fn start(name: &str) -> Option<Cluster> {
        Self::start_with(name, false)
    }

    /// With `tls`, every node speaks only TLS, on its client port and its cluster bus, with a
    /// certificate for `127.0.0.1` (the address the nodes announce).
    fn start_with(name: &str, tls: bool) -> Option<Cluster> {
        if !redis_installed() {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("kinf-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = tls.then(|| self_signed_localhost(&dir));
        let mut c = Cluster {
            children: Vec::new(),
            args: Vec::new(),
            ports: Vec::new(),
            dir,
            ca,
        };
        let file = |f: &str| c.dir.join(f).to_str().unwrap().to_owned();
        let tls_args: Vec<String> = if tls {
            [
                "--tls-cert-file",
                &file("cert.pem"),
                "--tls-key-file",
                &file("key.pem"),
                "--tls-ca-cert-file",
                &file("cert.pem"),
                "--tls-auth-clients",
                "no",
                "--tls-cluster",
                "yes",
            ]
            .map(str::to_owned)
            .to_vec()
        } else {
            Vec::new()
        };
        for _ in 0..3 {
            let port = free_port_pair();
            let ports = if tls {
                ["--port", "0", "--tls-port"]
            } else {
                ["--tls-port", "0", "--port"]
            };
            let mut args: Vec<String> = ports.map(str::to_owned).to_vec();
            args.push(port.to_string());
            args.extend(tls_args.iter().cloned());
            for a in [
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                "--dir",
                c.dir.to_str().unwrap(),
            ] {
                args.push(a.to_owned());
            }
            c.children.push(spawn_redis(&args));
            c.args.push(args);
            c.ports.push(port);
        }
        wait_listening(&c.ports);
        let nodes: Vec<String> = c.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let tls_dir = tls.then(|| c.dir.clone());
        let created = redis_cli(tls_dir.as_deref(), c.ports[0], &args);
        assert!(created.contains("All 16384 slots covered"), "{created}");
        // Every node must see the cluster as up before it serves keys.
        for &p in &c.ports {
            wait_until(20, "the cluster did not come up", || {
                redis_cli(tls_dir.as_deref(), p, &["cluster", "info"]).contains("cluster_state:ok")
            });
        }
        Some(c)
    }

    /// Kills every node (their cluster configuration stays in their `nodes-PORT.conf`).
    fn stop_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts every node again as it was, and waits for the cluster to be up.
    fn restart_all(&mut self) {
        self.children = self.args.iter().map(|a| spawn_redis(a)).collect();
        wait_listening(&self.ports);
        let tls_dir = self.ca.as_ref().map(|_| self.dir.clone());
        for &p in &self.ports {
            wait_until(30, "the cluster did not come back", || {
                redis_cli(tls_dir.as_deref(), p, &["cluster", "info"]).contains("cluster_state:ok")
            });
        }
    }

    /// The URL naming only the first node: the client learns the others from it.
    fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "rediss" } else { "redis" };
        format!("{scheme}+cluster://127.0.0.1:{}", self.ports[0])
    }

    /// How many keys each node holds.
    fn keys_per_node(&self) -> Vec<u64> {
        let tls_dir = self.ca.as_ref().map(|_| self.dir.clone());
        self.ports
            .iter()
            .map(|&p| {
                redis_cli(tls_dir.as_deref(), p, &["dbsize"])
                    .trim()
                    .parse()
                    .unwrap_or(0)
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn replica(cluster: &Cluster, lease: Duration) -> Limiter {
    let mut c = RedisConfig::new(cluster.url());
    c.key_prefix = "test:cl:".into();
    c.lease = lease;
    c.tls_ca = cluster.ca.clone();
    Limiter::new(
        &tokens_and_concurrency(),
        Arc::new(RedisStore::new(c).unwrap()),
    )
}

fn estimate(prompt: u64, output: u64) -> TokenEstimate {
    TokenEstimate { prompt, output }
}

/// Two replicas share the budgets of 12 tenants (`{name}-0` …) on `cluster`, whose keys
/// spread over its nodes.
async fn replicas_share_budgets(cluster: &Cluster, name: &str) {
    let (r1, r2) = (
        replica(cluster, Duration::from_secs(60)),
        replica(cluster, Duration::from_secs(60)),
    );
    // Enough tenants that their hash tags fall on more than one node.
    let tenants: Vec<String> = (0..12).map(|i| format!("{name}-{i}")).collect();
    for t in &tenants {
        // Replica 1 takes 4,000 of the tenant's 6,000 tokens; replica 2 sees what is left.
        let a = r1.admit(&req(t, 3000, 1000), estimate(3000, 1000)).await;
        let a = a.unwrap_or_else(|e| panic!("{t}: {e:?}"));
        assert_eq!(a.headers().tokens.unwrap().remaining, 2000, "{t}");
        let b = r2
            .admit(&req(t, 1500, 500), estimate(1500, 500))
            .await
            .unwrap();
        // What refilled since (100 tokens a second) is left too.
        let left = b.headers().tokens.unwrap().remaining;
        assert!(left < 100, "{t}: {left}");
        // Two in flight: a third is refused for concurrency, on either replica.
        match r2.admit(&req(t, 1, 1), estimate(0, 0)).await {
            Err(LimitError::Exceeded(e)) => assert_eq!(e.kind, BudgetKind::Concurrency, "{t}"),
            other => panic!("{t}: {other:?}"),
        }
        // One finishes: its slot is free again for the other replica.
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(5);
        let c = loop {
            match r2.admit(&req(t, 1, 1), estimate(0, 0)).await {
                Ok(r) => break r,
                Err(e) => assert!(Instant::now() < deadline, "{t}: slot not released: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        drop((b, c));
    }
    let per_node = cluster.keys_per_node();
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() >= 2,
        "the tenants' keys are spread over the nodes: {per_node:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_budgets_in_a_cluster_across_its_nodes() {
    let Some(cluster) = Cluster::start("cluster-budgets") else {
        return;
    };
    replicas_share_budgets(&cluster, "tenant").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_of_tenants_on_different_nodes_are_renewed() {
    let Some(cluster) = Cluster::start("cluster-leases") else {
        return;
    };
    // Leases of 2 s, renewed every 667 ms.
    let r1 = replica(&cluster, Duration::from_secs(2));
    let r2 = replica(&cluster, Duration::from_secs(2));
    let tenants: Vec<String> = (0..8).map(|i| format!("team-{i}")).collect();
    let mut held = Vec::new();
    for t in &tenants {
        for _ in 0..2 {
            held.push(r1.admit(&req(t, 1, 1), estimate(0, 0)).await.unwrap());
        }
    }
    let per_node = cluster.keys_per_node();
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() >= 2,
        "{per_node:?}"
    );
    // Two and a half leases later every slot is still held.
    tokio::time::sleep(Duration::from_millis(5000)).await;
    for t in &tenants {
        match r2.admit(&req(t, 1, 1), estimate(0, 0)).await {
            Err(LimitError::Exceeded(e)) => assert_eq!(e.kind, BudgetKind::Concurrency, "{t}"),
            other => panic!("{t}: the lease of a request in flight expired: {other:?}"),
        }
    }
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_flag_takes_a_cluster_url_and_refuses_a_prefix_with_a_hash_tag() {
    let Some(cluster) = Cluster::start("cluster-flag") else {
        return;
    };
    let store = store_from_flags(&cluster.url(), FailMode::Closed, Some("flag:")).unwrap();
    let l = Limiter::new(&tokens_and_concurrency(), store);
    let r = l
        .admit(&req("x", 100, 100), estimate(100, 100))
        .await
        .unwrap();
    assert_eq!(r.headers().tokens.unwrap().remaining, 5800);
    let e = store_from_flags(&cluster.url(), FailMode::Closed, Some("kinf{x}:"))
        .err()
        .unwrap();
    assert!(
        e.contains("--limiter-key-prefix `kinf{x}:`: `{` and `}` are not allowed"),
        "{e}"
    );
    let e = store_from_flags("redis+cluster://127.0.0.1:1/3", FailMode::Closed, None)
        .err()
        .unwrap();
    assert!(e.contains("only database 0"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_fails_closed_for_its_tenants_only() {
    let Some(mut cluster) = Cluster::start("cluster-lost") else {
        return;
    };
    let r = replica(&cluster, Duration::from_secs(60));
    let tenants: Vec<String> = (0..12).map(|i| format!("org-{i}")).collect();
    for t in &tenants {
        drop(r.admit(&req(t, 10, 10), estimate(10, 10)).await.unwrap());
    }
    // Which node holds each tenant's keys (the others answer `MOVED`).
    let lost = cluster.ports[1];
    let on_lost: Vec<bool> = tenants
        .iter()
        .map(|t| cli(lost, &["exists", &format!("test:cl:b:p/tpm:{{t:{t}}}")]).trim() == "1")
        .collect();
    assert!(
        on_lost.iter().any(|&x| x) && !on_lost.iter().all(|&x| x),
        "{on_lost:?}"
    );
    let _ = cluster.children[1].kill();
    let _ = cluster.children[1].wait();
    for (t, &lost) in tenants.iter().zip(&on_lost) {
        let started = Instant::now();
        let got = r.admit(&req(t, 10, 10), estimate(10, 10)).await;
        match (lost, got) {
            (true, Err(LimitError::Unavailable(_))) | (false, Ok(_)) => {}
            (lost, other) => panic!("{t} (on the lost node: {lost}): {other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{t}: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_shares_budgets() {
    let Some(cluster) = Cluster::start_with("cluster-tls", true) else {
        return;
    };
    replicas_share_budgets(&cluster, "secure").await;
    // Without the CA the handshake fails: closed.
    let mut c = RedisConfig::new(cluster.url());
    c.key_prefix = "test:cl:".into();
    let untrusting = Limiter::new(
        &tokens_and_concurrency(),
        Arc::new(RedisStore::new(c).unwrap()),
    );
    assert!(matches!(
        untrusting.admit(&req("x", 1, 1), estimate(1, 1)).await,
        Err(LimitError::Unavailable(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_resume_when_the_whole_cluster_comes_back() {
    let Some(mut cluster) = Cluster::start("cluster-back") else {
        return;
    };
    let r = replica(&cluster, Duration::from_secs(60));
    drop(r.admit(&req("t", 10, 10), estimate(10, 10)).await.unwrap());
    cluster.stop_all();
    assert!(matches!(
        r.admit(&req("t", 10, 10), estimate(10, 10)).await,
        Err(LimitError::Unavailable(_))
    ));
    cluster.restart_all();
    // The same store (no restart of the gateway) reconnects.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut tenants = (0..12).map(|i| format!("back-{i}")).cycle();
    let mut served = 0;
    while served < 12 {
        let t = tenants.next().unwrap();
        match r.admit(&req(&t, 10, 10), estimate(10, 10)).await {
            Ok(_) => served += 1,
            Err(e) => {
                served = 0;
                assert!(Instant::now() < deadline, "not back: {e:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
