-- name: trace
-- description: The per-packet waterfall: every stamp point of a packet on both hosts, as offsets from its first stamp and from the point before, in time order; for one seq, or the slowest packets.
-- reads: packets, point_columns
-- params: seq = one packet's sequence number (default: the slowest packets); top = how many slowest packets (default 5); kind = packet kind to keep (default: every kind)
WITH chosen AS (
    -- top-N by end-to-end latency reads four columns, not the whole table
    -- a packet is its (run_id, flow, kind, seq): a dataset repeats the rest
    SELECT *, row_number() OVER (ORDER BY e2e_ns DESC NULLS LAST, flow, kind, seq, run_id) AS rank
    FROM (
        SELECT run_id, flow, kind, seq, e2e_ns FROM packets
        WHERE (getvariable('kind') IS NULL OR kind = getvariable('kind'))
          AND (getvariable('seq') IS NULL OR seq = getvariable('seq'))
        ORDER BY e2e_ns DESC NULLS LAST, flow, kind, seq, run_id
        LIMIT CASE WHEN getvariable('seq') IS NULL THEN coalesce(getvariable('top'), 5) ELSE 1000000 END
    )
), stamps_long AS (
    UNPIVOT (SELECT run_id, flow, kind, seq, tx_host, rx_host, COLUMNS('_ns$') FROM packets
             WHERE seq IN (SELECT seq FROM chosen) AND (run_id, flow, kind, seq) IN (SELECT (run_id, flow, kind, seq) FROM chosen))
    ON COLUMNS('_ns$') INTO NAME col VALUE t
)
SELECT c.rank, s.flow, s.kind, s.seq, pc.point, pc.side,
       CASE pc.side WHEN 'tx' THEN s.tx_host WHEN 'rx' THEN s.rx_host END AS host,
       s.t - min(s.t) OVER w AS at_ns,
       s.t - lag(s.t) OVER (w ORDER BY s.t, pc.position) AS since_previous_ns,
       c.e2e_ns
FROM stamps_long s
JOIN point_columns pc USING (col)
JOIN chosen c USING (run_id, flow, kind, seq)
WINDOW w AS (PARTITION BY s.run_id, s.flow, s.kind, s.seq)
ORDER BY c.rank, at_ns, pc.position;
