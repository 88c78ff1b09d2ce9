-- name: gaps
-- description: Inter-packet gaps at the wire (cf. AFDX's Bandwidth Allocation Gap): per flow and kind, the gap between consecutive packets leaving the sender's device (dev.start_xmit: sent_ns + sender_total_ns), its min, p1, p50 and max, and the packets that left sooner than `bag` after the previous one: their count, share and the first 20 seqs.
-- reads: packets, wire_gaps() (views.sql)
-- params: bag = minimum gap in µs (default: none, statistics only); kind = packet kind to keep (default: every kind)
-- Each gap value with its count per flow and kind (the gaps, each packet's
-- to the one before it on the wire: views.sql), and how many gaps lie below
-- it: the quantiles come from these few rows (a paced sender's gaps take
-- few values: 86 k in 10 M synthetic packets) rather than from a copy of
-- every gap, which the quantile aggregate keeps in memory and which did not
-- fit a 100 M-packet dataset in the engine's default 4 GB. A gap value's
-- 20 lowest violating seqs ride along; the 20 lowest of those are the
-- flow's.
WITH v AS (
    SELECT flow, kind, gap_ns, count(*) AS n,
           min(seq, 20) FILTER (WHERE gap_ns < getvariable('bag') * 1000) AS seqs
    FROM wire_gaps() GROUP BY ALL
), c AS (
    SELECT *, (sum(n) FILTER (WHERE gap_ns IS NOT NULL) OVER w - n)::BIGINT AS below,
           (sum(n) FILTER (WHERE gap_ns IS NOT NULL) OVER (PARTITION BY flow, kind))::BIGINT AS total
    FROM v WINDOW w AS (PARTITION BY flow, kind ORDER BY gap_ns ROWS UNBOUNDED PRECEDING)
), r AS (
    -- quantile_cont's order statistics around (total - 1)·p, and its
    -- interpolation, lo·(1 - d) + hi·d, to the last bit
    SELECT *, (total - 1)::DOUBLE * 0.01::DOUBLE AS h1, floor(h1)::BIGINT AS r1,
           (total - 1)::DOUBLE * 0.5::DOUBLE AS h50, floor(h50)::BIGINT AS r50
    FROM c
), q AS (
    SELECT flow, kind, sum(n) FILTER (WHERE gap_ns IS NOT NULL)::BIGINT AS gaps,
           min(gap_ns) AS min_ns, max(gap_ns) AS max_ns,
           any_value(h1 - r1) AS d1, max(gap_ns) FILTER (WHERE below <= r1) AS lo1,
           max(gap_ns) FILTER (WHERE below <= least(r1 + 1, total - 1)) AS hi1,
           any_value(h50 - r50) AS d50, max(gap_ns) FILTER (WHERE below <= r50) AS lo50,
           max(gap_ns) FILTER (WHERE below <= least(r50 + 1, total - 1)) AS hi50,
           sum(n) FILTER (WHERE gap_ns < getvariable('bag') * 1000)::BIGINT AS violations,
           list_sort(flatten(list(seqs) FILTER (WHERE seqs IS NOT NULL))) AS seqs
    FROM r GROUP BY flow, kind
)
SELECT flow, kind, coalesce(gaps, 0) AS gaps,
       round(min_ns / 1e3, 3) AS min_us,
       round((lo1 * (1 - d1) + hi1 * d1) / 1e3, 3) AS p1_us,
       round((lo50 * (1 - d50) + hi50 * d50) / 1e3, 3) AS p50_us,
       round(max_ns / 1e3, 3) AS max_us,
       getvariable('bag')::DOUBLE AS bag_us,
       coalesce(violations, 0) AS violations,
       round(coalesce(violations, 0) / nullif(gaps, 0), 6) AS violation_share,
       -- the 20 lowest, kept as they come (not a sorted list of every violation)
       CASE WHEN len(seqs) > 0 THEN seqs[1:20] END AS violating_seqs
FROM q
ORDER BY flow, kind;
