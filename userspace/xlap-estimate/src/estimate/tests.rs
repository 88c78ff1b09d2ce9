//! The solver on synthetic RTTs with a known answer.

use super::solve::{estimate, Options, PairInput};
use super::system::{Determined, Refusal};
use super::{apply_hardware, refusal_error};
use xlap_exit::{code_of, Code};
use xlap_random::Rng;

const OPTS: Options = Options {
    resamples: 200,
    confidence: 0.95,
    seed: 3,
};

/// Exponential with this mean (ns).
fn exp(rng: &mut Rng, mean: f64) -> f64 {
    let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    -mean * (1.0 - u).ln()
}

/// A host: per direction a floor plus an exponential tail (ns).
#[derive(Clone, Copy)]
struct Host {
    floor: f64,
    tail: f64,
}

impl Host {
    fn mean(&self) -> f64 {
        self.floor + self.tail
    }
    /// The quantile of one direction's latency.
    fn quantile(&self, q: f64) -> f64 {
        self.floor - self.tail * (1.0 - q).ln()
    }
    fn draw(&self, rng: &mut Rng) -> f64 {
        self.floor + exp(rng, self.tail)
    }
}

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

/// RTTs of i-j: both hosts' send and receive drawn independently.
fn independent(rng: &mut Rng, h: &[Host], i: usize, j: usize, n: usize, hw: f64) -> PairInput {
    let samples_ns = (0..n)
        .map(|_| h[i].draw(rng) + h[j].draw(rng) + h[j].draw(rng) + h[i].draw(rng) + 2.0 * hw)
        .collect();
    pair(i, j, samples_ns)
}

/// RTTs of i-j where both hosts are slow together (comonotone).
fn comonotone(rng: &mut Rng, h: &[Host], i: usize, j: usize, n: usize) -> PairInput {
    let samples_ns = (0..n)
        .map(|_| {
            let q = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            2.0 * h[i].quantile(q) + 2.0 * h[j].quantile(q)
        })
        .collect();
    pair(i, j, samples_ns)
}

fn pair(i: usize, j: usize, samples_ns: Vec<f64>) -> PairInput {
    PairInput {
        from: NAMES[i].into(),
        to: NAMES[j].into(),
        source: format!("{}-{}.json", NAMES[i], NAMES[j]),
        samples_ns,
        lost: 0,
        hardware_ns: 0.0,
    }
}

const HOSTS: [Host; 4] = [
    Host {
        floor: 10_000.0,
        tail: 5_000.0,
    },
    Host {
        floor: 25_000.0,
        tail: 2_000.0,
    },
    Host {
        floor: 5_000.0,
        tail: 20_000.0,
    },
    Host {
        floor: 40_000.0,
        tail: 1_000.0,
    },
];

#[test]
fn three_hosts_means_come_out_within_their_stated_error() {
    let mut rng = Rng::new(11);
    let pairs = [(0, 1), (1, 2), (2, 0)]
        .map(|(i, j)| independent(&mut rng, &HOSTS, i, j, 4000, 0.0))
        .to_vec();
    let e = estimate(&pairs, OPTS).unwrap();
    assert_eq!(e.determined, Determined::Exactly);
    assert!((e.condition_number - 2.0).abs() < 1e-9);
    for (h, est) in HOSTS.iter().zip(&e.estimates) {
        let m = &est.stats["mean"];
        let err = m.err_us.unwrap();
        // The truth within the interval's half-width, with room for the 5 %
        // of runs it misses (a fixed seed: this run).
        assert!(
            (m.us - h.mean() / 1e3).abs() <= 2.0 * err,
            "{}: {} against {} ± {err}",
            est.host,
            m.us,
            h.mean() / 1e3
        );
        assert!(err > 0.0 && err < 1.0, "{}: err {err} us", est.host);
        assert!((m.lo_us.unwrap()..=m.hi_us.unwrap()).contains(&m.us));
        assert!((est.conceptual_error_us - m.us).abs() < 1e-9);
    }
    for p in &e.pairs {
        assert!(p.residual_us["mean"].abs() < 1e-6, "exact: no residual");
    }
}

