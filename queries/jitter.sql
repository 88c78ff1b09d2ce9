-- name: jitter
-- description: Box-plot statistics of every stage and total per packet kind: quartiles, 1.5·IQR whiskers and the outliers beyond them, mean, standard deviation and tail percentiles (X-LAP's trace jitter).
-- reads: stage_counts, stage_quantiles, fences, stage_moments (views.sql, from packets)
-- params: kind = packet kind to keep (default: every kind)
WITH q AS (
    SELECT stage, kind,
           max(ns) FILTER (WHERE p = 0.5) AS median_ns, max(ns) FILTER (WHERE p = 0.9) AS p90_ns,
           max(ns) FILTER (WHERE p = 0.99) AS p99_ns, max(ns) FILTER (WHERE p = 0.999) AS p99_9_ns
    FROM stage_quantiles([0.5, 0.9, 0.99, 0.999]) GROUP BY ALL
), box AS (
    -- Whiskers end at the most extreme values inside the fences.
    SELECT c.stage, c.kind, min(c.ns) AS min_ns, max(c.ns) AS max_ns,
           min(c.ns) FILTER (WHERE c.ns >= f.lo_fence) AS whisker_lo_ns,
           max(c.ns) FILTER (WHERE c.ns <= f.fence) AS whisker_hi_ns,
           coalesce(sum(c.n) FILTER (WHERE c.ns < f.lo_fence OR c.ns > f.fence), 0)::BIGINT AS outliers
    FROM stage_counts c JOIN fences f USING (stage, kind) GROUP BY ALL
)
SELECT f.stage, f.side, f.kind, f.packets,
       b.min_ns, f.q1 AS q1_ns, q.median_ns, f.q3 AS q3_ns, b.max_ns,
       f.iqr AS iqr_ns, b.whisker_lo_ns, b.whisker_hi_ns, b.outliers,
       round(m.mean, 1) AS mean_ns, round(m.stddev, 1) AS stddev_ns,
       q.p90_ns, q.p99_ns, q.p99_9_ns
FROM fences f JOIN q USING (stage, kind) JOIN box b USING (stage, kind) JOIN stage_moments m USING (stage, kind)
WHERE getvariable('kind') IS NULL OR f.kind = getvariable('kind')
ORDER BY f.kind, f.position;
