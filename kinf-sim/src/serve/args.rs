//! Command-line arguments of `kinf-sim serve`.

use std::path::PathBuf;

use clap::Parser;

use super::faults::Faults;

/// `kinf-sim serve`: a real-time simulated vLLM 0.32 worker.
#[derive(Debug, Clone, Parser)]
#[command(name = "serve", args_override_self = true)]
pub struct ServeArgs {
    /// HTTP port (0: any free port; the bound port is printed at startup).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Address to bind the HTTP, KV-event and replay sockets to.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Model path or name (vLLM `--model`; reported as `root` by `/v1/models`).
    #[arg(long)]
    pub model: String,
    /// Names the model is served under (default: `--model`); the first labels `/metrics`.
    #[arg(long = "served-model-name", num_args = 1..)]
    pub served_model_name: Vec<String>,
    /// Publish KV events on a ZMQ PUB socket bound to this port (0: any free port).
    #[arg(long)]
    pub kv_events_port: Option<u16>,
    /// Serve KV-event replay on a ZMQ ROUTER socket bound to this port (0: any free port).
    /// Needs `--kv-events-port`: replay serves the events published there.
    #[arg(long, requires = "kv_events_port")]
    pub replay_port: Option<u16>,
    /// ZMQ topic of the KV-event messages (vLLM's default: empty).
    #[arg(long, default_value = "")]
    pub topic: String,
    /// Engine profile (l40s-qwen27b-fp8, h100-llama70b, tiny).
    #[arg(long, default_value = "tiny")]
    pub profile: String,
    /// Simulated seconds per wall-clock second (1: real time; 100: a hundred times faster).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Directory with `tokenizer.json` (and `tokenizer_config.json`) to tokenize exactly like
    /// vLLM; without it a deterministic built-in tokenizer is used.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// KV block size in tokens (default: the profile's).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// KV-cache capacity in blocks (default: the profile's).
    #[arg(long)]
    pub num_gpu_blocks: Option<u32>,
    /// Maximum model length in tokens (default: the profile's).
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// Seed of generated tokens, ids and fault decisions.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV-event messages kept for replay (vLLM `buffer_steps`).
    #[arg(long, default_value_t = 10_000)]
    pub replay_buffer: usize,
    /// Fault injection (also settable at run time with `POST /sim/faults`).
    #[command(flatten)]
    pub faults: Faults,
}

impl ServeArgs {
    /// Parses arguments as given after `kinf-sim serve` (for in-process tests).
    pub fn from_args<I, S>(args: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        let all = std::iter::once(std::ffi::OsString::from("serve"))
            .chain(args.into_iter().map(Into::into));
        Self::try_parse_from(all).map_err(|e| e.to_string())
    }

    /// The names the model is served under.
    pub fn served_names(&self) -> Vec<String> {
        if self.served_model_name.is_empty() {
            vec![self.model.clone()]
        } else {
            self.served_model_name.clone()
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::ServeArgs;

    #[test]
    fn a_replay_port_without_a_kv_events_port_is_refused_naming_both_flags() {
        let err = ServeArgs::from_args(["--model", "m", "--replay-port", "0"])
            .expect_err("replay needs the KV-event socket it replays");
        assert!(err.contains("--replay-port"), "{err}");
        assert!(err.contains("--kv-events-port"), "{err}");
        let ok = ServeArgs::from_args([
            "--model",
            "m",
            "--kv-events-port",
            "0",
            "--replay-port",
            "0",
        ])
        .expect("both flags together are accepted");
        assert_eq!((ok.kv_events_port, ok.replay_port), (Some(0), Some(0)));
    }
}
