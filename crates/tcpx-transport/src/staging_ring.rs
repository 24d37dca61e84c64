//! Where in a staging ring a request's bytes go: contiguous ranges of a fixed-size ring handed
//! out in posting order and given back in any order.
//!
//! [`crate::cuda_staging`] stages GPU memory through one small pinned ring per comm instead of a
//! host mirror as large as each GPU buffer, so the bytes the network copies in and out stay in
//! the CPU's cache (a 256 MiB mirror is DRAM every time). A range is reused only once every range
//! handed out before it has been given back: the ring's free space is always one or two runs
//! between the newest range's end and the oldest live range's start, which keeps this a few
//! comparisons per request.
//!
//! Not for: the byte copies themselves, nor knowing when the backend has let go of a range (the
//! caller gives a range back once its request is finished).

use std::collections::VecDeque;

/// One range handed out: its number (for giving it back), start and length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingRange {
    pub id: u64,
    pub start: usize,
    pub len: usize,
}

/// The ranges of one ring of `capacity` bytes that are handed out and not yet reusable.
#[derive(Debug)]
pub struct RingRanges {
    capacity: usize,
    next_id: u64,
    /// Live ranges in the order they were handed out, each with whether it was given back.
    live: VecDeque<(RingRange, bool)>,
}

impl RingRanges {
    pub fn new(capacity: usize) -> Self {
        RingRanges {
            capacity,
            next_id: 0,
            live: VecDeque::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Ranges handed out and not yet reusable (given back ones behind an older live one count).
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// A range of `len` bytes (1 to the capacity), or `None` while the ring has no run of free
    /// bytes that long: give back older ranges first.
    pub fn take(&mut self, len: usize) -> Option<RingRange> {
        if len == 0 || len > self.capacity {
            return None;
        }
        let start = match (self.live.front(), self.live.back()) {
            (Some((oldest, _)), Some((newest, _))) => {
                let end = newest.start + newest.len;
                if newest.start >= oldest.start {
                    // Not wrapped: free from the newest's end to the ring's end, then from the
                    // ring's start to the oldest.
                    if end + len <= self.capacity {
                        end
                    } else if len <= oldest.start {
                        0
                    } else {
                        return None;
                    }
                } else if end + len <= oldest.start {
                    // Wrapped: free between the newest's end and the oldest.
                    end
                } else {
                    return None;
                }
            }
            _ => 0,
        };
        let range = RingRange {
            id: self.next_id,
            start,
            len,
        };
        self.next_id += 1;
        self.live.push_back((range, false));
        Some(range)
    }

    /// Gives back the newest range (taken, then not used after all): reusable at once.
    pub fn untake(&mut self, id: u64) {
        if self.live.back().is_some_and(|(r, _)| r.id == id) {
            self.live.pop_back();
        }
    }

    /// Gives back range `id`; its bytes are reused once every older range is given back too.
    /// Unknown or already given back ids are ignored.
    pub fn give_back(&mut self, id: u64) {
        if let Some(entry) = self.live.iter_mut().find(|(r, _)| r.id == id) {
            entry.1 = true;
        }
        while self.live.front().is_some_and(|(_, back)| *back) {
            self.live.pop_front();
        }
    }

    /// The ranges not yet reusable, oldest first.
    pub fn ranges(&self) -> impl Iterator<Item = RingRange> + '_ {
        self.live.iter().map(|(r, _)| *r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_wrap_to_the_start_once_the_oldest_is_given_back() {
        let mut r = RingRanges::new(10);
        let a = r.take(4).unwrap();
        let b = r.take(4).unwrap();
        assert_eq!((a.start, b.start), (0, 4));
        // 2 bytes left at the end, none at the start: a 3-byte range waits.
        assert_eq!(r.take(3), None);
        r.give_back(a.id);
        let c = r.take(3).unwrap();
        assert_eq!(c.start, 0);
        // Wrapped: 1 byte free between c's end (3) and b (4).
        assert_eq!(r.take(2), None);
        assert_eq!(r.take(1).unwrap().start, 3);
    }

    #[test]
    fn a_range_given_back_out_of_order_is_reused_only_after_the_older_ones() {
        let mut r = RingRanges::new(8);
        let a = r.take(4).unwrap();
        let b = r.take(4).unwrap();
        r.give_back(b.id);
        assert_eq!(r.take(1), None, "b's bytes are behind a, which is live");
        r.give_back(a.id);
        assert_eq!(r.live(), 0);
        assert_eq!(r.take(8).unwrap().start, 0);
    }

    #[test]
    fn sizes_beyond_the_ring_or_zero_are_never_handed_out() {
        let mut r = RingRanges::new(8);
        assert_eq!(r.take(9), None);
        assert_eq!(r.take(0), None);
        let a = r.take(8).unwrap();
        r.untake(a.id);
        assert_eq!(r.live(), 0);
    }

    proptest! {
        /// Any sequence of takes and give-backs: live ranges lie inside the ring and never
        /// overlap, and once everything is given back a range of the whole ring is handed out.
        #[test]
        fn live_ranges_never_overlap(
            cap in 1usize..64,
            ops in proptest::collection::vec((any::<bool>(), 1usize..70, any::<prop::sample::Index>()), 1..200),
        ) {
            let mut r = RingRanges::new(cap);
            let mut held: Vec<u64> = vec![];
            for (take, len, pick) in ops {
                if take || held.is_empty() {
                    if let Some(g) = r.take(len) {
                        prop_assert!(g.len == len && g.start + g.len <= cap);
                        held.push(g.id);
                    } else {
                        prop_assert!(len > cap || r.live() > 0);
                    }
                } else {
                    let id = held.swap_remove(pick.index(held.len()));
                    r.give_back(id);
                }
                let mut spans: Vec<_> = r.ranges().map(|g| (g.start, g.start + g.len)).collect();
                spans.sort();
                for w in spans.windows(2) {
                    prop_assert!(w[0].1 <= w[1].0, "overlap {:?}", spans);
                }
            }
            for id in held {
                r.give_back(id);
            }
            prop_assert_eq!(r.live(), 0);
            prop_assert_eq!(r.take(cap).map(|g| g.start), Some(0));
        }
    }
}
