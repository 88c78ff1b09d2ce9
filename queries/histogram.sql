-- name: histogram
-- description: Histogram of one stage (default end-to-end) per packet kind: equal-width bins from its minimum to its 99.9th percentile, the packets beyond in a last open bin.
-- reads: stage_counts, stage_quantiles (views.sql, from packets)
-- params: stage = stage name as in jitter's `stage` column (default e2e); bins = number of bins (default 40); kind = packet kind to keep (default: every kind)
WITH s AS (
    SELECT kind, ns, n, total FROM stage_counts
    WHERE stage = coalesce(getvariable('stage'), 'e2e')
      AND (getvariable('kind') IS NULL OR kind = getvariable('kind'))
), r AS (
    SELECT s.kind, min(s.ns) AS lo, any_value(q.ns) AS hi, coalesce(getvariable('bins'), 40) AS bins
    FROM s JOIN stage_quantiles([0.999]) q ON q.kind = s.kind AND q.stage = coalesce(getvariable('stage'), 'e2e')
    GROUP BY s.kind
), b AS (
    SELECT s.kind, s.n, s.total, r.lo, r.bins, greatest((r.hi - r.lo) / r.bins, 1) AS width,
           least(floor((s.ns - r.lo) / greatest((r.hi - r.lo) / r.bins, 1)), r.bins)::BIGINT AS bin
    FROM s JOIN r USING (kind)
)
SELECT coalesce(getvariable('stage'), 'e2e') AS stage, kind, bin,
       round(any_value(lo) + bin * any_value(width))::BIGINT AS from_ns,
       CASE WHEN bin < any_value(bins) THEN round(any_value(lo) + (bin + 1) * any_value(width))::BIGINT END AS to_ns,
       sum(n)::BIGINT AS packets, round(sum(n) / any_value(total), 6) AS fraction
FROM b GROUP BY kind, bin
ORDER BY kind, bin;
