//! The `kinf-bench` library: the routing simulation (`sim`) and the results report (`report`),
//! shared by the binary and the integration tests.

pub mod report;
pub mod sim;
