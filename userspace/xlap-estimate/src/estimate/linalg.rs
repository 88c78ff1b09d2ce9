//! The small dense linear algebra of `estimate`: least squares by
//! Householder QR, and the eigenvalues of a symmetric matrix (Jacobi) for
//! the rank and the condition number.

/// A dense row-major matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Matrix {
    pub fn zeros(rows: usize, cols: usize) -> Matrix {
        Matrix {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    pub fn get(&self, r: usize, c: usize) -> f64 {
        self.data[r * self.cols + c]
    }

    pub fn set(&mut self, r: usize, c: usize, v: f64) {
        self.data[r * self.cols + c] = v;
    }

    /// `Aᵀ·A`.
    pub fn gram(&self) -> Matrix {
        let mut g = Matrix::zeros(self.cols, self.cols);
        for i in 0..self.cols {
            for j in 0..self.cols {
                let s = (0..self.rows)
                    .map(|r| self.get(r, i) * self.get(r, j))
                    .sum();
                g.set(i, j, s);
            }
        }
        g
    }

    /// `A·x`.
    pub fn mul_vec(&self, x: &[f64]) -> Vec<f64> {
        (0..self.rows)
            .map(|r| (0..self.cols).map(|c| self.get(r, c) * x[c]).sum())
            .collect()
    }

    /// The rows with these indices.
    pub fn select_rows(&self, rows: &[usize]) -> Matrix {
        let mut m = Matrix::zeros(rows.len(), self.cols);
        for (i, r) in rows.iter().enumerate() {
            m.data[i * self.cols..(i + 1) * self.cols]
                .copy_from_slice(&self.data[r * self.cols..(r + 1) * self.cols]);
        }
        m
    }
}

/// Eigenvalues of a symmetric matrix, ascending (cyclic Jacobi rotations).
pub fn symmetric_eigenvalues(m: &Matrix) -> Vec<f64> {
    assert_eq!(m.rows, m.cols, "square matrix");
    let n = m.rows;
    let mut a = m.clone();
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |j| *j != i).map(move |j| (i, j)))
            .map(|(i, j)| a.get(i, j).powi(2))
            .sum();
        let scale: f64 = a.data.iter().map(|v| v * v).sum();
        if off <= 1e-30 * scale.max(f64::MIN_POSITIVE) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a.get(p, q);
                if apq == 0.0 {
                    continue;
                }
                let theta = (a.get(q, q) - a.get(p, p)) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a.get(k, p), a.get(k, q));
                    a.set(k, p, c * akp - s * akq);
                    a.set(k, q, s * akp + c * akq);
                }
                for k in 0..n {
                    let (apk, aqk) = (a.get(p, k), a.get(q, k));
                    a.set(p, k, c * apk - s * aqk);
                    a.set(q, k, s * apk + c * aqk);
                }
            }
        }
    }
    let mut ev: Vec<f64> = (0..n).map(|i| a.get(i, i)).collect();
    ev.sort_by(f64::total_cmp);
    ev
}

/// Singular values of `a` (ascending), from the eigenvalues of `AᵀA`.
pub fn singular_values(a: &Matrix) -> Vec<f64> {
    symmetric_eigenvalues(&a.gram())
        .into_iter()
        .map(|l| l.max(0.0).sqrt())
        .collect()
}

/// Relative size below which a singular value counts as zero. They come
/// from eigenvalues of `AᵀA` (exact to ~1e-15 relative), so a zero one
/// shows up as ~1e-8: the designs' entries are small integers, and any
/// genuinely independent set of pairs is far above this.
const RANK_TOLERANCE: f64 = 1e-6;

/// The rank of `a`.
pub fn rank(a: &Matrix) -> usize {
    let sv = singular_values(a);
    let max = sv.last().copied().unwrap_or(0.0);
    sv.iter()
        .filter(|s| **s > RANK_TOLERANCE * max.max(f64::MIN_POSITIVE))
        .count()
}

/// `σ_max / σ_min` of `a` (infinite when rank-deficient).
pub fn condition_number(a: &Matrix) -> f64 {
    let sv = singular_values(a);
    match (sv.first(), sv.last()) {
        (Some(&lo), Some(&hi)) if lo > RANK_TOLERANCE * hi => hi / lo,
        _ => f64::INFINITY,
    }
}

/// A least-squares solver for one matrix of full column rank: the
/// Householder QR of `A`, reused for many right-hand sides.
#[derive(Clone, Debug)]
pub struct LeastSquares {
    /// R above the diagonal; the Householder vectors below (with `betas`).
    qr: Matrix,
    betas: Vec<f64>,
    diag: Vec<f64>,
}

