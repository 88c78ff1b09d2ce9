//! The equations of the estimate: one per measured pair,
//! `RTT_ij = 2·t_i + 2·t_j + 2·h_ij`, over the hosts named in the files.

use super::linalg::{condition_number, rank, LeastSquares, Matrix};

/// The design of the system: which hosts each equation (pair) involves.
#[derive(Clone, Debug)]
pub struct System {
    /// Host names, in first-seen order.
    pub hosts: Vec<String>,
    /// Each equation's two host indices.
    pub pairs: Vec<(usize, usize)>,
    /// `pairs.len() × hosts.len()`, a 2 at each pair's hosts.
    pub design: Matrix,
}

/// How many equations there are for the unknowns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Determined {
    /// As many independent equations as hosts: no residuals.
    Exactly,
    /// More: least squares, with residuals.
    Over,
}

/// Why a system cannot be solved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    TooFewHosts(usize),
    /// Rank below the number of hosts; the pairs (host indices) whose
    /// measurement would complete it.
    Underdetermined {
        rank: usize,
        add: Vec<(usize, usize)>,
    },
}

impl System {
    /// The system of `pairs` given by host names.
    pub fn new<S: AsRef<str>>(pairs: &[(S, S)]) -> System {
        let mut hosts: Vec<String> = Vec::new();
        let mut index = |name: &str| match hosts.iter().position(|h| h == name) {
            Some(i) => i,
            None => {
                hosts.push(name.to_string());
                hosts.len() - 1
            }
        };
        let pairs: Vec<(usize, usize)> = pairs
            .iter()
            .map(|(a, b)| (index(a.as_ref()), index(b.as_ref())))
            .collect();
        let design = design(hosts.len(), &pairs);
        System {
            hosts,
            pairs,
            design,
        }
    }

    pub fn pair_name(&self, (i, j): (usize, usize)) -> String {
        format!("{}-{}", self.hosts[i], self.hosts[j])
    }

    /// The solver, or why there is none.
    pub fn solver(&self) -> Result<(LeastSquares, Determined), Refusal> {
        let n = self.hosts.len();
        if n < 3 {
            return Err(Refusal::TooFewHosts(n));
        }
        let r = rank(&self.design);
        if r < n {
            return Err(Refusal::Underdetermined {
                rank: r,
                add: self.completion(),
            });
        }
        let ls = LeastSquares::new(&self.design).expect("full column rank");
        let det = if self.pairs.len() > n {
            Determined::Over
        } else {
            Determined::Exactly
        };
        Ok((ls, det))
    }

    pub fn condition_number(&self) -> f64 {
        condition_number(&self.design)
    }

    /// Pairs to measure besides the given ones so that every host is
    /// determined: greedily, each unmeasured pair that raises the rank (the
    /// fewest possible: rows form a matroid).
    fn completion(&self) -> Vec<(usize, usize)> {
        let n = self.hosts.len();
        let mut have = self.pairs.clone();
        let mut r = rank(&design(n, &have));
        let mut add = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                if r == n {
                    return add;
                }
                if have
                    .iter()
                    .any(|&(a, b)| (a, b) == (i, j) || (a, b) == (j, i))
                {
                    continue;
                }
                have.push((i, j));
                let r2 = rank(&design(n, &have));
                if r2 > r {
                    r = r2;
                    add.push((i, j));
                } else {
                    have.pop();
                }
            }
        }
        add
    }
}

fn design(hosts: usize, pairs: &[(usize, usize)]) -> Matrix {
    let mut m = Matrix::zeros(pairs.len(), hosts);
    for (r, &(i, j)) in pairs.iter().enumerate() {
        m.set(r, i, m.get(r, i) + 2.0);
        m.set(r, j, m.get(r, j) + 2.0);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_hosts_need_all_three_pairs_and_are_told_which_is_missing() {
        let full = System::new(&[("a", "b"), ("b", "c"), ("c", "a")]);
        assert_eq!(full.solver().unwrap().1, Determined::Exactly);
        let path = System::new(&[("a", "b"), ("b", "c")]);
        assert_eq!(
            path.solver().unwrap_err(),
            Refusal::Underdetermined {
                rank: 2,
                add: vec![(0, 2)]
            }
        );
        assert_eq!(path.pair_name((0, 2)), "a-c");
        let two = System::new(&[("a", "b"), ("b", "a")]);
        assert_eq!(two.solver().unwrap_err(), Refusal::TooFewHosts(2));
    }

    #[test]
    fn an_even_cycle_of_four_is_not_enough_but_one_chord_is() {
        let ring = System::new(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")]);
        let Err(Refusal::Underdetermined { rank: 3, add }) = ring.solver() else {
            panic!("a 4-cycle is bipartite: rank 3")
        };
        assert_eq!(add, vec![(0, 2)]);
        let chord = System::new(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "a"), ("a", "c")]);
        assert_eq!(chord.solver().unwrap().1, Determined::Over);
        // Two separate pairs: two more measurements.
        let apart = System::new(&[("a", "b"), ("c", "d")]);
        let Err(Refusal::Underdetermined { rank: 2, add }) = apart.solver() else {
            panic!("two disjoint pairs have rank 2")
        };
        assert_eq!(add.len(), 2);
    }
}
