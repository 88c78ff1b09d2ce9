//! XOR parity over a block of data packets: one redundancy packet per block
//! of `k` data packets rebuilds any single missing data packet of the block.
//!
//! The parity covers each data packet's send time and payload, so a rebuilt
//! packet carries its original send time (its deadline stays meaningful).

/// Accumulates the parity of one block.
#[derive(Debug)]
pub struct ParityBuilder {
    acc: Vec<u8>,
    covered: u8,
}

impl ParityBuilder {
    pub fn new(payload_len: usize) -> Self {
        ParityBuilder {
            acc: vec![0; 8 + payload_len],
            covered: 0,
        }
    }

    pub fn add(&mut self, send_time_ns: u64, payload: &[u8]) {
        xor_unit(&mut self.acc, send_time_ns, payload);
        self.covered += 1;
    }

    /// Number of data packets folded in so far.
    pub fn covered(&self) -> u8 {
        self.covered
    }

    /// Returns the parity and resets the builder for the next block.
    pub fn finish(&mut self) -> Vec<u8> {
        let out = self.acc.clone();
        self.acc.fill(0);
        self.covered = 0;
        out
    }
}

fn xor_unit(acc: &mut [u8], send_time_ns: u64, payload: &[u8]) {
    for (a, b) in acc.iter_mut().zip(send_time_ns.to_be_bytes()) {
        *a ^= b;
    }
    for (a, b) in acc[8..].iter_mut().zip(payload) {
        *a ^= b;
    }
}

/// Rebuilds the one missing data packet of a block from its parity and the
/// block's other data packets: returns (send time, payload).
pub fn recover<'a>(
    parity: &[u8],
    others: impl IntoIterator<Item = (u64, &'a [u8])>,
) -> (u64, Vec<u8>) {
    let mut acc = parity.to_vec();
    for (send_time_ns, payload) in others {
        xor_unit(&mut acc, send_time_ns, payload);
    }
    let send_time_ns = u64::from_be_bytes(acc[..8].try_into().expect("8-byte prefix"));
    (send_time_ns, acc.split_off(8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_single_missing_packet_is_rebuilt() {
        let block: Vec<(u64, Vec<u8>)> = (0..4u64)
            .map(|i| (1000 + i, (0..16).map(|b| (b * 7 + i * 13) as u8).collect()))
            .collect();
        let mut builder = ParityBuilder::new(16);
        for (t, p) in &block {
            builder.add(*t, p);
        }
        assert_eq!(builder.covered(), 4);
        let parity = builder.finish();
        assert_eq!(builder.covered(), 0);
        for missing in 0..block.len() {
            let others = block
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != missing)
                .map(|(_, (t, p))| (*t, p.as_slice()));
            let (t, p) = recover(&parity, others);
            assert_eq!((t, p), block[missing].clone());
        }
    }
}