#[test]
fn comonotone_quantiles_are_solved_level_by_level() {
    let mut rng = Rng::new(5);
    let pairs = [(0, 1), (1, 2), (0, 2)]
        .map(|(i, j)| comonotone(&mut rng, &HOSTS, i, j, 20_000))
        .to_vec();
    let e = estimate(&pairs, OPTS).unwrap();
    for (h, est) in HOSTS.iter().zip(&e.estimates) {
        for (name, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            let s = &est.stats[name];
            let want = h.quantile(q) / 1e3;
            assert!(
                (s.us - want).abs() <= 2.0 * s.err_us.unwrap() + 0.01 * want,
                "{} {name}: {} against {want} ± {:?}",
                est.host,
                s.us,
                s.err_us
            );
        }
        let min = est.stats["min"].us;
        assert!((min - h.floor / 1e3).abs() < 0.5, "{}: min {min}", est.host);
    }
}

#[test]
fn four_hosts_overdetermined_fit_and_residuals_point_at_a_bad_pair() {
    let mut rng = Rng::new(9);
    let all: Vec<(usize, usize)> = (0..4)
        .flat_map(|i| (i + 1..4).map(move |j| (i, j)))
        .collect();
    let mut pairs: Vec<PairInput> = all
        .iter()
        .map(|&(i, j)| independent(&mut rng, &HOSTS, i, j, 4000, 0.0))
        .collect();
    let e = estimate(&pairs, OPTS).unwrap();
    assert_eq!((e.equations, e.determined), (6, Determined::Over));
    // K4: singular values sqrt(96) and sqrt(32) (three times).
    assert!((e.condition_number - 3f64.sqrt()).abs() < 1e-9);
    for (h, est) in HOSTS.iter().zip(&e.estimates) {
        let m = &est.stats["mean"];
        assert!(
            (m.us - h.mean() / 1e3).abs() <= 2.0 * m.err_us.unwrap(),
            "{}: {} against {}",
            est.host,
            m.us,
            h.mean() / 1e3
        );
    }
    assert!(e.residual_rms_us["mean"] < 1.0, "{:?}", e.residual_rms_us);
    // 60 us more on a-b only: no per-host latency explains it and the
    // residuals say so. On K4 they cannot say more: every pair's leverage
    // is 4/6, and a-b's excess leaves a third of itself on a-b and on the
    // disjoint pair c-d alike (+20 us), and -10 us on the other four.
    for s in &mut pairs[0].samples_ns {
        *s += 60_000.0;
    }
    let bad = estimate(&pairs, OPTS).unwrap();
    for (p, good) in bad.pairs.iter().zip(&e.pairs) {
        let want = match (p.from.as_str(), p.to.as_str()) {
            ("a", "b") | ("c", "d") => 20.0,
            _ => -10.0,
        };
        let got = p.residual_us["mean"] - good.residual_us["mean"];
        assert!((got - want).abs() < 1e-6, "{}-{}: {got}", p.from, p.to);
    }
    assert!(bad.residual_rms_us["mean"] > 10.0);
}

#[test]
fn a_delay_on_one_host_raises_its_estimate_by_that_much_alone() {
    let run = |delay_b: f64| {
        let mut rng = Rng::new(21);
        let mut hosts = HOSTS;
        hosts[1].floor += delay_b;
        let pairs = [(0, 1), (1, 2), (2, 0)]
            .map(|(i, j)| independent(&mut rng, &hosts, i, j, 4000, 0.0))
            .to_vec();
        estimate(&pairs, OPTS).unwrap()
    };
    let (before, after) = (run(0.0), run(200_000.0));
    for h in 0..3 {
        let d = after.estimates[h].stats["mean"].us - before.estimates[h].stats["mean"].us;
        // The same random draws: the delay is all that changed.
        let want = if h == 1 { 200.0 } else { 0.0 };
        assert!((d - want).abs() < 1e-6, "host {h}: {d}");
    }
}

