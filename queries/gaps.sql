-- name: gaps
-- description: Inter-packet gaps at the wire (cf. AFDX's Bandwidth Allocation Gap): per flow and kind, the gap between consecutive packets leaving the sender's device (dev.start_xmit: sent_ns + sender_total_ns), its min, p1, p50 and max, and the packets that left sooner than `bag` after the previous one: their count, share and the first 20 seqs.
-- reads: packets, wire_gaps() (views.sql)
-- params: bag = minimum gap in µs (default: none, statistics only); kind = packet kind to keep (default: every kind)
-- the gaps, each packet's to the one before it on the wire (views.sql)
WITH g AS (FROM wire_gaps())
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
