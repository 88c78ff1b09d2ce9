-- name: qdisc_classes
-- description: Queueing per traffic class (htb/prio classes picked by SO_PRIORITY, cf. AFDX/TSN traffic classes): per sending host, flow and skb priority on the wire device (shown as the class major:minor), packets, the time from qdisc enqueue to dequeue (p50, p99, max; only packets the qdisc held) and the sender's whole time (p50, p99). A class whose queue is slow shows here before it shows end to end.
-- reads: packets (priority, the qdisc_enqueue__qdisc_dequeue stage)
-- params: kind = packet kind to keep (default: every kind)
-- The queue stage of each packet, long format: only this column is
-- unpivoted (sender_total_ns, always there, keeps COLUMNS() from matching
-- nothing in a run without qdisc stamps).
WITH q AS (
    SELECT flow, kind, seq, ns
    FROM (UNPIVOT (SELECT flow, kind, seq, COLUMNS('^(qdisc_enqueue__qdisc_dequeue|sender_total)_ns$') FROM delivered)
          ON COLUMNS(* EXCLUDE (flow, kind, seq)) INTO NAME col VALUE ns)
    WHERE col = 'qdisc_enqueue__qdisc_dequeue_ns'
)
SELECT d.tx_host, d.flow, d.priority,
       printf('%x:%x', d.priority >> 16, d.priority & 65535) AS class,
       count(*) AS packets,
       count(q.ns) AS queued,
       round(quantile_cont(q.ns, 0.5) / 1e3, 3) AS queue_p50_us,
       round(quantile_cont(q.ns, 0.99) / 1e3, 3) AS queue_p99_us,
       round(max(q.ns) / 1e3, 3) AS queue_max_us,
       round(quantile_cont(d.sender_total_ns, 0.5) / 1e3, 3) AS sender_p50_us,
       round(quantile_cont(d.sender_total_ns, 0.99) / 1e3, 3) AS sender_p99_us
FROM delivered d
LEFT JOIN q USING (flow, kind, seq)
WHERE d.priority IS NOT NULL
GROUP BY d.tx_host, d.flow, d.priority
ORDER BY d.tx_host, d.priority, d.flow;
