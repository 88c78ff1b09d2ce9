-- name: trend
-- description: Trends: least-squares regression of every stage over the packet sequence and over send time (growing queues, drift), with R², and the mean of the first and last tenth of the run.
-- reads: stage_moments (views.sql, from packets)
-- params: kind = packet kind to keep (default: every kind)
SELECT stage, side, kind, n AS packets,
       round(slope_seq * 1000, 3) AS ns_per_1000_packets,
       round(slope_time * 1e9, 3) AS ns_per_second,
       round(r2_time, 4) AS r2_time,
       round(first_mean, 1) AS first_tenth_mean_ns,
       round(last_mean, 1) AS last_tenth_mean_ns
FROM stage_moments
WHERE getvariable('kind') IS NULL OR kind = getvariable('kind')
ORDER BY kind, position;
