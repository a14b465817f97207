//! `kinfctl`: lint, explain and test Kinference policies offline.

use clap::Parser;

fn main() {
    let cli = kinfctl::cli::Cli::parse();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let code = kinfctl::run(cli, &mut stdout.lock(), &mut stderr.lock());
    std::process::exit(code);
}
