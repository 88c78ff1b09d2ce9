//! Delay injection: `--inject STAGE=MICROS[@FROM-TO]` busy-waits in a stage
//! for the packets whose seq lies in FROM..=TO (all packets without a range),
//! so analyses and regression checks can be tested against a known cause.

use anyhow::{anyhow, bail, Context, Result};
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// Sender: after the packet's release time, before send_start (a late
    /// activation, as a timer that fires late).
    Activate,
    /// Sender: between encode_start and encode_end.
    Encode,
    /// Sender: before the packet is submitted to the transmit thread.
    Submit,
    /// Sender: in the transmit thread, before the send syscall.
    Transmit,
    /// Sender with a second path (--dest2): the copy on path 1 leaves this
    /// long after the copy on path 2 (sent first, then a busy-wait), as
    /// when path 1's network is slow.
    Path1,
    /// Receiver: between handle_start and handle_end.
    Handle,
    /// Receiver: between decode_start and decode_end.
    Decode,
    /// Receiver: in the application thread, before delivery.
    Deliver,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Injection {
    pub stage: Stage,
    pub micros: u64,
    pub seqs: Option<(u32, u32)>,
}

impl FromStr for Injection {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        let (stage, rest) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("expected STAGE=MICROS[@FROM-TO], got {s:?}"))?;
        let stage = <Stage as clap::ValueEnum>::from_str(stage, true).map_err(|_| {
            anyhow!("unknown stage {stage:?} (activate, encode, submit, transmit, path1, handle, decode, deliver)")
        })?;
        let (micros, range) = match rest.split_once('@') {
            Some((m, r)) => (m, Some(r)),
            None => (rest, None),
        };
        let micros = micros
            .parse()
            .with_context(|| format!("bad microseconds in {s:?}"))?;
        let seqs = match range {
            None => None,
            Some(r) => {
                let (a, b) = r
                    .split_once('-')
                    .ok_or_else(|| anyhow!("expected FROM-TO in {s:?}"))?;
                let (a, b): (u32, u32) = (a.parse()?, b.parse()?);
                if a > b {
                    bail!("empty seq range {a}-{b} in {s:?}");
                }
                Some((a, b))
            }
        };
        Ok(Injection {
            stage,
            micros,
            seqs,
        })
    }
}

/// The injections of one run, applied by stage.
#[derive(Clone, Debug, Default)]
pub struct Injections(pub Vec<Injection>);

impl Injections {
    /// Whether an injection of `stage` covers `seq`.
    pub fn covers(&self, stage: Stage, seq: u32) -> bool {
        self.0
            .iter()
            .any(|inj| inj.stage == stage && inj.seqs.is_none_or(|(a, b)| (a..=b).contains(&seq)))
    }

    /// Busy-waits for every injection of `stage` that covers `seq`.
    pub fn apply(&self, stage: Stage, seq: u32) {
        for inj in &self.0 {
            if inj.stage == stage && inj.seqs.is_none_or(|(a, b)| (a..=b).contains(&seq)) {
                crate::clock::spin_for(inj.micros * 1000);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stage_delay_and_range() {
        let i: Injection = "encode=200@100-199".parse().unwrap();
        assert_eq!(
            i,
            Injection {
                stage: Stage::Encode,
                micros: 200,
                seqs: Some((100, 199))
            }
        );
        let i: Injection = "deliver=5".parse().unwrap();
        assert_eq!(i.seqs, None);
        assert!("warp=5".parse::<Injection>().is_err());
        assert!("encode=5@9-1".parse::<Injection>().is_err());
        assert!("encode".parse::<Injection>().is_err());
    }
}