impl LeastSquares {
    /// `None` when `a` has fewer rows than columns or is rank-deficient.
    pub fn new(a: &Matrix) -> Option<LeastSquares> {
        let (m, n) = (a.rows, a.cols);
        if m < n || rank(a) < n {
            return None;
        }
        let mut qr = a.clone();
        let mut betas = vec![0.0; n];
        let mut diag = vec![0.0; n];
        for k in 0..n {
            let norm = (k..m).map(|r| qr.get(r, k).powi(2)).sum::<f64>().sqrt();
            let x0 = qr.get(k, k);
            let alpha = if x0 > 0.0 { -norm } else { norm };
            // v = x - alpha e1, stored in column k from row k.
            qr.set(k, k, x0 - alpha);
            let vnorm2: f64 = (k..m).map(|r| qr.get(r, k).powi(2)).sum();
            let beta = if vnorm2 == 0.0 { 0.0 } else { 2.0 / vnorm2 };
            for j in k + 1..n {
                let dot: f64 = (k..m).map(|r| qr.get(r, k) * qr.get(r, j)).sum();
                for r in k..m {
                    let v = qr.get(r, j) - beta * dot * qr.get(r, k);
                    qr.set(r, j, v);
                }
            }
            betas[k] = beta;
            diag[k] = alpha;
        }
        Some(LeastSquares { qr, betas, diag })
    }

    /// The `x` that minimises `|A·x - b|`.
    pub fn solve(&self, b: &[f64]) -> Vec<f64> {
        let (m, n) = (self.qr.rows, self.qr.cols);
        assert_eq!(b.len(), m, "right-hand side length");
        let mut y = b.to_vec();
        for k in 0..n {
            let dot: f64 = (k..m).map(|r| self.qr.get(r, k) * y[r]).sum();
            for (r, yr) in y.iter_mut().enumerate().skip(k) {
                *yr -= self.betas[k] * dot * self.qr.get(r, k);
            }
        }
        let mut x = vec![0.0; n];
        for k in (0..n).rev() {
            let s: f64 = (k + 1..n).map(|j| self.qr.get(k, j) * x[j]).sum();
            x[k] = (y[k] - s) / self.diag[k];
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: &[&[f64]]) -> Matrix {
        let mut m = Matrix::zeros(rows.len(), rows[0].len());
        for (r, row) in rows.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                m.set(r, c, *v);
            }
        }
        m
    }

    #[test]
    fn least_squares_fits_a_line_and_solves_square_systems() {
        // y = 1 + 2x through (0,1.1) (1,2.9) (2,5.1) (3,6.9): x = (1.06, 1.96).
        let a = matrix(&[&[1.0, 0.0], &[1.0, 1.0], &[1.0, 2.0], &[1.0, 3.0]]);
        let x = LeastSquares::new(&a).unwrap().solve(&[1.1, 2.9, 5.1, 6.9]);
        assert!(
            (x[0] - 1.06).abs() < 1e-12 && (x[1] - 1.96).abs() < 1e-12,
            "{x:?}"
        );
        let sq = matrix(&[&[2.0, 2.0, 0.0], &[2.0, 0.0, 2.0], &[0.0, 2.0, 2.0]]);
        let x = LeastSquares::new(&sq).unwrap().solve(&[6.0, 8.0, 10.0]);
        for (got, want) in x.iter().zip([1.0, 2.0, 3.0]) {
            assert!((got - want).abs() < 1e-12, "{x:?}");
        }
    }

    #[test]
    fn eigenvalues_rank_and_condition() {
        let g = matrix(&[&[2.0, 1.0], &[1.0, 2.0]]);
        let ev = symmetric_eigenvalues(&g);
        assert!((ev[0] - 1.0).abs() < 1e-12 && (ev[1] - 3.0).abs() < 1e-12);
        // The triangle of three hosts: singular values 4 and 2 (twice).
        let tri = matrix(&[&[2.0, 2.0, 0.0], &[2.0, 0.0, 2.0], &[0.0, 2.0, 2.0]]);
        assert!((condition_number(&tri) - 2.0).abs() < 1e-9);
        assert_eq!(rank(&tri), 3);
        // A path a-b-c is bipartite: rank 2.
        let path = matrix(&[&[2.0, 2.0, 0.0], &[0.0, 2.0, 2.0]]);
        assert_eq!(rank(&path), 2);
        assert!(condition_number(&path).is_infinite());
        assert!(LeastSquares::new(&path).is_none());
        let even_cycle = matrix(&[
            &[2.0, 2.0, 0.0, 0.0],
            &[0.0, 2.0, 2.0, 0.0],
            &[0.0, 0.0, 2.0, 2.0],
            &[2.0, 0.0, 0.0, 2.0],
        ]);
        assert_eq!(rank(&even_cycle), 3);
        assert!(LeastSquares::new(&even_cycle).is_none());
    }
}
