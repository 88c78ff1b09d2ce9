//! Grouping outgoing datagrams into UDP GSO sends (`send --gso N`).
//!
//! One GSO send cuts its bytes at one segment size, so a send holds
//! consecutive datagrams of one length (a shorter one may only end it, but a
//! new length here always starts a new send, which keeps the rule simple).

/// Collects consecutive equal-length datagrams, at most `max_segments` of
/// them and `max_bytes` in all per send.
#[derive(Debug)]
pub struct GsoBatcher<T> {
    max_segments: usize,
    max_bytes: usize,
    pending: Vec<T>,
}

impl<T: AsRef<[u8]>> GsoBatcher<T> {
    pub fn new(max_segments: usize, max_bytes: usize) -> GsoBatcher<T> {
        GsoBatcher {
            max_segments: max_segments.max(1),
            max_bytes,
            pending: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Adds a datagram and returns the sends that are complete now, oldest
    /// first: the pending one when `datagram` cannot join it, then the new
    /// one when `datagram` filled it.
    pub fn push(&mut self, datagram: T) -> Vec<Vec<T>> {
        let mut ready = Vec::new();
        if !self.can_join(datagram.as_ref().len()) {
            ready.extend(self.take());
        }
        self.pending.push(datagram);
        if !self.can_join(self.segment_size()) {
            ready.extend(self.take());
        }
        ready
    }

    /// The pending send, if any (on a pause in the traffic and at the end).
    pub fn take(&mut self) -> Option<Vec<T>> {
        (!self.pending.is_empty()).then(|| std::mem::take(&mut self.pending))
    }

    fn segment_size(&self) -> usize {
        self.pending.first().map_or(0, |d| d.as_ref().len())
    }

    /// Whether one more datagram of `len` bytes fits the pending send.
    fn can_join(&self, len: usize) -> bool {
        let count = self.pending.len();
        count == 0
            || (len == self.segment_size()
                && count < self.max_segments
                && (count + 1) * len <= self.max_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(batches: &[Vec<Vec<u8>>]) -> Vec<Vec<usize>> {
        batches
            .iter()
            .map(|b| b.iter().map(Vec::len).collect())
            .collect()
    }

    #[test]
    fn a_send_completes_when_full() {
        let mut b = GsoBatcher::new(3, 65_000);
        assert!(b.push(vec![0; 10]).is_empty());
        assert!(b.push(vec![0; 10]).is_empty());
        assert_eq!(lens(&b.push(vec![0; 10])), vec![vec![10, 10, 10]]);
        assert!(b.is_empty());
        assert_eq!(b.take(), None);
    }

    #[test]
    fn a_different_length_starts_a_new_send() {
        let mut b = GsoBatcher::new(8, 65_000);
        b.push(vec![0; 10]);
        b.push(vec![0; 10]);
        assert_eq!(lens(&b.push(vec![0; 18])), vec![vec![10, 10]]);
        assert_eq!(lens(&b.push(vec![0; 10])), vec![vec![18]]);
        assert_eq!(b.take().map(|s| s.len()), Some(1));
    }

    #[test]
    fn a_send_stays_within_the_byte_limit() {
        // 3 × 400 fits 1000 bytes only twice.
        let mut b = GsoBatcher::new(8, 1000);
        assert!(b.push(vec![0; 400]).is_empty());
        assert_eq!(lens(&b.push(vec![0; 400])), vec![vec![400, 400]]);
        // A datagram alone is always a send, whatever its size.
        assert_eq!(lens(&b.push(vec![0; 1500])), vec![vec![1500]]);
    }

    #[test]
    fn a_length_change_into_a_full_send_completes_both() {
        let mut b = GsoBatcher::new(1, 65_000);
        assert_eq!(lens(&b.push(vec![0; 10])), vec![vec![10]]);
        let mut b = GsoBatcher::new(2, 65_000);
        b.push(vec![0; 10]);
        assert_eq!(lens(&b.push(vec![0; 600])), vec![vec![10]]);
        let mut b = GsoBatcher::new(2, 1000);
        b.push(vec![0; 10]);
        assert_eq!(lens(&b.push(vec![0; 600])), vec![vec![10], vec![600]]);
    }
}
