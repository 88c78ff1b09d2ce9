-- name: qdisc_classes
-- description: Queueing per traffic class (htb/prio classes picked by SO_PRIORITY, cf. AFDX/TSN traffic classes): per sending host, flow and skb priority on the wire device (shown as the class major:minor), packets, the time from qdisc enqueue to dequeue (p50, p99, max; only packets the qdisc held) and the sender's whole time (p50, p99). A class whose queue is slow shows here before it shows end to end.
-- reads: packets (priority, the qdisc_enqueue__qdisc_dequeue stage)
-- params: kind = packet kind to keep (default: every kind)
-- The queue stage read straight from each packet; a run without qdisc
-- stamps has no such column, so an empty relation that has it is unioned
-- by name (a null column then, no row added).
WITH d AS (
    SELECT tx_host, flow, priority, sender_total_ns, qdisc_enqueue__qdisc_dequeue_ns AS queue_ns
    FROM (FROM delivered UNION ALL BY NAME SELECT NULL::BIGINT AS qdisc_enqueue__qdisc_dequeue_ns WHERE false)
    WHERE priority IS NOT NULL
)
-- Exact quantiles from each class's value counts (as views.sql's
-- stage_quantiles: linear between the order statistics around (n - 1)·p):
-- a quantile aggregate keeps every value of a class in memory, which a run
-- of 100 M packets does not fit in the engine's 4 GB.
, counts AS (
    SELECT tx_host, flow, priority, count(*) AS packets, count(queue_ns) AS queued,
           max(queue_ns) AS queue_max, histogram(queue_ns) AS queue, histogram(sender_total_ns) AS sender
    FROM d GROUP BY ALL
), v AS (
    SELECT tx_host, flow, priority, what, unnest(map_keys(m)) AS ns, unnest(map_values(m))::BIGINT AS n
    FROM (UNPIVOT (SELECT tx_host, flow, priority, queue, sender FROM counts) ON queue, sender INTO NAME what VALUE m)
), ranked AS (
    SELECT *, sum(n) OVER (PARTITION BY tx_host, flow, priority, what ORDER BY ns ROWS UNBOUNDED PRECEDING) - n AS below,
           sum(n) OVER (PARTITION BY tx_host, flow, priority, what) AS total
    FROM v
), q AS (
    SELECT tx_host, flow, priority, what, p, any_value(h) AS h, any_value(r) AS r,
           max(ns) FILTER (WHERE below <= r) AS v1,
           max(ns) FILTER (WHERE below <= least(r + 1, total - 1)) AS v2
    FROM (SELECT *, (total - 1) * p AS h, floor((total - 1) * p)::BIGINT AS r
          FROM ranked CROSS JOIN (SELECT unnest([0.5, 0.99]) AS p))
    GROUP BY ALL
), quantiles AS (
    SELECT tx_host, flow, priority,
           max(v1 + (h - r) * (v2 - v1)) FILTER (WHERE what = 'queue' AND p = 0.5) AS queue_p50,
           max(v1 + (h - r) * (v2 - v1)) FILTER (WHERE what = 'queue' AND p = 0.99) AS queue_p99,
           max(v1 + (h - r) * (v2 - v1)) FILTER (WHERE what = 'sender' AND p = 0.5) AS sender_p50,
           max(v1 + (h - r) * (v2 - v1)) FILTER (WHERE what = 'sender' AND p = 0.99) AS sender_p99
    FROM q GROUP BY ALL
)
SELECT c.tx_host, c.flow, c.priority,
       printf('%x:%x', c.priority >> 16, c.priority & 65535) AS class,
       c.packets,
       c.queued,
       round(q.queue_p50 / 1e3, 3) AS queue_p50_us,
       round(q.queue_p99 / 1e3, 3) AS queue_p99_us,
       round(c.queue_max / 1e3, 3) AS queue_max_us,
       round(q.sender_p50 / 1e3, 3) AS sender_p50_us,
       round(q.sender_p99 / 1e3, 3) AS sender_p99_us
FROM counts c LEFT JOIN quantiles q
    ON q.tx_host IS NOT DISTINCT FROM c.tx_host AND q.flow = c.flow AND q.priority = c.priority
ORDER BY c.tx_host, c.priority, c.flow;
