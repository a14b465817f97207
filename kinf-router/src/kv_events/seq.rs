//! Sequence tracking per publisher.

/// What one observed sequence number means relative to the ones seen before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStatus {
    /// The expected next number: apply the batch.
    InOrder,
    /// Lower than expected (already applied, e.g. a replay overlapping the live stream): drop it.
    Duplicate,
    /// Numbers `expected..got` were missed. Apply nothing that depends on them: ask the replay
    /// socket for `expected` onwards, or reset the endpoint's index.
    Gap {
        /// The first missing sequence number.
        expected: i64,
        /// The number received.
        got: i64,
    },
    /// The live stream went back to 0: the publisher restarted (its cache is empty), so the
    /// endpoint's index should be cleared. Only [`SeqTracker::observe`] reports this.
    Restart {
        /// The number that was expected.
        expected: i64,
    },
}

/// Tracks the sequence numbers of one publisher (one vLLM engine / data-parallel rank).
///
/// vLLM numbers batches from 0 per publisher process. A fresh tracker expects 0, so joining a
/// running publisher reports a [`SeqStatus::Gap`] from 0 — which is right: the index lacks the
/// blocks stored before, and a replay from 0 (or from the oldest buffered batch) recovers them.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    expected: i64,
    gaps: u64,
    missed: u64,
    duplicates: u64,
    restarts: u64,
}

impl SeqTracker {
    /// A tracker expecting sequence 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// A tracker expecting `next` (e.g. after a reset that chose to skip history).
    pub fn starting_at(next: i64) -> Self {
        Self {
            expected: next,
            ..Self::default()
        }
    }

    /// Classifies a sequence number from the live `SUB` stream and advances the tracker.
    ///
    /// A `0` after other numbers is a [`SeqStatus::Restart`]; every other lower number is a
    /// [`SeqStatus::Duplicate`]. After a gap or a restart the tracker expects `got + 1`.
    pub fn observe(&mut self, seq: i64) -> SeqStatus {
        if seq == 0 && self.expected > 0 {
            let expected = self.expected;
            self.restarts += 1;
            self.expected = 1;
            return SeqStatus::Restart { expected };
        }
        self.observe_replayed(seq)
    }

    /// Classifies a sequence number received from the replay socket (never a restart: a replay
    /// can legitimately start at 0).
    pub fn observe_replayed(&mut self, seq: i64) -> SeqStatus {
        let expected = self.expected;
        if seq == expected {
            self.expected = seq.saturating_add(1);
            SeqStatus::InOrder
        } else if seq < expected {
            self.duplicates += 1;
            SeqStatus::Duplicate
        } else {
            self.gaps += 1;
            self.missed = self.missed.saturating_add(seq.abs_diff(expected));
            self.expected = seq.saturating_add(1);
            SeqStatus::Gap { expected, got: seq }
        }
    }

    /// The next sequence number expected.
    pub fn expected(&self) -> i64 {
        self.expected
    }

    /// Number of gaps seen.
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Total number of batches skipped over by gaps.
    pub fn missed(&self) -> u64 {
        self.missed
    }

    /// Number of duplicates dropped.
    pub fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Number of publisher restarts seen.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gap_duplicate_restart() {
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(0), SeqStatus::InOrder);
        assert_eq!(t.observe(1), SeqStatus::InOrder);
        assert_eq!(
            t.observe(4),
            SeqStatus::Gap {
                expected: 2,
                got: 4
            }
        );
        assert_eq!(t.gaps(), 1);
        assert_eq!(t.missed(), 2);
        assert_eq!(t.observe(3), SeqStatus::Duplicate);
        assert_eq!(t.observe(5), SeqStatus::InOrder);
        assert_eq!(t.observe(0), SeqStatus::Restart { expected: 6 });
        assert_eq!(t.observe(1), SeqStatus::InOrder);
        assert_eq!(t.restarts(), 1);
        assert_eq!(t.duplicates(), 1);
    }

    #[test]
    fn late_join_is_a_gap_from_zero_and_replay_fills_it() {
        let mut live = SeqTracker::new();
        assert_eq!(
            live.observe(57),
            SeqStatus::Gap {
                expected: 0,
                got: 57
            }
        );
        // The server replays 0..57 through its own tracker.
        let mut replay = SeqTracker::new();
        for s in 0..57 {
            assert_eq!(replay.observe_replayed(s), SeqStatus::InOrder);
        }
        assert_eq!(replay.observe_replayed(57), SeqStatus::InOrder);
    }

    #[test]
    fn replay_from_zero_is_not_a_restart() {
        let mut t = SeqTracker::starting_at(0);
        assert_eq!(t.observe_replayed(0), SeqStatus::InOrder);
        assert_eq!(t.observe_replayed(0), SeqStatus::Duplicate);
    }
}
