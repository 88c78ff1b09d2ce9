-- name: gaps
-- description: Inter-packet gaps at the wire (cf. AFDX's Bandwidth Allocation Gap): per flow and kind, the gap between consecutive packets leaving the sender's device (dev.start_xmit: sent_ns + sender_total_ns), its min, p1, p50 and max, and the packets that left sooner than `bag` after the previous one: their count, share and the first 20 seqs.
-- reads: packets
-- params: bag = minimum gap in µs (default: none, statistics only); kind = packet kind to keep (default: every kind)
WITH w AS (
    SELECT run_key(run_id) AS run, flow, kind, seq, sent_ns + sender_total_ns AS wire_ns
    FROM packets
    WHERE sender_total_ns IS NOT NULL AND (getvariable('kind') IS NULL OR kind = getvariable('kind'))
    -- sorted once; the predecessor then taken by a window with an empty
    -- OVER (), which DuckDB runs streaming in the sort's order, without a
    -- copy of each partition (10 M packets: 0.4 GB instead of 1.3 GB)
    ORDER BY run, flow, kind, wire_ns, seq
), g AS (
    SELECT flow, kind, seq,
           CASE WHEN lag(run) OVER () IS NOT DISTINCT FROM run
                 AND lag(flow) OVER () IS NOT DISTINCT FROM flow
                 AND lag(kind) OVER () IS NOT DISTINCT FROM kind
                THEN wire_ns - lag(wire_ns) OVER () END AS gap_ns
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
       -- the 20 lowest, kept as they come (not a sorted list of every violation)
       min(seq, 20) FILTER (WHERE gap_ns < getvariable('bag') * 1000) AS violating_seqs
FROM g
GROUP BY flow, kind
ORDER BY flow, kind;
