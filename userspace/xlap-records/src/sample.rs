//! `--sample 1/N`: which datagrams a run stamps.
//!
//! The choice is a function of the protocol's own sequence number (a hash,
//! `XLAP_SAMPLE_HASH` in `bpf/xlap_abi.h`, whose multiplier this module
//! takes from the generated ABI), so two recorders on the two hosts of a
//! connection keep exactly the same datagrams without talking to each
//! other, and every kept datagram has all of its points. The BPF side
//! applies it at every kernel point and marker uprobe; the recorder applies
//! it to the markers it reads from a process's shared ring.

use serde::{Deserialize, Serialize};
use xlap_abi::XLAP_SAMPLE_HASH_MUL;

/// The kinds `--sample-kinds` can name: the BPF side keeps them as bits of
/// one 64-bit word.
pub const MAX_SAMPLED_KIND: u32 = 63;

/// A run's sample: one datagram in `one_in` of the `kinds` named (every
/// kind when empty); datagrams of other kinds are all stamped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub one_in: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<u32>,
}

impl Sample {
    /// `1/N` (or `N`), N ≥ 1; `1/1` is no sampling (`None`).
    pub fn parse(text: &str, kinds: Vec<u32>) -> Result<Option<Sample>, String> {
        let n = text.strip_prefix("1/").unwrap_or(text);
        let one_in: u32 = n.trim().parse().map_err(|_| {
            format!("--sample takes 1/N with N a whole number ≥ 1 (say 1/16), not {text:?}")
        })?;
        if one_in == 0 {
            return Err("--sample 1/0 keeps nothing: give N ≥ 1".into());
        }
        if let Some(k) = kinds.iter().find(|k| **k > MAX_SAMPLED_KIND) {
            return Err(format!(
                "--sample-kinds names kinds 0..={MAX_SAMPLED_KIND}, not {k}"
            ));
        }
        if one_in == 1 {
            return Ok(None);
        }
        Ok(Some(Sample { one_in, kinds }))
    }

    /// The BPF configuration's `sample_below`: a datagram is kept when its
    /// hash is below it.
    pub fn below(&self) -> u32 {
        ((1u64 << 32) / u64::from(self.one_in.max(1))) as u32
    }

    /// The BPF configuration's `sample_kinds` bit set (0: every kind).
    pub fn kind_bits(&self) -> u64 {
        self.kinds.iter().fold(0, |bits, k| bits | 1u64 << k)
    }

    /// Whether a datagram of `seq` and `kind` (None: the stamp has no
    /// kind, taken as 0 as the BPF side does) is stamped: what the BPF
    /// side's `sample_keeps` decides.
    pub fn keeps(&self, seq: u64, kind: Option<u32>) -> bool {
        !self.is_sampled(kind) || hash(seq) < self.below()
    }

    /// Whether datagrams of `kind` are sampled (else all are kept).
    pub fn is_sampled(&self, kind: Option<u32>) -> bool {
        self.kinds.is_empty() || self.kinds.contains(&kind.unwrap_or(0))
    }

    /// The packets one kept datagram of `kind` stands for.
    pub fn weight(&self, kind: Option<u32>) -> u32 {
        if self.is_sampled(kind) {
            self.one_in
        } else {
            1
        }
    }

    /// `1/16`, or `1/16 of kinds 1, 2`.
    pub fn describe(&self) -> String {
        if self.kinds.is_empty() {
            format!("1/{}", self.one_in)
        } else {
            let kinds: Vec<String> = self.kinds.iter().map(u32::to_string).collect();
            format!("1/{} of kinds {}", self.one_in, kinds.join(", "))
        }
    }
}

/// `XLAP_SAMPLE_HASH(seq)`.
pub fn hash(seq: u64) -> u32 {
    // bindgen types the constant as i64: the same 64 bits.
    (seq.wrapping_mul(XLAP_SAMPLE_HASH_MUL as u64) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_seqs_are_kept_at_the_rate_and_spread_out() {
        let s = Sample::parse("1/16", vec![]).unwrap().unwrap();
        let kept: Vec<u64> = (0..160_000).filter(|q| s.keeps(*q, None)).collect();
        // Fibonacci hashing spreads a run of seqs evenly: within a few of
        // 10 000, and no long gap (every window of 64 seqs has one).
        assert!((9_990..=10_010).contains(&kept.len()), "{}", kept.len());
        assert!(kept.windows(2).all(|w| w[1] - w[0] <= 64));
    }

    #[test]
    fn kinds_outside_the_sample_are_all_kept_and_weigh_one() {
        let s = Sample::parse("1/8", vec![1]).unwrap().unwrap();
        assert!((0..1000).all(|q| s.keeps(q, Some(2))));
        assert!((0..1000).all(|q| s.keeps(q, None)), "no kind is kind 0");
        assert!((0..1000).filter(|q| s.keeps(*q, Some(1))).count() < 200);
        assert_eq!((s.weight(Some(1)), s.weight(Some(2))), (8, 1));
        assert_eq!(s.kind_bits(), 2);
    }

    #[test]
    fn bad_rates_are_refused_and_one_in_one_is_no_sample() {
        assert!(Sample::parse("1/0", vec![]).is_err());
        assert!(Sample::parse("1/x", vec![]).is_err());
        assert!(Sample::parse("1/4", vec![64]).is_err());
        assert_eq!(Sample::parse("1/1", vec![]).unwrap(), None);
        assert_eq!(Sample::parse("32", vec![]).unwrap().unwrap().one_in, 32);
    }
}
