-- name: loss
-- description: Losses of the protocol per packet kind (sent, lost, untraced: sent on a flow no traced socket received, so not known to be lost, partial: in flight when the recording of some of its points began or ended, so neither lost nor whole, recovered without crossing the wire, duplicates, reordering, retransmissions, gaps of consecutive lost packets) and of the tracer itself (stamps it could not record, per run, point and reason).
-- reads: packets, tracer_points
-- params: kind = packet kind to keep (default: every kind)
-- p is read more than once: inlined, each reader scans the columns it
-- needs; materialised, it held a copy of them (10 M packets: up to 1.9 GB)
WITH p AS NOT MATERIALIZED (
    SELECT run_id, flow, kind, seq, lost, untraced, partial, recovered, duplicate, reordered, retransmitted
    FROM packets WHERE getvariable('kind') IS NULL OR kind = getvariable('kind')
), runs_of_loss AS (
    -- islands of consecutive lost seqs (gaps-and-islands), in each run
    SELECT flow, kind, count(*) AS len
    FROM (SELECT run_id, flow, kind, seq, seq - row_number() OVER (PARTITION BY run_id, flow, kind ORDER BY seq) AS island
          FROM p WHERE lost)
    GROUP BY run_id, flow, kind, island
), per_kind AS (
    SELECT kind,
           count(*) AS sent,
           count(*) FILTER (WHERE lost) AS lost,
           count(*) FILTER (WHERE untraced) AS untraced,
           count(*) FILTER (WHERE partial) AS partial,
           count(*) FILTER (WHERE recovered) AS recovered,
           count(*) FILTER (WHERE duplicate) AS duplicated,
           count(*) FILTER (WHERE reordered) AS reordered,
           count(*) FILTER (WHERE retransmitted) AS retransmitted
    FROM p GROUP BY kind
), gaps AS (
    SELECT kind, count(*) AS gaps, max(len) AS longest_gap FROM runs_of_loss GROUP BY kind
)
SELECT 'protocol' AS scope, CASE WHEN kind = 4294967296 THEN 'all' ELSE kind::VARCHAR END AS what, measure, value,
       round(100.0 * value / sent, 3) AS percent
FROM (
    UNPIVOT (SELECT k.*, coalesce(g.gaps, 0) AS gaps, coalesce(g.longest_gap, 0) AS longest_gap
             FROM per_kind k LEFT JOIN gaps g USING (kind))
    ON lost, untraced, partial, recovered, duplicated, reordered, retransmitted, gaps, longest_gap INTO NAME measure VALUE value
)
UNION ALL
-- (in a dataset of runs, each run's tracer: its run id first)
SELECT 'tracer', coalesce(run_key(run_id) || ' ', '') || host || ' ' || point, replace(reason, 'lost_', ''), value,
       round(100.0 * value / nullif(stamps + value, 0), 3)
FROM (
    -- every lost_<reason> column the capture counts
    UNPIVOT (SELECT run_id, host, point, stamps, COLUMNS('^lost_') FROM tracer_points)
    ON COLUMNS('^lost_') INTO NAME reason VALUE value
)
WHERE value > 0
ORDER BY scope DESC, what, measure;
