//! `--busy-poll`: the poller spins after activity and stops spinning once its window has passed.
//! Measured as this process's CPU time (Linux `/proc/self/task/*/schedstat`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use kinf_handler::busy_poll::BusyPoll;

/// CPU time of all of this process's threads, in milliseconds.
fn cpu_ms() -> f64 {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").expect("procfs") {
        let path = task.expect("task").path().join("schedstat");
        if let Ok(s) = std::fs::read_to_string(path) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e6
}

#[test]
fn spins_inside_the_window_and_sleeps_outside_it() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let poller = Arc::new(BusyPoll::new(Duration::from_millis(60)));
    rt.spawn(poller.clone().run());

    // Past the start-up window: the worker sleeps.
    std::thread::sleep(Duration::from_millis(150));
    let before = cpu_ms();
    std::thread::sleep(Duration::from_millis(150));
    let idle = cpu_ms() - before;
    assert!(
        idle < 15.0,
        "idle poller used {idle:.1} ms of CPU in 150 ms"
    );

    // Activity: the worker spins for the window.
    let before = cpu_ms();
    poller.touch();
    std::thread::sleep(Duration::from_millis(60));
    let spun = cpu_ms() - before;
    assert!(
        spun > 5.0,
        "poller used only {spun:.1} ms of CPU in its 60 ms window"
    );

    // And goes back to sleep after it.
    std::thread::sleep(Duration::from_millis(60));
    let before = cpu_ms();
    std::thread::sleep(Duration::from_millis(150));
    let after = cpu_ms() - before;
    assert!(
        after < 15.0,
        "poller kept spinning: {after:.1} ms of CPU in 150 ms"
    );

    // A touch while asleep wakes it again (the wake-up is not lost).
    let before = cpu_ms();
    poller.touch();
    std::thread::sleep(Duration::from_millis(60));
    let again = cpu_ms() - before;
    assert!(
        again > 5.0,
        "second touch did not wake the poller ({again:.1} ms)"
    );
}