#[test]
fn hardware_time_is_taken_off_the_hosts() {
    let mut rng = Rng::new(2);
    let mut pairs: Vec<PairInput> = [(0, 1), (1, 2), (2, 0)]
        .map(|(i, j)| independent(&mut rng, &HOSTS, i, j, 2000, 30_000.0))
        .to_vec();
    for p in &mut pairs {
        p.from = format!("host-{}", p.from);
        p.to = format!("host-{}", p.to);
    }
    let without = estimate(&pairs, OPTS).unwrap();
    apply_hardware(
        &mut pairs,
        &[
            "host-a-host-b=30".into(),
            "host-b-host-c=30".into(),
            "host-c-host-a=30".into(),
        ],
    )
    .unwrap();
    let with = estimate(&pairs, OPTS).unwrap();
    for (w, wo) in with.estimates.iter().zip(&without.estimates) {
        // 2h of every RTT: each host's t was h/2 too high... per pair, so
        // with every pair at h, t_i drops by h/2.
        let d = wo.stats["mean"].us - w.stats["mean"].us;
        assert!((d - 15.0).abs() < 1e-6, "{}: {d}", w.host);
    }
    for bad in [
        "host-a-host-d=3",
        "host-a=3",
        "host-a-host-b=-1",
        "host-a-host-b",
    ] {
        let e = apply_hardware(&mut pairs, &[bad.to_string()]).unwrap_err();
        assert_eq!(code_of(&e), Code::Usage as u8, "{bad}");
    }
}

#[test]
fn too_few_pairs_are_refused_with_the_pairs_to_add() {
    let mut rng = Rng::new(1);
    let pairs = [(0, 1), (1, 2)]
        .map(|(i, j)| independent(&mut rng, &HOSTS, i, j, 100, 0.0))
        .to_vec();
    let Err((system, refusal)) = estimate(&pairs, OPTS) else {
        panic!("two pairs of three hosts were solved");
    };
    assert_eq!(
        refusal,
        Refusal::Underdetermined {
            rank: 2,
            add: vec![(0, 2)]
        }
    );
    let err = refusal_error(&system, &refusal);
    assert_eq!(code_of(&err), Code::BadInput as u8);
    let text = err.to_string();
    assert!(text.contains("also measure a-c"), "{text}");
    assert!(text.contains("a-b, b-c"), "{text}");
    // Two hosts can never be separated.
    let Err((system, refusal)) = estimate(&pairs[..1], OPTS) else {
        panic!("one pair was solved");
    };
    assert_eq!(refusal, Refusal::TooFewHosts(2));
    assert!(refusal_error(&system, &refusal)
        .to_string()
        .contains("three or more hosts"));
}

#[test]
fn runs_that_disagree_widen_the_interval() {
    // Three runs of every pair; in one of them host a was 20 us slower.
    let mut rng = Rng::new(4);
    let mut pairs = Vec::new();
    for run in 0..3 {
        let mut hosts = HOSTS;
        if run == 1 {
            hosts[0].floor += 20_000.0;
        }
        for (i, j) in [(0, 1), (1, 2), (2, 0)] {
            pairs.push(independent(&mut rng, &hosts, i, j, 2000, 0.0));
        }
    }
    let e = estimate(&pairs, OPTS).unwrap();
    assert_eq!((e.equations, e.determined), (9, Determined::Over));
    let a = &e.estimates[0].stats["mean"];
    // The mean of the runs: a is 20/3 us above its usual.
    assert!(
        (a.us - (HOSTS[0].mean() + 20_000.0 / 3.0) / 1e3).abs() < 2.0,
        "{a:?}"
    );
    // One run alone states well under a microsecond; the runs together
    // spread by several.
    let one = estimate(&pairs[..3], OPTS).unwrap();
    assert!(one.estimates[0].stats["mean"].err_us.unwrap() < 1.0);
    assert!(a.err_us.unwrap() > 4.0, "{a:?}");
    assert!(e.residual_rms_us["mean"] > 5.0, "{:?}", e.residual_rms_us);
}
