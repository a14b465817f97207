//! The Kinference server's building blocks. This first slice holds the configuration side:
//! reading a directory of YAML resources ([`config_dir`]) and the live policy store
//! ([`policy_store`]) that swaps a compiled policy in atomically and only when the whole bundle
//! compiles, keeping the last good one in force otherwise.

pub mod config_dir;
pub mod policy_store;

pub use policy_store::{ApplyOutcome, PolicyStore};
