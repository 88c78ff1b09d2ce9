//! Just enough SVG for the report's plots: a frame with linear or log10
//! axes, and marks (the drawn data, class `mark`, which the report's
//! self-check counts).

use std::fmt::Write;

/// Escapes text for XML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
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

impl Scale {
    pub fn linear(lo: f64, hi: f64) -> Scale {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        Scale::Linear { lo, hi }
    }

    pub fn log(lo: f64, hi: f64) -> Scale {
        let lo = lo.max(1e-12);
        let hi = hi.max(lo * 10.0);
        Scale::Log {
            lo: 10f64.powf(lo.log10().floor()),
            hi: 10f64.powf(hi.log10().ceil()),
        }
    }

    /// Position in [0, 1].
    pub fn unit(&self, v: f64) -> f64 {
        match *self {
            Scale::Linear { lo, hi } => (v - lo) / (hi - lo),
            Scale::Log { lo, hi } => (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()),
        }
    }

    /// Tick values: 1-2-5 steps (linear), decades (log).
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
                let mut t = (lo / step).ceil() * step;
                let mut out = Vec::new();
                while t <= hi + step * 1e-9 {
                    out.push(t);
                    t += step;
                }
                out
            }
            Scale::Log { lo, hi } => {
                let mut out = Vec::new();
                let mut t = lo;
                while t <= hi * 1.0001 {
                    out.push(t);
                    t *= 10.0;
                }
                out
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
        let s = Scale::log(3.0, 4000.0);
        assert_eq!(s.ticks(), vec![1.0, 10.0, 100.0, 1000.0, 10000.0]);
        assert!((s.unit(1.0) - 0.0).abs() < 1e-12);
        assert!((s.unit(10000.0) - 1.0).abs() < 1e-12);
        assert!((s.unit(100.0) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn linear_ticks_are_round_and_cover_the_range() {
        let t = Scale::linear(0.0, 97.0).ticks();
        assert_eq!(t, vec![0.0, 20.0, 40.0, 60.0, 80.0]);
        assert_eq!(label(0.25), "0.25");
        assert_eq!(label(2500.0), "2500");
    }
}
