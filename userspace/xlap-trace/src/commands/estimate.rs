//! `probe serve`, `probe rtt` and `estimate`: latency without synchronised
//! clocks.

use crate::cli::{EstimateArgs, ProbeCommand};
use anyhow::Result;
use xlap_estimate::{estimate, probe};

pub fn probe(c: &ProbeCommand) -> Result<()> {
    match c {
        ProbeCommand::Serve(a) => {
            let s = probe::serve::run(&a.into())?;
            println!(
                "probe serve {}: echoed {} probes, ignored {} other datagrams",
                a.bind, s.echoed, s.ignored
            );
            if a.delay_us > 0 && s.echoed > 0 {
                println!(
                    "probe serve {}: delay spent {:.1} us per direction on average (--delay-us {})",
                    a.bind,
                    s.delay_spent.as_secs_f64() * 1e6 / (2 * s.echoed) as f64,
                    a.delay_us
                );
            }
            Ok(())
        }
        ProbeCommand::Rtt(a) => {
            let opts = probe::RttOptions::from(a);
            let f = probe::rtt::run(&opts)?;
            probe::rtt::write(&opts, &f)
        }
    }
}

pub fn estimate(a: &EstimateArgs) -> Result<()> {
    estimate::run(&a.into())
}
