//! The estimate as a table for people.

use super::solve::Estimate;
use super::system::Determined;
use std::fmt::Write;

fn num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

pub fn table(e: &Estimate) -> String {
    let mut out = String::new();
    let how = match e.determined {
        Determined::Exactly => "exactly determined, no residuals",
        Determined::Over => "overdetermined, least squares",
    };
    let _ = writeln!(
        out,
        "{} hosts from {} pairs ({how}), condition number {:.2}; {}",
        e.hosts.len(),
        e.equations,
        e.condition_number,
        if e.resamples > 0 {
            format!(
                "{:.0} % intervals from {} bootstrap resamples",
                e.confidence * 100.0,
                e.resamples
            )
        } else {
            "no intervals (--bootstrap 0)".into()
        }
    );
    let _ = writeln!(out);
    let mut rows = vec![vec![
        "host".to_string(),
        "stat".into(),
        "t_us".into(),
        "interval_us".into(),
        "err_us".into(),
    ]];
    for h in &e.estimates {
        for s in &e.stats {
            let v = &h.stats[s];
            rows.push(vec![
                h.host.clone(),
                s.clone(),
                num(v.us),
                match (v.lo_us, v.hi_us) {
                    (Some(lo), Some(hi)) => format!("{} .. {}", num(lo), num(hi)),
                    _ => "-".into(),
                },
                v.err_us.map_or("-".into(), num),
            ]);
        }
    }
    render(&mut out, &rows);
    let _ = writeln!(out);
    let mut rows = vec![vec![
        "pair".to_string(),
        "samples".into(),
        "lost".into(),
        "hw_us".into(),
        "rtt_mean_us".into(),
        "rtt_p50_us".into(),
        "rtt_p99_us".into(),
        "residual_mean_us".into(),
        "residual_p50_us".into(),
    ]];
    for p in &e.pairs {
        rows.push(vec![
            format!("{}-{}", p.from, p.to),
            p.samples.to_string(),
            p.lost.to_string(),
            num(p.hardware_us),
            num(p.rtt_us["mean"]),
            num(p.rtt_us["p50"]),
            num(p.rtt_us["p99"]),
            if e.determined == Determined::Over {
                num(p.residual_us["mean"])
            } else {
                "-".into()
            },
            if e.determined == Determined::Over {
                num(p.residual_us["p50"])
            } else {
                "-".into()
            },
        ]);
    }
    render(&mut out, &rows);
    let _ = writeln!(out);
    for n in &e.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// Columns aligned: text left, numbers right.
fn render(out: &mut String, rows: &[Vec<String>]) {
    let cols = rows[0].len();
    let width: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for (i, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, v)| {
                let numeric = i > 0 && c > 1 || (i > 0 && c == 1 && v.parse::<f64>().is_ok());
                if numeric {
                    format!("{v:>w$}", w = width[c])
                } else {
                    format!("{v:<w$}", w = width[c])
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}
