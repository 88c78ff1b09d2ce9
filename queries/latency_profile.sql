-- name: latency_profile
-- description: Latency profile (inverse cumulative distribution): for each stage and total, the latency exceeded by a given fraction of the packets, from the minimum (exceeded by all: 1) through the median down to the single worst packet; plot both axes on log scales to magnify the worst cases and show the best (Lisový et al.).
-- reads: stage_quantiles, stage_counts (views.sql, from packets)
-- params: kind = packet kind to keep (default: every kind)
SELECT stage, side, kind, exceedance, ns, packets
FROM (
    SELECT stage, side, position, kind, packets, round(1 - p, 6) AS exceedance, ns
    FROM stage_quantiles([0.0, 0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.997, 0.998, 0.999,
                          0.9995, 0.9998, 0.9999, 0.99995, 0.99998, 0.99999, 0.999995, 0.999998, 0.999999])
    -- a level is shown while at least one packet lies beyond it
    WHERE (1 - p) * packets >= 1
    UNION ALL
    SELECT stage, side, position, kind, any_value(total), 1.0 / any_value(total), max(ns)
    FROM stage_counts GROUP BY stage, side, position, kind
)
WHERE getvariable('kind') IS NULL OR kind = getvariable('kind')
ORDER BY kind, position, exceedance DESC;
