-- name: correlation
-- description: How much each stage drives end-to-end latency: Pearson r of the stage against end-to-end, the regression slope of end-to-end on the stage, and the stage's share of the end-to-end variance, cov(stage, e2e) / var(e2e) over every delivered packet, a stage a packet does not have counting 0 there ("latency criticality"; the stages of sides tx, channel and rx partition the path: their shares sum to 1).
-- reads: stage_moments (views.sql, from packets)
-- params: kind = packet kind to keep (default: every kind)
SELECT stage, side, kind, n AS packets,
       round(r, 4) AS pearson_r,
       round(slope_e2e, 4) AS slope_e2e_per_stage,
       round(variance_share, 4) AS variance_share,
       round(mean, 1) AS mean_ns
FROM stage_moments
WHERE stage <> 'e2e' AND (getvariable('kind') IS NULL OR kind = getvariable('kind'))
ORDER BY kind, position;
