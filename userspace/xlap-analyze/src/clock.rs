//! Mapping the monotonic clocks of several hosts onto one (the first run's).
//!
//! Runs on one kernel (same boot id) share a clock: nothing to map. Between
//! kernels the offset (and its drift over the run) is estimated from two-way
//! traffic, NTP style: a packet A→B gives rx_B − tx_A = delay + θ, one B→A
//! gives rx_A − tx_B = delay − θ; the minima over a window bound θ to
//! ±(min_ab + min_ba)/2. Windows along the run give θ(t), fitted by least
//! squares (offset and drift). Without traffic both ways, the recorded
//! (monotonic, realtime) pairs are used, good only as far as the hosts'
//! clocks are synchronised.

use crate::Result;
use duckdb::Connection;
use serde::Serialize;

/// How one clock domain maps onto the reference: `ref = ts − offset −
/// drift_ppm·1e-6·(ts − offset − t0)`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Mapping {
    /// The domain: a boot id.
    pub domain: String,
    pub offset_ns: f64,
    pub drift_ppm: f64,
    /// Reference time (ns) at which `offset_ns` holds.
    pub t0_ns: i64,
    /// Half-width of the interval the true offset lies in, when known.
    pub uncertainty_ns: Option<f64>,
    /// Half-width of the interval the true drift lies in, when known (a
    /// mapping from two-way traffic over two windows or more).
    pub drift_uncertainty_ppm: Option<f64>,
    pub method: String,
    /// Windows that had packets both ways.
    pub windows: usize,
}

impl Mapping {
    pub fn identity(domain: &str, method: &str) -> Mapping {
        Mapping {
            domain: domain.to_string(),
            offset_ns: 0.0,
            drift_ppm: 0.0,
            t0_ns: 0,
            uncertainty_ns: Some(0.0),
            drift_uncertainty_ppm: Some(0.0),
            method: method.to_string(),
            windows: 0,
        }
    }
}

/// Number of windows the run is cut into for the drift fit.
const WINDOWS: i64 = 10;

/// Estimates the mapping of `domain` onto `reference` from the table `wire`
/// (flow, kind, seq, tx_domain, tx_ns, rx_domain, rx_ns): one row per packet
/// seen leaving one domain and entering another.
///
/// Two passes: the first fits θ(t) from raw per-window minima; the second
/// removes that drift from every delay before taking the minima again, so the
/// two minima of a window need not come from the same instant (at 50 ppm, θ
/// moves several µs within a window).
pub fn estimate(conn: &Connection, reference: &str, domain: &str) -> Result<Option<Mapping>> {
    let Some((t0, first)) = window_minima(conn, reference, domain, 0.0, None)? else {
        return Ok(None);
    };
    let (_, b1) = fit(&first
        .iter()
        .map(|w| (w.t - t0, w.theta))
        .collect::<Vec<_>>());
    let (_, second) = window_minima(conn, reference, domain, b1, Some(t0))?.expect("same rows");
    let (a, b2) = fit(&second
        .iter()
        .map(|w| (w.t - t0, w.theta))
        .collect::<Vec<_>>());
    let residual = second
        .iter()
        .map(|w| (w.theta - (a + b2 * (w.t - t0))).abs())
        .fold(0.0, f64::max);
    let bound = second.iter().map(|w| w.half_rtt).fold(0.0, f64::max);
    let width = second.iter().map(|w| w.width).fold(0.0, f64::max);
    Ok(Some(Mapping {
        domain: domain.to_string(),
        offset_ns: a,
        drift_ppm: (b1 + b2) * 1e6,
        t0_ns: t0 as i64,
        uncertainty_ns: Some(bound + residual + b2.abs() * width / 2.0),
        drift_uncertainty_ppm: slope_error_bound(&second, t0).map(|b| b * 1e6),
        method: "two-way traffic (minimum one-way delays per window, least-squares drift)".into(),
        windows: second.len(),
    }))
}

/// One window's estimate: θ = (min_ab − min_ba)/2 within ± half_rtt.
struct Window {
    t: f64,
    theta: f64,
    half_rtt: f64,
    width: f64,
}

