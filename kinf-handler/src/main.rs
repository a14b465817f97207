//! `kinference`: the Kinference gateway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use kinf_handler::gateway::runtime::UnknownHosts;
use kinf_handler::serve::{ServeOptions, serve};

/// mimalloc: the request path (parsed bodies, token ids, decisions, response taps) and policy
/// compilation are many small, short-lived allocations, several per request; mimalloc's
/// thread-local free lists make them cheaper than glibc's and keep them off shared locks.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Kinference: an inference gateway that routes OpenAI- and Anthropic-compatible requests to
/// vLLM workers by declarative policy.
#[derive(Parser, Debug)]
#[command(name = "kinference", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the gateway on a directory of YAML resources (reloaded live).
    Serve(ServeArgs),
}

/// Flags of `kinference serve` (documented in docs/reference/kinference.md).
#[derive(Args, Debug)]
struct ServeArgs {
    /// Directory (or file) of InferencePolicy, InferenceWorkerSet, InferenceProvider,
    /// InferencePool and GatewayBackend resources. Not with `--kubernetes` (relative
    /// tokenizer paths then resolve against the working directory).
    #[arg(long, required_unless_present = "kubernetes")]
    config: Option<PathBuf>,
    /// Read the resources from the Kubernetes API (in-cluster service account, or
    /// `KUBECONFIG`): watch the five CRDs, Pods and referenced Secrets; write status when
    /// holding the Lease. See docs/reference/kubernetes.md.
    #[arg(long, conflicts_with = "config")]
    kubernetes: bool,
    /// Namespace watched in Kubernetes mode. Absent: every namespace (needs a ClusterRole).
    #[arg(long, value_parser = parse_namespace)]
    namespace: Option<String>,
    /// Lease for status-writer election in Kubernetes mode: `NAMESPACE/NAME` or `NAME` (in
    /// `--namespace`, else `default`). Default: `kinference-leader`.
    #[arg(long, value_parser = parse_lease)]
    lease: Option<String>,
    /// This replica's identity in the Lease. Default: `$POD_NAME`, else `$HOSTNAME`, else the
    /// kernel's host name, else `kinference-<pid>`.
    #[arg(long, value_parser = parse_identity)]
    identity: Option<String>,
    /// Kubernetes mode: namespaces (comma-separated, or `*` for all) whose Bedrock providers
    /// without a `secretRef` may sign with this process's own `AWS_*` credentials. Default:
    /// none, so that whoever may write an InferenceProvider cannot spend the controller's AWS
    /// identity.
    #[arg(long, conflicts_with = "config", value_parser = kinf_handler::providers::credentials::AmbientAws::parse)]
    ambient_aws_credentials: Option<kinf_handler::providers::credentials::AmbientAws>,
    /// Client-facing address (`/v1/*`, `/healthz`, `/readyz`, `/metrics`). Port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Admin address (`/admin/status`, `/metrics`, `/healthz`, `/readyz`). With it, `/metrics`
    /// and `/admin/status` are not served on `--listen`. Absent: they are on `--listen`.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// gRPC address: the `kinference.handler.v1.Handler` decision service and Envoy's
    /// external-processing service. Absent: no gRPC.
    #[arg(long)]
    grpc_listen: Option<SocketAddr>,
    /// How often the `--config` directory is checked for changes, e.g. `1s`, `500ms`. Not used
    /// with `--kubernetes` (changes come from the API server's watches).
    #[arg(long, default_value = "1s", value_parser = parse_positive_duration)]
    reload_interval: Duration,
    /// Longest wait for an upstream's response headers, e.g. `600s`.
    #[arg(long, default_value = "600s", value_parser = parse_positive_duration)]
    upstream_timeout: Duration,
    /// Token-rate-limit store: `memory` (one replica), or Redis shared by replicas:
    /// `redis://[USER][:PASS@]HOST[:PORT][/DB]` (`rediss://` over TLS), `redis+unix:///PATH?db=N`,
    /// a Redis Cluster, `redis+cluster://[USER][:PASS@]HOST:PORT[,HOST:PORT...]`
    /// (`rediss+cluster://` over TLS), or the master of a Redis Sentinel deployment,
    /// `redis+sentinel://[USER][:PASS@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]`
    /// (`rediss+sentinel://` over TLS). A URL
    /// with a password is better given in `KINF_LIMITER_STORE`, which `ps` does not show.
    #[arg(
        long,
        env = "KINF_LIMITER_STORE",
        hide_env_values = true,
        default_value = "memory"
    )]
    limiter_store: String,
    /// When Redis is unreachable: `open` admits (and counts it), `closed` refuses with 503.
    #[arg(long, default_value = "closed", value_parser = ["open", "closed"])]
    limiter_fail_mode: String,
    /// Prefix of the limiter's Redis keys (several gateways can share one Redis).
    #[arg(long, default_value = "kinf:rl:")]
    limiter_key_prefix: String,
    /// PEM file of the certificate authorities that sign the Redis servers' TLS certificates,
    /// for a `rediss://` or `rediss+cluster://` store (default: the system's trust store).
    #[arg(long, value_name = "FILE")]
    limiter_tls_ca: Option<PathBuf>,
    /// PEM file of the client certificate (chain) presented to Redis over TLS, for servers that
    /// ask for one; needs --limiter-tls-key.
    #[arg(long, value_name = "FILE", requires = "limiter_tls_key")]
    limiter_tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --limiter-tls-cert.
    #[arg(long, value_name = "FILE", requires = "limiter_tls_cert")]
    limiter_tls_key: Option<PathBuf>,
    /// YAML file of service objectives whose attainment is exported (docs/reference/metrics.md).
    #[arg(long)]
    slo_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// Largest request head on the HTTP listeners: header names and values, 4 bytes more per
    /// header (`64Ki`). Past it: 431.
    #[arg(long, default_value = "64Ki", value_parser = parse_bytes)]
    max_header_bytes: usize,
    /// Most request headers on the HTTP listeners. Past it: 431.
    #[arg(long, default_value_t = kinf_handler::listen::DEFAULT_MAX_HEADERS)]
    max_headers: usize,
    /// Deadline for a client to send its first request head from the connection's start (and,
    /// on HTTP/1, each later one); the connection is closed after it.
    #[arg(long, default_value = "30s", value_parser = parse_positive_duration)]
    header_read_timeout: Duration,
    /// Deadline for a client to send its whole request body. Past it: 408.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration)]
    body_read_timeout: Duration,
    /// PEM certificate chain: every listener (HTTP, admin, gRPC) serves TLS. Needs `--tls-key`.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Threads that serve requests (the async runtime's workers). Default: the CPUs this
    /// process may use (its cgroup's CPU limit included). Long prompts are tokenized on a
    /// separate blocking pool.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    worker_threads: Option<u16>,
    /// Keep the event loop polling for this long after request activity instead of sleeping
    /// (e.g. `200us`): lower latency on VMs whose idle CPUs halt, at the cost of up to one
    /// core while requests keep coming. Implies one worker thread. Off by default.
    #[arg(long, value_parser = parse_duration, conflicts_with = "worker_threads")]
    busy_poll: Option<Duration>,
    /// A request whose `Host` no GatewayBackend lists, when every GatewayBackend lists its
    /// hosts: `first-door` serves it at the first (oldest) one, `reject` answers 404
    /// `unknown_host`. A GatewayBackend without `hosts` always catches such requests.
    #[arg(long, default_value = "first-door", value_parser = parse_unknown_hosts)]
    unknown_hosts: UnknownHosts,
    /// On SIGTERM or SIGINT: answer `/readyz` with 503 and give up the Lease at once, keep
    /// accepting connections this long (so that load balancers stop sending requests), then
    /// stop accepting and let open requests finish (up to 30 s). E.g. `5s`.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    shutdown_delay: Duration,
}

