-- name: summary
-- description: One screen for one packet kind (default: the most common): packets, rate and losses, then per stage (path order) and total the packet count, p50/p99/max and how often the stage causes an end-to-end outlier.
-- reads: packets, kinds, stage_quantiles, stage_counts, late, late_causes (views.sql)
-- params: kind = packet kind to show (default: the most common kind)
WITH k AS (
    SELECT coalesce(getvariable('kind'), (SELECT mode(kind) FROM packets)) AS kind
), p AS (
    SELECT * FROM packets WHERE kind = (SELECT kind FROM k)
), head AS (
    SELECT count(*) AS packets, count(*) FILTER (WHERE lost) AS lost,
           count(*) FILTER (WHERE untraced) AS untraced,
           count(*) FILTER (WHERE partial) AS partial,
           (max(sent_ns) - min(sent_ns)) / 1e9 AS seconds
    FROM p
), l AS (
    SELECT * FROM late WHERE kind = (SELECT kind FROM k)
), causes AS (
    SELECT stage, count(*) AS n FROM late_causes
    WHERE (kind = (SELECT kind FROM k)) GROUP BY stage
), per_stage AS (
    SELECT q.stage, q.side, q.position, any_value(q.packets) AS packets,
           max(q.ns) FILTER (WHERE q.p = 0.5) AS p50, max(q.ns) FILTER (WHERE q.p = 0.99) AS p99
    FROM stage_quantiles([0.5, 0.99]) q
    WHERE q.kind = (SELECT kind FROM k)
    GROUP BY ALL
), worst AS (
    SELECT stage, max(ns) AS max_ns FROM stage_counts
    WHERE kind = (SELECT kind FROM k) GROUP BY stage
)
SELECT * EXCLUDE (position) FROM (
    SELECT 'run' AS section,
           kind_label((SELECT kind FROM k)) AS name,
           packets::BIGINT AS packets,
           NULL::DOUBLE AS p50_us, NULL::DOUBLE AS p99_us, NULL::DOUBLE AS max_us,
           format('lost {} ({:.2f} %), {}{}{:.0f} packets/s over {:.1f} s, {} end-to-end outliers',
                  lost, 100.0 * lost / nullif(packets - untraced - partial, 0),
                  CASE WHEN untraced > 0 THEN format('{} untraced (no traced socket received their flow), ', untraced) ELSE '' END,
                  CASE WHEN partial > 0 THEN format('{} partial (in flight at the run''s start or end), ', partial) ELSE '' END,
                  packets / nullif(seconds, 0), seconds, (SELECT count(*) FROM l)) AS note,
           -1 AS position
    FROM head
    UNION ALL
    SELECT CASE WHEN side = 'total' THEN 'total' ELSE 'stage' END, stage, packets::BIGINT,
           round(p50 / 1e3, 1), round(p99 / 1e3, 1), round(max_ns / 1e3, 1),
           CASE WHEN c.n > 0 THEN format('cause of {:.1f} % of the outliers', 100.0 * c.n / (SELECT count(*) FROM l)) END,
           position
    FROM per_stage JOIN worst USING (stage) LEFT JOIN causes c USING (stage)
)
ORDER BY position;
