//! Just enough SVG for the report's plots: a frame with linear or log10
//! axes, and marks (the drawn data, class `mark`, which the report's
//! self-check counts).

use std::fmt::Write;

/// Escapes text for XML (`xlap_records::escape`).
pub fn esc(s: &str) -> String {
    xlap_records::escape::xml(s)
}

/// The range of the values an axis shows: finite and ordered by
/// construction, so no scale built from it can be infinite, empty or NaN
/// (a report once looped forever on a log scale folded from an empty
/// panel's `f64::INFINITY`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Extent {
    lo: f64,
    hi: f64,
}

/// Beyond this magnitude an axis is clamped (nanoseconds of a whole
/// century are 3e18; a span of ±1e300 still has a finite width).
const MAX_MAGNITUDE: f64 = 1e300;

impl Extent {
    /// From two ends in either order; `None` unless both are finite.
    pub fn new(a: f64, b: f64) -> Option<Extent> {
        if !(a.is_finite() && b.is_finite()) {
            return None;
        }
        let clamp = |v: f64| v.clamp(-MAX_MAGNITUDE, MAX_MAGNITUDE);
        Some(Extent {
            lo: clamp(a.min(b)),
            hi: clamp(a.max(b)),
        })
    }

    /// The range of the finite values given; `None` when there is none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Extent> {
        values
            .into_iter()
            .filter(|v| v.is_finite())
            .fold(None, |e: Option<Extent>, v| match e {
                None => Extent::new(v, v),
                Some(e) => Extent::new(e.lo.min(v), e.hi.max(v)),
            })
    }

    /// Widened to take `v` in (a non-finite `v` changes nothing).
    pub fn with(self, v: f64) -> Extent {
        Extent::new(self.lo.min(v), self.hi.max(v)).unwrap_or(self)
    }

    /// The low end raised to at least `floor` (the high end with it when
    /// the whole range lies below).
    pub fn at_least(self, floor: f64) -> Extent {
        Extent::new(self.lo.max(floor), self.hi.max(floor)).unwrap_or(self)
    }

    pub fn lo(&self) -> f64 {
        self.lo
    }

    pub fn hi(&self) -> f64 {
        self.hi
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Scale {
    Linear {
        lo: f64,
        hi: f64,
    },
    /// Positive values only; lo and hi are snapped to decades.
    Log {
        lo: f64,
        hi: f64,
    },
}

/// Ticks an axis draws at most: tick generation counts, it never loops
/// on a float.
const MAX_TICKS: usize = 12;
/// The smallest and largest value a log axis shows.
const LOG_FLOOR: f64 = 1e-12;
const LOG_CEILING: f64 = 1e300;

impl Scale {
    /// A linear scale over `e`; a single value gets a unit-wide range.
    pub fn linear(e: Extent) -> Scale {
        let (lo, hi) = (e.lo, e.hi);
        let width = (hi - lo).max(lo.abs() * 1e-9);
        let hi = if width > 0.0 { lo + width } else { lo + 1.0 };
        Scale::Linear { lo, hi }
    }

    /// A log10 scale over `e`, its ends snapped to decades (at least one
    /// decade wide); values at or below zero are drawn at the low end.
    pub fn log(e: Extent) -> Scale {
        let lo = e.lo.clamp(LOG_FLOOR, LOG_CEILING);
        let hi = e.hi.clamp(lo, LOG_CEILING);
        let (a, b) = (lo.log10().floor(), hi.log10().ceil());
        let b = if b > a { b } else { a + 1.0 };
        Scale::Log {
            lo: 10f64.powf(a),
            hi: 10f64.powf(b),
        }
    }

    /// Position in [0, 1] (a non-finite value maps to the low end).
    pub fn unit(&self, v: f64) -> f64 {
        let u = match *self {
            Scale::Linear { lo, hi } => (v - lo) / (hi - lo),
            Scale::Log { lo, hi } => (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()),
        };
        if u.is_finite() {
            u
        } else {
            0.0
        }
    }

    /// Tick values: 1-2-5 steps (linear), decades (log; every k-th one
    /// over many decades): at most [`MAX_TICKS`] + 1, by construction.
    pub fn ticks(&self) -> Vec<f64> {
        match *self {
            Scale::Linear { lo, hi } => {
                let raw = (hi - lo) / 6.0;
                let mag = 10f64.powf(raw.log10().floor());
                let step = [1.0, 2.0, 5.0, 10.0]
                    .iter()
                    .map(|m| m * mag)
                    .find(|s| *s >= raw)
                    .unwrap_or(mag * 10.0);
                let first = (lo / step).ceil() * step;
                (0..=MAX_TICKS)
                    .map(|i| first + step * i as f64)
                    .take_while(|t| *t <= hi + step * 1e-9)
                    .filter(|t| t.is_finite())
                    .collect()
            }
            Scale::Log { lo, hi } => {
                let (a, b) = (lo.log10().round() as i32, hi.log10().round() as i32);
                let decades = (b - a).max(0) as usize;
                let every = decades.div_ceil(MAX_TICKS).max(1);
                (0..=decades)
                    .step_by(every)
                    .map(|i| 10f64.powi(a + i as i32))
                    .collect()
            }
        }
    }
}

/// A number for an axis label.
pub fn label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 10.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A plot area inside an SVG of `width`×`height`, with margins for labels.
pub struct Frame {
    pub width: f64,
    pub height: f64,
    pub left: f64,
    pub right: f64,
    pub top: f64,
    pub bottom: f64,
    pub x: Scale,
    pub y: Scale,
    /// y grows downwards (rows, or a reversed axis).
    pub y_down: bool,
    body: String,
}

impl Frame {
    pub fn new(width: f64, height: f64, left: f64, x: Scale, y: Scale) -> Frame {
        Frame {
            width,
            height,
            left,
            right: 20.0,
            top: 12.0,
            bottom: 42.0,
            x,
            y,
            y_down: false,
            body: String::new(),
        }
    }

    pub fn px(&self, v: f64) -> f64 {
        self.left + self.x.unit(v).clamp(-0.02, 1.02) * (self.width - self.left - self.right)
    }

    pub fn py(&self, v: f64) -> f64 {
        let u = self.y.unit(v).clamp(-0.02, 1.02);
        let h = self.height - self.top - self.bottom;
        if self.y_down {
            self.top + u * h
        } else {
            self.top + (1.0 - u) * h
        }
    }

    /// Appends raw SVG.
    pub fn push(&mut self, s: &str) {
        self.body.push_str(s);
        self.body.push('\n');
    }

    pub fn x_axis(&mut self, title: &str) {
        let y0 = self.height - self.bottom;
        let mut s = format!(
            r#"<line x1="{:.1}" y1="{y0:.1}" x2="{:.1}" y2="{y0:.1}" class="axis"/>"#,
            self.left,
            self.width - self.right
        );
        for t in self.x.ticks() {
            let x = self.px(t);
            let _ = write!(
                s,
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{y0:.1}" class="grid"/><text x="{x:.1}" y="{:.1}" class="tick" text-anchor="middle">{}</text>"#,
                self.top,
                y0 + 14.0,
                label(t)
            );
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" class="title" text-anchor="middle">{}</text>"#,
            (self.left + self.width - self.right) / 2.0,
            self.height - 6.0,
            esc(title)
        );
        self.push(&s);
    }

    pub fn y_axis(&mut self, title: &str) {
        let mut s = format!(
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" class="axis"/>"#,
            self.top,
            self.height - self.bottom,
            x = self.left
        );
        for t in self.y.ticks() {
            let y = self.py(t);
            let _ = write!(
                s,
                r#"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" class="grid"/><text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">{}</text>"#,
                self.left,
                self.width - self.right,
                self.left - 4.0,
                y + 4.0,
                label(t)
            );
        }
        let _ = write!(
            s,
            r#"<text transform="translate(12 {:.1}) rotate(-90)" class="title" text-anchor="middle">{}</text>"#,
            (self.top + self.height - self.bottom) / 2.0,
            esc(title)
        );
        self.push(&s);
    }

    /// A label left of the plot area at a row's y.
    pub fn row_label(&mut self, y: f64, text: &str) {
        self.push(&format!(
            r#"<text x="{:.1}" y="{:.1}" class="row" text-anchor="end">{}</text>"#,
            self.left - 6.0,
            y + 4.0,
            esc(text)
        ));
    }

    pub fn finish(self, aria: &str) -> String {
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{a}">
{body}</svg>"#,
            w = self.width,
            h = self.height,
            a = esc(aria),
            body = self.body
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_scale_snaps_to_decades_and_maps_ends() {
        let s = Scale::log(Extent::new(3.0, 4000.0).unwrap());
        assert_eq!(s.ticks(), vec![1.0, 10.0, 100.0, 1000.0, 10000.0]);
        assert!((s.unit(1.0) - 0.0).abs() < 1e-12);
        assert!((s.unit(10000.0) - 1.0).abs() < 1e-12);
        assert!((s.unit(100.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn linear_ticks_are_round_and_cover_the_range() {
        let t = Scale::linear(Extent::new(0.0, 97.0).unwrap()).ticks();
        assert_eq!(t, vec![0.0, 20.0, 40.0, 60.0, 80.0]);
        assert_eq!(label(0.25), "0.25");
        assert_eq!(label(2500.0), "2500");
    }

    /// The report's endless loop: an empty panel's extent, folded from
    /// infinity, made a log scale of [inf, inf] whose decade loop never
    /// ended. No extent is made from non-finite values at all now.
    #[test]
    fn no_extent_from_non_finite_values_and_ticks_are_bounded() {
        assert_eq!(Extent::of(std::iter::empty()), None);
        assert_eq!(Extent::of([f64::INFINITY, f64::NAN]), None);
        assert_eq!(Extent::new(f64::INFINITY, 1.0), None);
        let e = Extent::of([f64::NAN, 5.0, f64::NEG_INFINITY, 2.0]).unwrap();
        assert_eq!((e.lo(), e.hi()), (2.0, 5.0));
        for (a, b) in [
            (0.0, 0.0),
            (-1.0, -1.0),
            (1e-300, 1e300),
            (-1e308, 1e308),
            (1e15, 1e15 + 1.0),
            (f64::MIN_POSITIVE, f64::MIN_POSITIVE),
            (5.0, 5.0),
        ] {
            let e = Extent::new(a, b).unwrap();
            for s in [Scale::linear(e), Scale::log(e)] {
                let t = s.ticks();
                assert!(t.len() <= MAX_TICKS + 1, "{s:?}: {} ticks", t.len());
                assert!(t.iter().all(|v| v.is_finite()), "{s:?}: {t:?}");
                for v in [a, b, f64::NAN, f64::INFINITY, 0.0] {
                    let u = s.unit(v);
                    assert!(u.is_finite(), "{s:?} at {v}: {u}");
                }
            }
        }
    }
}
