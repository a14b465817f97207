//! Command-line interface definition.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Lint, explain and test Kinference policies offline. Never needs a cluster.
///
/// Exit codes: 0 success; 1 findings (lint errors, failed tests, rejected decisions are NOT
/// failures); 2 usage or I/O error.
#[derive(Debug, Parser)]
#[command(name = "kinfctl", version, about, long_about = None)]
pub struct Cli {
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Readable text.
    #[default]
    Human,
    /// One JSON document on stdout.
    Json,
}

/// Output format of `graph`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// Readable text.
    #[default]
    Text,
    /// Graphviz.
    Dot,
    /// JSON.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check resources (files or directories of YAML) and report every problem.
    Lint {
        /// Files or directories; directories are read recursively (`*.yaml`, `*.yml`).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Exit 1 on warnings too.
        #[arg(long)]
        deny_warnings: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Show the long explanation of a diagnostic code, with a wrong and a right example.
    ExplainCode {
        /// A code such as `KINF0101`; omit with `--all` to print the whole catalogue.
        code: Option<String>,
        /// Print every code (as the Markdown of docs/diagnostics.md).
        #[arg(long)]
        all: bool,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Print the CustomResourceDefinitions of all five resources as YAML.
    Crds {
        /// Output format (`human` is YAML).
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Print the JSON Schema of one resource kind.
    Schema {
        /// `InferencePolicy`, `InferencePool`, `InferenceWorkerSet`, `InferenceProvider` or `GatewayBackend`.
        kind: String,
        /// Output format (the schema is JSON either way).
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Show the compiled rule DAG of each pool.
    Graph {
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Only this pool (`name` or `namespace/name`).
        #[arg(long)]
        pool: Option<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: GraphFormat,
    },
    /// Decide one request against the policies and a cluster state, and explain why.
    Explain {
        /// Files or directories.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The request (YAML): `model`, and optionally `tenant`, `tags`, `qos`, `promptTokens`,
        /// `maxTokens`, `stream`, `headers`, `prompt`, `pool`.
        #[arg(long)]
        request: PathBuf,
        /// The cluster state (YAML): `endpoints` and `providers`. Absent: everything ready,
        /// idle, with an empty cache.
        #[arg(long)]
        state: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Run golden decision tests: each case holds a request, a state and the expected outcome.
    Test {
        /// Files or directories of policies.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// A case file or a directory of case files.
        #[arg(long, required = true)]
        cases: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
    /// Run the built-in classifiers (PII, complexity) on a prompt and print tags and redacted
    /// matches, or evaluate them against a labelled JSONL file (`--eval`).
    Classify {
        /// The prompt text (one user message).
        #[arg(long, conflicts_with_all = ["file", "eval"])]
        text: Option<String>,
        /// A request body, read as the gateway reads it: OpenAI chat or Anthropic messages
        /// (`system`, every message, tool calls and results), a completions `prompt`, or
        /// `{"text": ...}`. A file that is not a JSON object is one user message.
        #[arg(long, conflicts_with = "eval")]
        file: Option<PathBuf>,
        /// A labelled JSONL file: one request per line, read as `--file` reads one, with its
        /// expected `tags`; prints per-tag precision and recall.
        #[arg(long)]
        eval: Option<PathBuf>,
        /// A bundle directory: use the classifiers of its first GatewayBackend. Absent: PII
        /// (all entities) and complexity.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        format: Format,
    },
}
