//! `kinference`: the Kinference gateway.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use kinf_handler::serve::{ServeOptions, serve};

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
    /// InferencePool and GatewayBackend resources.
    #[arg(long)]
    config: PathBuf,
    /// Client-facing address (`/v1/*`, `/healthz`, `/readyz`, `/metrics`). Port 0 picks one.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Admin address (`/admin/status`, `/metrics`). Absent: admin routes are on `--listen`.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// gRPC address: the `kinference.handler.v1.Handler` decision service and Envoy's
    /// external-processing service. Absent: no gRPC.
    #[arg(long)]
    grpc_listen: Option<SocketAddr>,
    /// How often the configuration is checked for changes, e.g. `1s`, `500ms`.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    reload_interval: Duration,
    /// Longest wait for an upstream's response headers, e.g. `600s`.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    upstream_timeout: Duration,
    /// Token-rate-limit store: `memory` (one replica) or `redis://HOST:PORT/DB` (shared by
    /// replicas).
    #[arg(long, default_value = "memory")]
    limiter_store: String,
    /// When Redis is unreachable: `open` admits (and counts it), `closed` refuses with 503.
    #[arg(long, default_value = "closed", value_parser = ["open", "closed"])]
    limiter_fail_mode: String,
    /// Prefix of the limiter's Redis keys.
    #[arg(long)]
    limiter_key_prefix: Option<String>,
    /// YAML file of service objectives whose attainment is exported (docs/reference/metrics.md).
    #[arg(long)]
    slo_file: Option<PathBuf>,
    /// Log format.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

impl ServeArgs {
    fn options(&self) -> ServeOptions {
        ServeOptions {
            config: self.config.clone(),
            listen: self.listen,
            admin_listen: self.admin_listen,
            grpc_listen: self.grpc_listen,
            reload_interval: self.reload_interval,
            upstream_timeout: self.upstream_timeout,
            limiter_store: self.limiter_store.clone(),
            limiter_fail_mode: if self.limiter_fail_mode == "open" {
                kinf_handler::tenants::FailMode::Open
            } else {
                kinf_handler::tenants::FailMode::Closed
            },
            limiter_key_prefix: self.limiter_key_prefix.clone(),
            slo_file: self.slo_file.clone(),
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    kinf_grammar::parse_duration(s).map_err(|e| e.to_string())
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
    init_logs(&args.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(serve(args.options(), kinf_handler::live_hook())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}
