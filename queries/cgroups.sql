-- name: cgroups
-- description: Every stage and total per packet kind, split by where each end ran: the sending and the receiving process's cgroup (packets tx_cgroup/rx_cgroup, named from run.json cgroups of that end's host), or the container or Kubernetes pod its path names (`analyze --by cgroup|container|pod`): packets, median, p90, p99 and max.
-- reads: stages, delivered (views.sql, from packets), cgroups (run.json)
-- params: kind = packet kind to keep (default: every kind); split = what an end is named by: cgroup (its path, `cgroup ID` when it was gone before the recorder named it; the default), container (`RUNTIME:ID`, `-` for a cgroup of no container) or pod (its UID, `-` for none)
WITH how AS (
    SELECT CASE WHEN coalesce(getvariable('split'), 'cgroup') IN ('cgroup', 'container', 'pod')
                THEN coalesce(getvariable('split'), 'cgroup')
                ELSE error('split = ' || getvariable('split') || ': give cgroup, container or pod') END AS by),
names AS (
    SELECT c.host, c.id, any_value(CASE how.by
        WHEN 'container' THEN coalesce(c.container_runtime || ':' || c.container_id, '-')
        WHEN 'pod' THEN coalesce(c.pod_uid, '-')
        ELSE coalesce(c.path, 'cgroup ' || c.id) END) AS name
    FROM cgroups c, how GROUP BY c.host, c.id),
ends AS (
    SELECT d.flow, d.kind, d.seq,
           CASE WHEN d.tx_cgroup IS NOT NULL
                THEN coalesce(t.name, CASE how.by WHEN 'cgroup' THEN 'cgroup ' || d.tx_cgroup ELSE '-' END) END AS tx,
           CASE WHEN d.rx_cgroup IS NOT NULL
                THEN coalesce(r.name, CASE how.by WHEN 'cgroup' THEN 'cgroup ' || d.rx_cgroup ELSE '-' END) END AS rx
    FROM delivered d CROSS JOIN how
    LEFT JOIN names t ON t.host = d.tx_host AND t.id = d.tx_cgroup
    LEFT JOIN names r ON r.host = d.rx_host AND r.id = d.rx_cgroup)
SELECT e.tx, e.rx, s.kind, s.stage, s.side, count(*) AS packets,
       quantile_disc(s.ns, 0.5) AS median_ns, quantile_disc(s.ns, 0.9) AS p90_ns,
       quantile_disc(s.ns, 0.99) AS p99_ns, max(s.ns) AS max_ns
FROM stages s JOIN ends e USING (flow, kind, seq)
WHERE s.ns IS NOT NULL
GROUP BY e.tx, e.rx, s.kind, s.stage, s.side, s.position
ORDER BY e.tx NULLS FIRST, e.rx NULLS FIRST, s.kind, s.position;
