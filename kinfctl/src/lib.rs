//! `kinfctl` as a library: every command is a function writing to the given streams and
//! returning the process exit code, so tests call them directly.

pub mod classify;
pub mod cli;
pub mod crds;
pub mod explain;
pub mod explain_code;
pub mod graph;
pub mod input;
pub mod lint;
pub mod load;
pub mod report;
pub mod scenario;
pub mod test_cmd;
pub mod yaml_out;

use std::io::Write;

use cli::{Cli, Command};

/// Exit code: success.
pub const EXIT_OK: i32 = 0;
/// Exit code: findings (lint errors, failed test cases).
pub const EXIT_FINDINGS: i32 = 1;
/// Exit code: usage or I/O error.
pub const EXIT_USAGE: i32 = 2;

/// Runs a parsed command line.
pub fn run(cli: Cli, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    match cli.command {
        Command::Lint {
            paths,
            deny_warnings,
            format,
        } => lint::run(&paths, deny_warnings, format, out, err),
        Command::ExplainCode { code, all, format } => {
            explain_code::run(code.as_deref(), all, format, out, err)
        }
        Command::Crds { format } => crds::run_crds(format, out, err),
        Command::Schema { kind, format } => crds::run_schema(&kind, format, out, err),
        Command::Graph {
            paths,
            pool,
            format,
        } => graph::run(&paths, pool.as_deref(), format, out, err),
        Command::Explain {
            paths,
            request,
            state,
            format,
        } => explain::run(&paths, &request, state.as_deref(), format, out, err),
        Command::Test {
            paths,
            cases,
            format,
        } => test_cmd::run(&paths, &cases, format, out, err),
        Command::Classify {
            text,
            file,
            eval,
            config,
            format,
        } => {
            let input = match (&text, &file, &eval) {
                (Some(t), _, _) => classify::Input::Text(t),
                (_, Some(f), _) => classify::Input::File(f),
                (_, _, Some(e)) => classify::Input::Eval(e),
                _ => {
                    let e = report::Error::new(
                        report::ErrorKind::Usage,
                        "one of --text, --file or --eval is required",
                    );
                    return report::error(format == cli::Format::Json, out, err, e);
                }
            };
            classify::run(input, config.as_ref(), format, out, err)
        }
    }
}
