//! Concurrent streamed responses per tenant (`limits.maxConcurrentStreamsPerTenant`): a count
//! taken when a streamed request is admitted and given back when its response body is dropped,
//! however the stream ends (completed, client gone, upstream failed, refused before a byte).

use std::sync::Arc;

use ahash::AHashMap;
use parking_lot::Mutex;

/// Streams in flight per tenant.
#[derive(Debug, Default)]
pub struct StreamCounter {
    counts: Mutex<AHashMap<Arc<str>, u32>>,
}

/// One stream in flight; dropping it gives the slot back.
#[derive(Debug)]
pub struct StreamSlot {
    counter: Arc<StreamCounter>,
    tenant: Arc<str>,
}

impl StreamCounter {
    /// A counter with no stream in flight.
    pub fn new() -> Arc<Self> {
        Arc::new(StreamCounter::default())
    }

    /// A slot for `tenant` when it has fewer than `max` streams in flight, else `None`.
    pub fn try_acquire(self: &Arc<Self>, tenant: &Arc<str>, max: u32) -> Option<StreamSlot> {
        let mut counts = self.counts.lock();
        let n = counts.entry(tenant.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            counter: self.clone(),
            tenant: tenant.clone(),
        })
    }

    /// Streams `tenant` has in flight.
    pub fn in_flight(&self, tenant: &str) -> u32 {
        self.counts.lock().get(tenant).copied().unwrap_or(0)
    }

    /// Streams in flight, all tenants together.
    pub fn total(&self) -> u64 {
        self.counts.lock().values().map(|&n| u64::from(n)).sum()
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut counts = self.counter.counts.lock();
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_per_tenant_and_given_back_on_drop() {
        let c = StreamCounter::new();
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        let s1 = c.try_acquire(&a, 2);
        let s2 = c.try_acquire(&a, 2);
        assert!(s1.is_some() && s2.is_some());
        assert!(
            c.try_acquire(&a, 2).is_none(),
            "a third stream over a limit of 2"
        );
        assert!(
            c.try_acquire(&b, 2).is_some(),
            "another tenant is not affected"
        );
        assert_eq!(c.in_flight("a"), 2);
        drop(s1);
        assert_eq!(c.in_flight("a"), 1);
        let s3 = c.try_acquire(&a, 2);
        assert!(s3.is_some());
        drop((s2, s3));
        assert_eq!(c.in_flight("a"), 0);
        assert_eq!(c.total(), 0);
    }
}
