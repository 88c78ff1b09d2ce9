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
SELECT tx_host, flow, priority,
       printf('%x:%x', priority >> 16, priority & 65535) AS class,
       count(*) AS packets,
       count(queue_ns) AS queued,
       -- the quantiles of one column from one aggregate: one copy of its
       -- values each (a quantile keeps them all, in memory)
       round(quantile_cont(queue_ns, [0.5, 0.99])[1] / 1e3, 3) AS queue_p50_us,
       round(quantile_cont(queue_ns, [0.5, 0.99])[2] / 1e3, 3) AS queue_p99_us,
       round(max(queue_ns) / 1e3, 3) AS queue_max_us,
       round(quantile_cont(sender_total_ns, [0.5, 0.99])[1] / 1e3, 3) AS sender_p50_us,
       round(quantile_cont(sender_total_ns, [0.5, 0.99])[2] / 1e3, 3) AS sender_p99_us
FROM d
GROUP BY tx_host, flow, priority
ORDER BY tx_host, priority, flow;
