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
    /// Set by [`rebase_after_reset`](Self::rebase_after_reset): the first missing number of
    /// the gap the endpoint's index was reset for.
    rebase_from: Option<i64>,
    rebases: u64,
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
    /// [`SeqStatus::Duplicate`], except after [`rebase_after_reset`](Self::rebase_after_reset).
    /// After a gap or a restart the tracker expects `got + 1`.
    pub fn observe(&mut self, seq: i64) -> SeqStatus {
        if seq == 0 && self.expected > 0 {
            let expected = self.expected;
            self.restarts += 1;
            self.expected = 1;
            self.rebase_from = None;
            return SeqStatus::Restart { expected };
        }
        if let Some(from) = self.rebase_from {
            if seq >= self.expected {
                // The stream went on after the number that opened the gap: it was genuine.
                self.rebase_from = None;
            } else if seq >= from {
                // The gap's number was bogus (or the publisher's numbering jumped back): the
                // stream continues where it was before it. Whatever the index held was reset.
                self.rebase_from = None;
                self.rebases += 1;
                self.expected = seq.saturating_add(1);
                return SeqStatus::InOrder;
            }
        }
        self.observe_replayed(seq)
    }

    /// The endpoint's index was reset because the gap `SeqStatus::Gap { expected: from, .. }`
    /// could not be filled. If the number that opened the gap was bogus (a corrupt or forged
    /// frame, far ahead of the publisher), every genuine batch after it would look like a
    /// duplicate until the publisher restarted: so the next live number from `from` on that
    /// is lower than expected is taken as the new baseline ([`SeqStatus::InOrder`]) instead.
    /// Numbers below `from` (already applied before the gap) stay duplicates.
    pub fn rebase_after_reset(&mut self, from: i64) {
        self.rebase_from = Some(from);
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

    /// Number of times a lower number was taken as the new baseline after a reset
    /// ([`rebase_after_reset`](Self::rebase_after_reset)).
    pub fn rebases(&self) -> u64 {
        self.rebases
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
    fn after_an_unfilled_gap_opened_by_a_bogus_number_the_stream_goes_on() {
        let mut t = SeqTracker::new();
        for s in 0..5 {
            assert_eq!(t.observe(s), SeqStatus::InOrder);
        }
        let bogus = i64::MAX - 1;
        assert_eq!(
            t.observe(bogus),
            SeqStatus::Gap {
                expected: 5,
                got: bogus
            }
        );
        // Without the reset, every genuine number would now be a duplicate.
        let mut frozen = t.clone();
        assert_eq!(frozen.observe(5), SeqStatus::Duplicate);
        assert_eq!(frozen.observe(6), SeqStatus::Duplicate);

        t.rebase_after_reset(5);
        // A late number from before the gap is still a duplicate, and keeps the rebase armed.
        assert_eq!(t.observe(3), SeqStatus::Duplicate);
        assert_eq!(t.observe(6), SeqStatus::InOrder);
        assert_eq!(t.observe(7), SeqStatus::InOrder);
        assert_eq!(t.observe(5), SeqStatus::Duplicate);
        assert_eq!(t.rebases(), 1);
        // Missed counts saturate instead of overflowing.
        for _ in 0..3 {
            let e = t.expected();
            assert!(matches!(t.observe(i64::MAX), SeqStatus::Gap { .. }));
            t.rebase_after_reset(e);
            assert_eq!(t.observe(e), SeqStatus::InOrder);
        }
        assert_eq!(t.missed(), u64::MAX);

        // A genuine jump: the stream continues after it, the rebase is disarmed.
        let mut t = SeqTracker::new();
        assert_eq!(t.observe(0), SeqStatus::InOrder);
        assert!(matches!(t.observe(10), SeqStatus::Gap { .. }));
        t.rebase_after_reset(1);
        assert_eq!(t.observe(11), SeqStatus::InOrder);
        assert_eq!(t.observe(2), SeqStatus::Duplicate);
        assert_eq!(t.rebases(), 0);
    }

    #[test]
    fn replay_from_zero_is_not_a_restart() {
        let mut t = SeqTracker::starting_at(0);
        assert_eq!(t.observe_replayed(0), SeqStatus::InOrder);
        assert_eq!(t.observe_replayed(0), SeqStatus::Duplicate);
    }
}
