-- name: activation
-- description: Activation jitter of a periodic sender (cf. time-triggered dispatch): each packet's send time (its first sender point) against the ideal schedule anchored at the flow's first packet, t0 + (seq − seq0) × period. Per flow and kind: the period used, the deviation's p50/p99/max (absolute), the worst packet and its signed deviation, the packets that started late (more than `late` after their ideal time: their count and the first 20 seqs), the drift (the deviation's slope over the run in µs per second: the sender keeps another period than the one given), and the correlation of the deviation with end-to-end latency (does a late start make a late packet?).
-- reads: packets, send_schedule (views.sql)
-- params: period = the sender's period per sequence number in µs (default: the median send-time gap per sequence step, or the mean period when bursts make that 0); late = lateness in µs that makes a start late (default: half the period); kind = packet kind to keep (default: every kind)
-- p (sent_rows(), views.sql) is read by dev only; inlined, it scans just
-- the columns dev needs. The schedule's default period and start come
-- from send_schedule (views.sql), stored beside the packets.
WITH p AS NOT MATERIALIZED (
    FROM sent_rows()
), period AS (
    SELECT run, flow, kind,
           coalesce(getvariable('period') * 1000,
                    CASE WHEN median_gap_ns > 0 THEN median_gap_ns ELSE mean_period_ns END) AS period_ns,
           seq0, t0
    FROM send_schedule
), dev AS (
    SELECT p.*, p.sent_ns - (r.t0 + (p.seq - r.seq0) * r.period_ns) AS dev_ns,
           (p.sent_ns - r.t0) / 1e9 AS t_s, r.period_ns
    FROM p JOIN period r ON r.run IS NOT DISTINCT FROM p.run AND r.flow = p.flow AND r.kind = p.kind
)
-- both quantiles from one aggregate: one copy of the deviations, not two
SELECT flow, kind, packets, period_us, p50_us, p99_us, max_us,
       worst.seq AS worst_seq, round(worst.dev / 1e3, 3) AS worst_us,
       late_packets, late_seqs, drift_us_per_s, corr_e2e
FROM (
    SELECT flow, kind, count(*) AS packets, round(any_value(period_ns) / 1e3, 3) AS period_us,
           round(quantile_cont(abs(dev_ns), [0.5, 0.99])[1] / 1e3, 3) AS p50_us,
           round(quantile_cont(abs(dev_ns), [0.5, 0.99])[2] / 1e3, 3) AS p99_us,
           round(max(abs(dev_ns)) / 1e3, 3) AS max_us,
           -- the worst packet's seq and deviation from one arg_max (each
           -- builds its key per packet: 10 M packets 0.25 s); ties (a
           -- sender exactly on schedule) go to the earliest packet,
           -- whatever order the engine's threads met them in
           arg_max({'seq': seq, 'dev': dev_ns}, [abs(dev_ns)::DOUBLE, -(seq::DOUBLE)]) AS worst,
           count(*) FILTER (WHERE dev_ns > coalesce(getvariable('late') * 1000, period_ns / 2)) AS late_packets,
           -- the 20 lowest, kept as they come (not a sorted list of every late packet)
           min(seq, 20) FILTER (WHERE dev_ns > coalesce(getvariable('late') * 1000, period_ns / 2)) AS late_seqs,
           round(regr_slope(dev_ns, t_s) / 1e3, 3) AS drift_us_per_s,
           round(corr(dev_ns, e2e_ns), 3) AS corr_e2e
    FROM dev
    GROUP BY flow, kind
)
ORDER BY flow, kind;
