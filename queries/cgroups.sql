-- name: cgroups
-- description: Every stage and total per packet kind, split by the sending and the receiving process's cgroup (packets tx_cgroup/rx_cgroup, named with their container and pod in run.json cgroups): packets, median, p90, p99 and max.
-- reads: stages, delivered (views.sql, from packets)
-- params: kind = packet kind to keep (default: every kind)
SELECT d.tx_cgroup, d.rx_cgroup, s.kind, s.stage, s.side, count(*) AS packets,
       quantile_disc(s.ns, 0.5) AS median_ns, quantile_disc(s.ns, 0.9) AS p90_ns,
       quantile_disc(s.ns, 0.99) AS p99_ns, max(s.ns) AS max_ns
FROM stages s JOIN delivered d USING (flow, kind, seq)
WHERE s.ns IS NOT NULL
GROUP BY d.tx_cgroup, d.rx_cgroup, s.kind, s.stage, s.side, s.position
ORDER BY d.tx_cgroup NULLS FIRST, d.rx_cgroup NULLS FIRST, s.kind, s.position;