impl ServeArgs {
    fn options(&self) -> ServeOptions {
        ServeOptions {
            config: self.config.clone().unwrap_or_else(|| PathBuf::from(".")),
            kubernetes: self.kubernetes.then(|| self.kube_options()),
            listen: self.listen,
            admin_listen: self.admin_listen,
            grpc_listen: self.grpc_listen,
            reload_interval: self.reload_interval,
            upstream_timeout: self.upstream_timeout,
            limiter_store: self.limiter_store.clone(),
            limiter_tls_ca: self.limiter_tls_ca.clone(),
            limiter_tls_client: self
                .limiter_tls_cert
                .clone()
                .zip(self.limiter_tls_key.clone()),
            limiter_fail_mode: if self.limiter_fail_mode == "open" {
                kinf_handler::tenants::FailMode::Open
            } else {
                kinf_handler::tenants::FailMode::Closed
            },
            limiter_key_prefix: Some(self.limiter_key_prefix.clone()),
            slo_file: self.slo_file.clone(),
            http_limits: kinf_handler::listen::HttpLimits {
                max_header_bytes: self.max_header_bytes,
                max_headers: self.max_headers,
                header_read_timeout: self.header_read_timeout,
            },
            body_read_timeout: self.body_read_timeout,
            tls: match (&self.tls_cert, &self.tls_key) {
                (Some(cert), Some(key)) => Some(kinf_handler::listen::TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => None,
            },
            unknown_hosts: self.unknown_hosts,
            shutdown_delay: self.shutdown_delay,
        }
    }
}

impl ServeArgs {
    fn kube_options(&self) -> kinf_handler::kube::KubeOptions {
        let identity = self.identity.clone().unwrap_or_else(|| {
            kinf_handler::kube::default_identity(
                |k| std::env::var(k).ok(),
                std::path::Path::new(kinf_handler::kube::HOSTNAME_FILE),
            )
        });
        let mut k = kinf_handler::kube::KubeOptions::new(self.namespace.clone(), identity);
        match self.lease.as_deref().map(|l| l.split_once('/').ok_or(l)) {
            Some(Ok((ns, name))) => {
                k.lease_namespace = ns.to_owned();
                k.lease_name = name.to_owned();
            }
            Some(Err(name)) => k.lease_name = name.to_owned(),
            None => {}
        }
        k.ambient_aws = self.ambient_aws_credentials.clone().unwrap_or_default();
        k
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    kinf_grammar::parse_duration(s).map_err(|e| e.to_string())
}

/// A duration above zero: a zero reload interval would stop reloads (the polling timer
/// refuses it), and zero timeouts would fail every request.
fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("must be more than 0, e.g. `1s` or `500ms`".into());
    }
    Ok(d)
}