/// Per-window minima of the delays both ways after removing a drift `b`
/// (ns/ns) around `t0` (the first window's centre when `None`).
fn window_minima(
    conn: &Connection,
    reference: &str,
    domain: &str,
    b: f64,
    t0: Option<f64>,
) -> Result<Option<(f64, Vec<Window>)>> {
    let t0_sql = t0.map_or("NULL".to_string(), |t| format!("{t}"));
    // The domains (boot ids from run.json) are bound: $1 the reference, $2
    // the other.
    let sql = format!(
        "WITH d AS (
            SELECT CASE WHEN tx_domain = $1 THEN tx_ns ELSE rx_ns END::DOUBLE AS t_ref,
                   tx_domain = $1 AS ab, (rx_ns - tx_ns)::DOUBLE AS delay
            FROM wire
            WHERE (tx_domain = $1 AND rx_domain = $2) OR (tx_domain = $2 AND rx_domain = $1)),
         b AS (SELECT min(t_ref) lo, max(t_ref) + 1 hi FROM d),
         w AS (SELECT least({n} - 1, floor((t_ref - lo) * {n} / (hi - lo)))::BIGINT AS win, ab, t_ref,
                      delay - CASE WHEN ab THEN 1 ELSE -1 END * {b} * (t_ref - coalesce({t0_sql}, lo)) AS delay,
                      (hi - lo) / {n} AS width
               FROM d, b)
         SELECT avg(t_ref), min(delay) FILTER (WHERE ab), min(delay) FILTER (WHERE NOT ab), any_value(width)
         FROM w GROUP BY win
         HAVING count(*) FILTER (WHERE ab) > 0 AND count(*) FILTER (WHERE NOT ab) > 0
         ORDER BY win",
        n = WINDOWS
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows: Vec<Window> = stmt
        .query_map([reference, domain], |row| {
            let (t, ab, ba, width): (f64, f64, f64, f64) =
                (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
            Ok(Window {
                t,
                theta: (ab - ba) / 2.0,
                half_rtt: (ab + ba) / 2.0,
                width,
            })
        })?
        .collect::<std::result::Result<_, _>>()?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    Ok(Some((t0.unwrap_or(first.t), rows)))
}

/// How far the least-squares slope through the windows' offsets can be
/// from the true drift (ns/ns) when each window's offset is off by at most
/// its half round trip: the slope is Σ(x − x̄)·y / Σ(x − x̄)², so errors
/// e_i with |e_i| ≤ h_i move it by at most Σ|x_i − x̄|·h_i / Σ(x − x̄)².
/// `None` for a single window (no slope to bound).
fn slope_error_bound(windows: &[Window], t0: f64) -> Option<f64> {
    let n = windows.len() as f64;
    let mx = windows.iter().map(|w| w.t - t0).sum::<f64>() / n;
    let sxx: f64 = windows.iter().map(|w| (w.t - t0 - mx).powi(2)).sum();
    (sxx > 0.0).then(|| {
        windows
            .iter()
            .map(|w| (w.t - t0 - mx).abs() * w.half_rtt)
            .sum::<f64>()
            / sxx
    })
}

/// Least-squares line through (x, y): (intercept, slope); a single point
/// gives a flat line.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return (my, 0.0);
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = sxy / sxx;
    (my - b * mx, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = (0..10)
            .map(|i| (i as f64 * 1e9, 3.7e6 + 50e-6 * i as f64 * 1e9))
            .collect();
        let (a, b) = fit(&pts);
        assert!((a - 3.7e6).abs() < 1e-3, "{a}");
        assert!((b - 50e-6).abs() < 1e-12, "{b}");
        assert_eq!(fit(&[(5.0, 2.0)]), (2.0, 0.0));
    }

    #[test]
    fn offset_and_drift_come_back_from_synthetic_two_way_traffic() {
        // A→B and B→A packets with a 40 µs minimum delay (plus jitter), B's
        // clock 3.7 ms ahead and running 50 ppm fast.
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE wire (tx_domain VARCHAR, tx_ns BIGINT, rx_domain VARCHAR, rx_ns BIGINT);
             INSERT INTO wire
             SELECT 'A', t, 'B', (t + 40000 + (i * 7919) % 30000 + 3700000 + (t * 0.00005))::BIGINT
             FROM (SELECT i, 1000000000 + i * 1000000 AS t FROM range(2000) r(i));
             INSERT INTO wire
             SELECT 'B', (t + 3700000 + t * 0.00005)::BIGINT, 'A', t + 40000 + (i * 104729) % 30000
             FROM (SELECT i, 1000500000 + i * 1000000 AS t FROM range(2000) r(i));",
        )
        .unwrap();
        let m = estimate(&conn, "A", "B").unwrap().expect("two-way traffic");
        let true_offset_at_t0 = 3_700_000.0 + m.t0_ns as f64 * 0.00005;
        let u = m.uncertainty_ns.unwrap();
        assert!(
            (m.offset_ns - true_offset_at_t0).abs() <= u,
            "{m:?} vs {true_offset_at_t0}"
        );
        assert!((m.drift_ppm - 50.0).abs() < 5.0, "{m:?}");
        // The stated drift bound holds the truth; it is wide (a 40 µs
        // minimum delay each way over 2 s of windows: ~61 ppm), since only
        // causality bounds each window's offset.
        let du = m.drift_uncertainty_ppm.unwrap();
        assert!((m.drift_ppm - 50.0).abs() <= du, "{m:?}");
        assert!(du < 100.0, "{m:?}");
        assert!(u < 100_000.0, "{m:?}");
        assert_eq!(m.windows, 10);
        assert!(estimate(&conn, "A", "C").unwrap().is_none());
        // Boot ids are matched as they are, quotes and all.
        conn.execute_batch(
            "UPDATE wire SET tx_domain = tx_domain || ''');--', rx_domain = rx_domain || ''');--';",
        )
        .unwrap();
        let quoted = estimate(&conn, "A');--", "B');--")
            .unwrap()
            .expect("the same traffic");
        assert_eq!((quoted.offset_ns, quoted.windows), (m.offset_ns, m.windows));
        assert!(estimate(&conn, "A", "B").unwrap().is_none());
    }
}
