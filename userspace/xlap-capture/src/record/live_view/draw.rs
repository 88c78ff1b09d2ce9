//! The terminal view (`--live`): once a second, the rates, the losses and
//! each kind's end-to-end and stages over the last window.

use super::*;

impl LiveView {
    pub(super) fn render(&mut self, losses: &[(&str, u64)]) {
        let secs = self.last_tick.elapsed().as_secs_f64().max(1e-3);
        let stamp_rate = (self.stamps - self.last_stamps) as f64 / secs;
        let packet_rate = (self.packets - self.last_packets) as f64 / secs;
        self.last_stamps = self.stamps;
        self.last_packets = self.packets;
        self.last_tick = Instant::now();
        if self.window_start.elapsed() >= WINDOW {
            self.previous = std::mem::take(&mut self.current);
            self.window_start = Instant::now();
        }
        let (cross_view, cross_om) = self
            .cross
            .as_ref()
            .map_or((String::new(), String::new()), |c| c.render());
        if let Some(m) = &self.metrics {
            let one_in = self.sample.as_ref().map_or(1, |s| s.0);
            let text = openmetrics(
                &self.total,
                self.stamps,
                self.packets,
                one_in,
                losses,
                &|k| self.stage_name(k),
            );
            // The peers' series before the end marker.
            let text = match text.strip_suffix("# EOF\n") {
                Some(head) => format!("{head}{cross_om}# EOF\n"),
                None => text,
            };
            if let Ok(mut slot) = m.lock() {
                *slot = text;
            }
        }
        if self.print {
            let mut shown = self.previous.clone();
            for (k, s) in &self.current {
                shown.entry(*k).or_default().merge(s);
            }
            let text = self.view(&shown, stamp_rate, packet_rate, losses) + &cross_view;
            let mut out = std::io::stdout().lock();
            if self.terminal {
                // Home and clear: the view redraws in place.
                let _ = write!(out, "\x1b[H\x1b[2J{text}");
            } else {
                let _ = writeln!(out, "{text}");
            }
            let _ = out.flush();
        }
    }

    pub(super) fn view(
        &self,
        stats: &Stats,
        stamp_rate: f64,
        packet_rate: f64,
        losses: &[(&str, u64)],
    ) -> String {
        let mut s = String::new();
        let lost: u64 = losses.iter().map(|(_, n)| n).sum();
        let _ = writeln!(
            s,
            "xlap-trace live  {:.0} s{}  stamps {} ({:.0}/s)  packets {} ({:.0}/s)  pending {}  lost {}{}",
            self.started.elapsed().as_secs_f64(),
            self.sample
                .as_ref()
                .map_or(String::new(), |s| format!("  sampled {}", s.1)),
            self.stamps,
            stamp_rate,
            self.packets,
            packet_rate,
            self.pending.len(),
            lost,
            if lost == 0 {
                String::new()
            } else {
                format!(
                    " ({})",
                    losses
                        .iter()
                        .filter(|(_, n)| *n > 0)
                        .map(|(r, n)| format!("{r} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        let us = |h: &Hist, p: f64| {
            h.quantile(p)
                .map_or("-".to_string(), |ns| format!("{:.1}", ns / 1e3))
        };
        for (kind, k) in stats {
            let Some((whole, e2e)) = k.whole() else {
                continue;
            };
            let top = k
                .causes
                .iter()
                .max_by_key(|(s, n)| (**n, std::cmp::Reverse(**s)))
                .map(|(s, n)| (self.stage_name(*s), n));
            let _ = writeln!(
                s,
                "{}: {} packets (last 10-20 s), {whole} p50 {} µs  p99 {} µs  outliers {}{}",
                xlap_records::kinds::kind_label(*kind, None),
                e2e.n,
                us(e2e, 0.5),
                us(e2e, 0.99),
                k.outliers,
                top.map_or(String::new(), |(c, n)| format!(
                    ", top cause {c} ({:.0} %)",
                    100.0 * *n as f64 / k.outliers.max(1) as f64
                ))
            );
            // The most common stages: the sender's, the channel, the
            // receiver's, each side by mean offset into the packet.
            let mut stages: Vec<(String, StageKey, &Hist)> = k
                .stages
                .iter()
                .map(|(key, h)| (self.stage_name(*key), *key, h))
                .collect();
            stages.sort_by(|a, b| b.2.n.cmp(&a.2.n).then(a.0.cmp(&b.0)));
            stages.truncate(SHOWN_STAGES);
            let offset = |key: &StageKey, h: &Hist| {
                k.offsets.get(key).copied().unwrap_or(0.0) / h.n.max(1) as f64
            };
            stages.sort_by(|a, b| {
                (a.1 .0)
                    .cmp(&b.1 .0)
                    .then(offset(&a.1, a.2).total_cmp(&offset(&b.1, b.2)))
            });
            for (name, _, h) in stages {
                let _ = writeln!(
                    s,
                    "  {name:<48} {:>9} p50 {:>9} p99 {:>9} µs",
                    h.n,
                    us(h, 0.5),
                    us(h, 0.99)
                );
            }
        }
        s
    }
}