/// Why `s` is not a DNS label (RFC 1123: a namespace name), if it is not one.
fn dns_label_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() || s.len() > 63 {
        return Some("1 to 63 characters");
    }
    dns_chars_problem(s, false)
}

/// Why `s` is not a DNS subdomain (RFC 1123: most object names), if it is not one.
fn dns_subdomain_problem(s: &str) -> Option<&'static str> {
    if s.is_empty() || s.len() > 253 {
        return Some("1 to 253 characters");
    }
    dns_chars_problem(s, true)
}

fn dns_chars_problem(s: &str, dots: bool) -> Option<&'static str> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    if !s.chars().all(|c| allowed(c) || (dots && c == '.')) {
        return Some(if dots {
            "lowercase letters, digits, `-` and `.`"
        } else {
            "lowercase letters, digits and `-`"
        });
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(s.chars().next()) || !alnum(s.chars().last()) {
        return Some("starting and ending with a letter or digit");
    }
    None
}

fn parse_namespace(s: &str) -> Result<String, String> {
    match dns_label_problem(s) {
        Some(p) => Err(format!("not a namespace name: expected {p}")),
        None => Ok(s.to_owned()),
    }
}

/// `NAMESPACE/NAME` or `NAME`, each a valid Kubernetes name. The name leaves room for the
/// `-last-good` ConfigMap named after it.
fn parse_lease(s: &str) -> Result<String, String> {
    let (ns, name) = match s.split_once('/') {
        Some((ns, name)) => (Some(ns), name),
        None => (None, s),
    };
    if let Some(p) = ns.and_then(dns_label_problem) {
        return Err(format!(
            "expected `NAMESPACE/NAME` or `NAME`; the namespace must be {p}"
        ));
    }
    let configmap = kinf_handler::kube::last_good::config_map_name(name);
    if let Some(p) = dns_subdomain_problem(name).or_else(|| dns_subdomain_problem(&configmap)) {
        return Err(format!(
            "expected `NAMESPACE/NAME` or `NAME`; the name must be {p} (with `-last-good` \
             appended, for the ConfigMap that keeps the last good policy)"
        ));
    }
    Ok(s.to_owned())
}

fn parse_identity(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be empty".into());
    }
    Ok(s.to_owned())
}

fn parse_unknown_hosts(s: &str) -> Result<UnknownHosts, String> {
    s.parse()
}

fn parse_bytes(s: &str) -> Result<usize, String> {
    let n = kinf_grammar::parse_quantity(s).map_err(|e| e.to_string())?;
    usize::try_from(n).map_err(|_| format!("`{s}` is not a byte count"))
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KINFERENCE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
}

fn main() -> ExitCode {
    let Command::Serve(args) = Cli::parse().command;
    if !args.kubernetes {
        let given: Vec<&str> = [
            ("--namespace", args.namespace.is_some()),
            ("--lease", args.lease.is_some()),
            ("--identity", args.identity.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, set)| set.then_some(flag))
        .collect();
        if !given.is_empty() {
            let verb = if given.len() == 1 { "needs" } else { "need" };
            eprintln!("error: `{}` {verb} `--kubernetes`", given.join("`, `"));
            return ExitCode::from(2);
        }
    }
    init_logs(&args.log_format);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = args.worker_threads {
        builder.worker_threads(usize::from(n));
    }
    if args.busy_poll.is_some() {
        // One worker: a second one would sleep in `epoll_wait` holding the I/O driver.
        builder.worker_threads(1);
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(window) = args.busy_poll {
        let _guard = rt.enter();
        kinf_handler::busy_poll::start(window);
    }
    match rt.block_on(serve(args.options(), kinf_handler::live_hook())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
