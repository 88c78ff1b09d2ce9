-- name: outlier_causes
-- description: End-to-end outliers (above Q3 + 1.5·IQR of their kind, the threshold shown) and their causes: a stage causes an outlier packet when that stage is itself above its own fence. Frequency of each cause among the outliers (X-LAP §3.3.3); a packet can have several causes, or none.
-- reads: late, late_causes, fences (views.sql, from packets)
-- params: kind = packet kind to keep (default: every kind)
WITH per_kind AS (
    SELECT f.kind, f.fence AS e2e_fence_ns, count(l.seq) AS e2e_outliers
    FROM fences f LEFT JOIN late l USING (kind)
    WHERE f.stage = 'e2e' GROUP BY ALL
), causes AS (
    SELECT kind, stage, side, position, fence AS stage_fence_ns, count(*) AS packets
    FROM late_causes GROUP BY ALL
), uncaused AS (
    SELECT kind, '(no stage above its fence)' AS stage, NULL AS side, 1e9 AS position,
           NULL::DOUBLE AS stage_fence_ns, count(*) AS packets
    FROM late l
    WHERE NOT EXISTS (SELECT 1 FROM late_causes s
                      WHERE s.run_id = l.run_id AND s.flow = l.flow AND s.kind = l.kind AND s.seq = l.seq)
    GROUP BY kind
)
SELECT c.kind, c.stage AS cause, c.side, c.packets,
       round(c.packets / p.e2e_outliers, 4) AS share_of_outliers,
       c.stage_fence_ns, p.e2e_fence_ns, p.e2e_outliers
FROM (SELECT * FROM causes UNION ALL SELECT * FROM uncaused) c
JOIN per_kind p USING (kind)
WHERE getvariable('kind') IS NULL OR c.kind = getvariable('kind')
ORDER BY c.kind, c.packets DESC, c.position;
