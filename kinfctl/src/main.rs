//! `kinfctl`: lint, explain and test Kinference policies offline.

use clap::Parser;

/// mimalloc: `lint` of a large bundle spends about a third of its instructions in the system
/// allocator (the YAML tree, typed specs and compiled rules are many small allocations).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = kinfctl::cli::Cli::parse();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let code = kinfctl::run(cli, &mut stdout.lock(), &mut stderr.lock());
    std::process::exit(code);
}
