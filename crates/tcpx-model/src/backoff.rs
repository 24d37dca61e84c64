//! Waiting politely for something that is not ready yet, never past a deadline.

use std::time::{Duration, Instant};

/// Time left until `deadline`; `None` once it has passed.
pub fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Pauses between polls: first `spins` bare yields (for waits that usually end within
/// microseconds), then sleeps that start at `first` and double up to `max`. Keeps no clock of
/// its own: [`Backoff::next_pause`] says what to wait next (for code that simulates time),
/// [`Backoff::wait`] waits it, cut short at a deadline.
#[derive(Debug, Clone)]
pub struct Backoff {
    spins_left: u32,
    pause: Duration,
    max: Duration,
}

impl Backoff {
    /// Sleeps from `first`, doubling up to `max`.
    pub const fn doubling(first: Duration, max: Duration) -> Self {
        Backoff {
            spins_left: 0,
            pause: first,
            max,
        }
    }

    /// `spins` yields, then sleeps of `nap` each.
    pub const fn spin_then_sleep(spins: u32, nap: Duration) -> Self {
        Backoff {
            spins_left: spins,
            pause: nap,
            max: nap,
        }
    }

    /// The next pause: zero for a yield, else how long to sleep (and the one after doubles).
    pub fn next_pause(&mut self) -> Duration {
        if self.spins_left > 0 {
            self.spins_left -= 1;
            return Duration::ZERO;
        }
        let p = self.pause.min(self.max);
        self.pause = (self.pause * 2).min(self.max);
        p
    }

    /// Waits the next pause, never past `deadline`; `false` (without waiting) once the deadline
    /// has passed, so a loop reads `while backoff.wait(deadline) { ... }`.
    pub fn wait(&mut self, deadline: Instant) -> bool {
        let Some(left) = remaining(deadline) else {
            return false;
        };
        let p = self.next_pause();
        if p.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(p.min(left));
        }
        true
    }

    /// Waits the next pause with no deadline of its own (the caller checks one).
    pub fn pause(&mut self) {
        let p = self.next_pause();
        if p.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(p);
        }
    }
}
