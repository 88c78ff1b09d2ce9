-- name: gaps
-- description: Inter-packet gaps at the wire (cf. AFDX's Bandwidth Allocation Gap): per flow and kind, the gap between consecutive packets leaving the sender's device (dev.start_xmit: sent_ns + sender_total_ns), its min, p1, p50 and max, and the packets that left sooner than `bag` after the previous one: their count, share and the first 20 seqs.
-- reads: packets
-- params: bag = minimum gap in µs (default: none, statistics only); kind = packet kind to keep (default: every kind)
WITH w AS (
    SELECT run_key(run_id) AS run, flow, kind, seq, sent_ns + sender_total_ns AS wire_ns
    FROM packets
    WHERE sender_total_ns IS NOT NULL AND (getvariable('kind') IS NULL OR kind = getvariable('kind'))
), g AS (
    SELECT flow, kind, seq, wire_ns - lag(wire_ns) OVER (PARTITION BY run, flow, kind ORDER BY wire_ns, seq) AS gap_ns
    FROM w
)
SELECT flow, kind, count(gap_ns) AS gaps,
       round(min(gap_ns) / 1e3, 3) AS min_us,
       -- both quantiles from one aggregate: one copy of the gaps, not two
       round(quantile_cont(gap_ns, [0.01, 0.5])[1] / 1e3, 3) AS p1_us,
       round(quantile_cont(gap_ns, [0.01, 0.5])[2] / 1e3, 3) AS p50_us,
       round(max(gap_ns) / 1e3, 3) AS max_us,
       getvariable('bag')::DOUBLE AS bag_us,
       count(*) FILTER (WHERE gap_ns < getvariable('bag') * 1000) AS violations,
       round(count(*) FILTER (WHERE gap_ns < getvariable('bag') * 1000) / nullif(count(gap_ns), 0), 6) AS violation_share,
       list(seq ORDER BY seq) FILTER (WHERE gap_ns < getvariable('bag') * 1000)[1:20] AS violating_seqs
FROM g
GROUP BY flow, kind
ORDER BY flow, kind;
