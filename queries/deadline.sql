-- name: deadline
-- description: Deadline misses (cf. time-triggered systems): per kind, the delivered packets whose end-to-end latency exceeds the deadline, their rate and the worst, and each miss attributed to the stages that were outliers in it (above their own fence, as outlier_causes): the share of misses each stage explains. A miss can have several causes, or none.
-- reads: packets, fences, stage_columns (views.sql)
-- params: deadline = end-to-end deadline in µs (default: the one given at correlation, `--deadline-ms`, as the packets' deadline_missed flag); kind = packet kind to keep (default: every kind)
-- d is read more than once: inlined, each reader scans the columns it
-- needs; materialised, it held a copy of them (10 M packets: up to 1.9 GB)
WITH d AS NOT MATERIALIZED (
    SELECT *,
           CASE WHEN getvariable('deadline') IS NULL THEN coalesce(deadline_missed, false)
                ELSE e2e_ns > getvariable('deadline') * 1000 END AS missed
    FROM packets
    WHERE e2e_ns IS NOT NULL AND (getvariable('kind') IS NULL OR kind = getvariable('kind'))
), per_kind AS (
    SELECT kind, count(*) AS delivered, count(*) FILTER (WHERE missed) AS misses,
           max(e2e_ns) FILTER (WHERE missed) AS worst_ns
    FROM d GROUP BY kind
), miss_stages AS (
    SELECT s.run_id, s.flow, s.kind, s.seq, c.stage, c.side, c.position, s.ns > f.fence AS above
    FROM (
        UNPIVOT (SELECT run_id, flow, kind, seq, COLUMNS('__.+_ns$|^channel_ns$') FROM d WHERE missed)
        ON COLUMNS(* EXCLUDE (run_id, flow, kind, seq)) INTO NAME col VALUE ns
    ) s
    JOIN stage_columns c USING (col)
    JOIN fences f ON f.stage = c.stage AND f.kind = s.kind
    -- the path's stages only, as late_stages (views.sql)
    WHERE c.side IN ('tx', 'channel', 'rx')
), causes AS (
    SELECT kind, stage, side, position, count(*) AS packets
    FROM miss_stages WHERE above GROUP BY ALL
), uncaused AS (
    SELECT kind, '(no stage above its fence)' AS stage, NULL AS side, 1e9 AS position, count(*) AS packets
    FROM d
    WHERE missed AND NOT EXISTS (SELECT 1 FROM miss_stages s
                                 WHERE s.above AND s.run_id = d.run_id AND s.flow = d.flow AND s.kind = d.kind AND s.seq = d.seq)
    GROUP BY kind
)
SELECT k.kind, getvariable('deadline')::DOUBLE AS deadline_us,
       k.delivered, k.misses, round(k.misses / k.delivered, 6) AS miss_rate,
       round(k.worst_ns / 1e3, 3) AS worst_us,
       c.stage AS cause, c.side, coalesce(c.packets, 0) AS packets,
       round(coalesce(c.packets, 0) / nullif(k.misses, 0), 4) AS share_of_misses
FROM per_kind k
LEFT JOIN (SELECT * FROM causes UNION ALL SELECT * FROM uncaused) c USING (kind)
ORDER BY k.kind, c.packets DESC NULLS LAST, c.position;
