-- Shared work of the bundled queries, done once per run: the exact
-- distribution of every stage as value counts, its moments against
-- end-to-end latency, sequence and time, Tukey fences, and the end-to-end
-- outliers. One scan of the packets table each; every query then reads
-- these small tables, so the whole query set costs about two scans.
--
-- Before this file runs, xlap-trace provides `packets` and the table
-- `stage_columns` (col, stage, side, position: every stage column and the
-- totals in path order; side tx, channel, rx or total, or tx_after_wire /
-- rx_before_wire for a stage off the path that the totals partition), `point_columns`
-- (col, point, side, position), `runs`, `tracer_points` and `kinds` (kind,
-- name: the protocol's names of its kinds) and `cgroups` (run_id, host, id,
-- path, container_runtime, container_id, pod_uid: where the stamps ran) from
-- run.json.
-- In the DuckDB CLI, without xlap-trace:
--   CREATE VIEW packets AS FROM 'RUN/packets.parquet';
--   CREATE TABLE stage_columns AS SELECT column_name AS col, regexp_replace(column_name, '_ns$', '') AS stage,
--     'stage' AS side, column_index AS position FROM duckdb_columns()
--     WHERE table_name = 'packets' AND regexp_matches(column_name, '__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$');
--   CREATE TABLE kinds (kind UBIGINT, name VARCHAR);
--   .read queries/views.sql
--   SET VARIABLE kind = 1;   -- parameters: see each query's header
--   .read queries/jitter.sql

-- How output names a kind: `kind 1 (data)` with the protocol's name, or
-- `kind all` for the packets of a layout without a kind field (kind
-- 4294967296, above every 32-bit kind: xlap_analyze::KIND_ALL).
CREATE OR REPLACE TEMP MACRO kind_label(k) AS CASE WHEN k = 4294967296 THEN 'kind all' ELSE 'kind ' || k || coalesce(' (' || (SELECT any_value(name) FROM kinds WHERE kind = k) || ')', '') END;

-- Delivered packets of the selected kind (variable `kind`, default all).
CREATE OR REPLACE TEMP VIEW delivered AS
SELECT * FROM packets
WHERE e2e_ns IS NOT NULL AND (getvariable('kind') IS NULL OR kind = getvariable('kind'));

-- One row per (delivered packet, stage): the long format, for your own
-- queries (the bundled ones avoid it: it multiplies the rows).
CREATE OR REPLACE TEMP VIEW stages AS
SELECT s.flow, s.kind, s.seq, s.sent_ns, s.e2e, c.stage, c.side, c.position, s.ns
FROM (
    UNPIVOT (SELECT flow, kind, seq, sent_ns, e2e_ns AS e2e,
                    COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$')
             FROM delivered)
    ON COLUMNS(* EXCLUDE (flow, kind, seq, sent_ns, e2e)) INTO NAME col VALUE ns
) s
JOIN stage_columns c USING (col);

-- Every value of every stage column per kind with its count: one GROUP BY
-- per column of stage_columns, written here as one UNION ALL (SQL has no
-- "group by each of these columns"). One histogram() per column in a
-- single scan took 3.3 s and 230 MiB on 10 M packets; the GROUP BYs take
-- 2.6 s and 90 MiB, each scan reading three columns. A dataset of runs
-- whose stored stage_counts all match their packets makes this from them
-- instead (counts add up across runs: crate::stored::merged).
SET VARIABLE stage_value_counts_sql = (
    SELECT coalesce(
        string_agg(format('SELECT {} AS col, kind, {} AS ns, count(*) AS n FROM packets WHERE e2e_ns IS NOT NULL AND {} IS NOT NULL GROUP BY ALL',
                          '''' || replace(col, '''', '''''') || '''', '"' || replace(col, '"', '""') || '"', '"' || replace(col, '"', '""') || '"'),
                   ' UNION ALL ' ORDER BY position),
        'SELECT NULL::VARCHAR AS col, kind, NULL::BIGINT AS ns, 0::BIGINT AS n FROM packets WHERE false')
    FROM stage_columns
);
CREATE OR REPLACE TEMP VIEW stage_value_counts AS
FROM query(getvariable('stage_value_counts_sql'));

-- Every value of every stage per kind with its count, and how many packets
-- lie below it: exact quantiles of any level without sorting the packets.
CREATE OR REPLACE TEMP TABLE stage_counts AS
SELECT c.stage, c.side, c.position, v.kind, v.ns, v.n,
       (sum(v.n) OVER (PARTITION BY c.stage, v.kind ORDER BY v.ns ROWS UNBOUNDED PRECEDING) - v.n)::BIGINT AS below,
       (sum(v.n) OVER (PARTITION BY c.stage, v.kind))::BIGINT AS total
FROM stage_value_counts v JOIN stage_columns c USING (col);

-- Quantiles at `levels` of every stage per kind, as DuckDB's quantile_cont
-- computes them: linear between the order statistics around (n - 1)·p.
CREATE OR REPLACE TEMP MACRO stage_quantiles(levels) AS TABLE
WITH t AS (
    SELECT stage, side, position, kind, any_value(total) AS total FROM stage_counts GROUP BY ALL
), k AS (
    SELECT t.*, l.p, (t.total - 1) * l.p AS h, floor((t.total - 1) * l.p)::BIGINT AS r
    FROM t CROSS JOIN (SELECT unnest(levels::DOUBLE[]) AS p) l
), lo AS (
    SELECT k.*, c.ns AS v1 FROM k ASOF JOIN stage_counts c
    ON k.stage = c.stage AND k.kind = c.kind AND k.r >= c.below
), hi AS (
    SELECT lo.*, c.ns AS v2 FROM lo ASOF JOIN stage_counts c
    ON lo.stage = c.stage AND lo.kind = c.kind AND least(lo.r + 1, lo.total - 1) >= c.below
)
SELECT stage, side, position, kind, total AS packets, p, v1 + (h - r) * (v2 - v1) AS ns FROM hi;

-- Tukey fences of every stage per kind: X-LAP's outlier definition.
CREATE OR REPLACE TEMP TABLE fences AS
SELECT *, q3 - q1 AS iqr, q1 - 1.5 * (q3 - q1) AS lo_fence, q3 + 1.5 * (q3 - q1) AS fence
FROM (
    SELECT stage, side, position, kind, packets,
           max(ns) FILTER (WHERE p = 0.25) AS q1, max(ns) FILTER (WHERE p = 0.75) AS q3
    FROM stage_quantiles([0.25, 0.75]) GROUP BY ALL
);

-- Moments of every stage per kind: mean, spread, its relation to
-- end-to-end latency (r, slope, covariance share) and to sequence and
-- send time (trend), the mean of the first and last tenth of the run.
-- Plain sums in one scan (the regression aggregates cost three times as
-- much), grouped by kind, part of the run (first tenth, middle, last
-- tenth) and which stages the packet lacks: within a group a stage is
-- present in every row or in none, so the sums over y, s and t that pair
-- with a stage (only the rows where it has a value) are the group's own,
-- summed over the groups where the stage is present, not a masked sum per
-- stage (half the aggregates). The variance share is the exception: over
-- every delivered packet, a stage the packet does not have counting 0 (its
-- points were absent, the time is in the stage that spans them), so that
-- the shares of stages partitioning the path sum to 1.
CREATE OR REPLACE TEMP TABLE stage_moments AS
WITH b AS (
    SELECT kind, min(seq) AS s0, min(sent_ns) AS t0, max(sent_ns) - min(sent_ns) AS span
    FROM packets WHERE e2e_ns IS NOT NULL GROUP BY kind
), c AS (
    SELECT p.kind, (p.seq - b.s0)::DOUBLE AS s, (p.sent_ns - b.t0)::DOUBLE AS t, p.e2e_ns::DOUBLE AS y,
           CASE WHEN (p.sent_ns - b.t0) * 10 <= b.span THEN 1 WHEN (p.sent_ns - b.t0) * 10 >= 9 * b.span THEN 9 ELSE 5 END AS part,
           COLUMNS('^(.*__.+|sender_total|channel|receiver_total|e2e)_ns$') IS NULL AS '\1_absent',
           COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$')::DOUBLE
    FROM packets p JOIN b USING (kind) WHERE p.e2e_ns IS NOT NULL
), w AS (
    SELECT kind, part, COLUMNS('_absent$'),
           count(*) AS g_n, sum(y) AS g_sy, sum(y * y) AS g_syy, sum(s) AS g_ss, sum(s * s) AS g_sss, sum(t) AS g_st, sum(t * t) AS g_stt,
           {
        'n': count(COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$')),
        'sx': sum(COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$')), 'sxx': sum(COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$') * COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$')),
        'sxy': sum(COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$') * y),
        'sxs': sum(COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$') * s),
        'sxt': sum(COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$') * t)
    }
    FROM c GROUP BY ALL
), u AS (
    SELECT col, kind,
           sum(m.n) AS n, sum(m.sx) AS sx, sum(m.sxx) AS sxx, sum(m.sxy) AS sxy, sum(m.sxs) AS sxs, sum(m.sxt) AS sxt,
           sum(g_sy) FILTER (WHERE m.n > 0) AS sy, sum(g_syy) FILTER (WHERE m.n > 0) AS syy,
           sum(g_ss) FILTER (WHERE m.n > 0) AS ss, sum(g_sss) FILTER (WHERE m.n > 0) AS sss,
           sum(g_st) FILTER (WHERE m.n > 0) AS st, sum(g_stt) FILTER (WHERE m.n > 0) AS stt,
           sum(m.n) FILTER (WHERE part = 1) AS n1, sum(m.sx) FILTER (WHERE part = 1) AS sx1,
           sum(m.n) FILTER (WHERE part = 9) AS n9, sum(m.sx) FILTER (WHERE part = 9) AS sx9,
           sum(g_n) AS n0, coalesce(sum(m.sx), 0) AS sx0, sum(g_sy) AS sy0, sum(g_syy) AS syy0, coalesce(sum(m.sxy), 0) AS sx0y
    FROM (UNPIVOT w ON COLUMNS('__.+_ns$|^(sender_total|channel|receiver_total|e2e)_ns$') INTO NAME col VALUE m)
    GROUP BY col, kind
), d AS (
    SELECT *, sxx - sx * sx / n AS cxx, syy - sy * sy / n AS cyy, sxy - sx * sy / n AS cxy,
           sss - ss * ss / n AS css, sxs - sx * ss / n AS cxs, stt - st * st / n AS ctt, sxt - sx * st / n AS cxt
    FROM u WHERE n > 0
)
SELECT c.stage, c.side, c.position, d.kind, d.n::BIGINT AS n,
       sx / n AS mean,
       CASE WHEN n > 1 THEN sqrt(greatest(cxx, 0) / (n - 1)) END AS stddev,
       cxy / nullif(sqrt(cxx * cyy), 0) AS r,
       cxy / nullif(cxx, 0) AS slope_e2e,
       cxy AS sxy, cyy AS syy,
       (sx0y - sx0 * sy0 / n0) / nullif(syy0 - sy0 * sy0 / n0, 0) AS variance_share,
       cxs / nullif(css, 0) AS slope_seq,
       cxt / nullif(ctt, 0) AS slope_time,
       cxt * cxt / nullif(cxx * ctt, 0) AS r2_time,
       sx1 / nullif(n1, 0) AS first_mean,
       sx9 / nullif(n9, 0) AS last_mean
FROM d JOIN stage_columns c USING (col);

-- The sent packets of the selected kind (send_gaps, and activation.sql's
-- deviations), and those that reached the sender's wire point with the time
-- they did (wire_gaps): each filter said once.
CREATE OR REPLACE TEMP MACRO sent_rows() AS TABLE
SELECT run_key(run_id) AS run, flow, kind, seq, sent_ns, e2e_ns FROM packets
WHERE sent_ns IS NOT NULL AND (getvariable('kind') IS NULL OR kind = getvariable('kind'));

CREATE OR REPLACE TEMP MACRO wire_rows() AS TABLE
SELECT run_key(run_id) AS run, flow, kind, seq, sent_ns + sender_total_ns AS wire_ns FROM packets
WHERE sender_total_ns IS NOT NULL AND (getvariable('kind') IS NULL OR kind = getvariable('kind'));

-- Each sent packet of the selected kind with the gap to the one before it
-- in its (run, flow, kind): by seq (send_gaps: activation.sql's schedule)
-- and by the time it left the sender's device (wire_gaps: gaps.sql).
-- Two ways to the same rows. `_sorted`: the packets sorted once, each
-- one's predecessor taken by a window with an empty OVER (), which DuckDB
-- runs streaming in the sort's order, without a copy of each partition (10
-- M packets: 0.4-0.5 GB and 0.9-1.1 s, instead of 1.2-1.3 GB and 1.2-1.8
-- s). `_partitioned`: a window per (run, flow, kind), whose partitions
-- spill one by one; one global sort of a 100 M-packet dataset runs out of
-- a 6 GB engine beside the quantile state of its gaps. send_gaps() and
-- wire_gaps() are the sorted ones here; xlap-trace makes them the
-- partitioned ones for a dataset of runs (dataset.rs).
CREATE OR REPLACE TEMP MACRO send_gaps_sorted() AS TABLE
SELECT run, flow, kind, seq, sent_ns,
       CASE WHEN lag(run) OVER () IS NOT DISTINCT FROM run
             AND lag(flow) OVER () IS NOT DISTINCT FROM flow
             AND lag(kind) OVER () IS NOT DISTINCT FROM kind
            THEN (sent_ns - lag(sent_ns) OVER ()) / nullif(seq - lag(seq) OVER (), 0) END AS gap
FROM (SELECT run, flow, kind, seq, sent_ns FROM sent_rows() ORDER BY run, flow, kind, seq);

CREATE OR REPLACE TEMP MACRO send_gaps_partitioned() AS TABLE
SELECT run, flow, kind, seq, sent_ns,
       (sent_ns - lag(sent_ns) OVER w) / nullif(seq - lag(seq) OVER w, 0) AS gap
FROM sent_rows()
WINDOW w AS (PARTITION BY run, flow, kind ORDER BY seq);

CREATE OR REPLACE TEMP MACRO send_gaps() AS TABLE FROM send_gaps_sorted();

CREATE OR REPLACE TEMP MACRO wire_gaps_sorted() AS TABLE
SELECT flow, kind, seq,
       CASE WHEN lag(run) OVER () IS NOT DISTINCT FROM run
             AND lag(flow) OVER () IS NOT DISTINCT FROM flow
             AND lag(kind) OVER () IS NOT DISTINCT FROM kind
            THEN wire_ns - lag(wire_ns) OVER () END AS gap_ns
FROM (FROM wire_rows() ORDER BY run, flow, kind, wire_ns, seq);

CREATE OR REPLACE TEMP MACRO wire_gaps_partitioned() AS TABLE
SELECT flow, kind, seq,
       wire_ns - lag(wire_ns) OVER (PARTITION BY run, flow, kind ORDER BY wire_ns, seq) AS gap_ns
FROM wire_rows();

CREATE OR REPLACE TEMP MACRO wire_gaps() AS TABLE FROM wire_gaps_sorted();

-- Each (run, flow, kind)'s send schedule, for activation.sql: the median
-- send-time gap per sequence step, the mean period (the slope of send time
-- over seq, for a sender whose bursts make the median 0), and where the
-- schedule starts. A view: only activation reads it, and the sort behind
-- the gaps is two thirds of that query's time (10 M packets: 1.6 s), so
-- record, correlate and synth store it beside the packets with the stage
-- tables (crate::stored) and later analyses read those few rows instead.
CREATE OR REPLACE TEMP VIEW send_schedule AS
SELECT run, flow, kind, median(gap) AS median_gap_ns, regr_slope(sent_ns, seq) AS mean_period_ns,
       min(seq) AS seq0, arg_min(sent_ns, seq) AS t0
FROM send_gaps() GROUP BY ALL;

-- End-to-end outliers (above the e2e fence of their kind), and each of
-- their stages on the path beside that stage's own fence (a sender's
-- stages after its wire point run alongside the channel and the receiver:
-- their time is already in those, so they are no cause). A packet is its
-- (run_id, flow, kind, seq): a dataset of runs repeats the others.
CREATE OR REPLACE TEMP TABLE late AS
SELECT p.run_id, p.flow, p.kind, p.seq, p.e2e_ns, f.fence
FROM packets p JOIN fences f ON f.stage = 'e2e' AND f.kind = p.kind
WHERE p.e2e_ns > f.fence;

-- late_stages: the same packets as late (found by the fence, not by
-- joining late's keys back to every packet); a view, since the bundled
-- queries need only its rows above their fence (late_causes: an eighth
-- of them on a synthetic run of 10 M packets), and materialising every
-- row cost more than finding the causes.
CREATE OR REPLACE TEMP VIEW late_stages AS
SELECT s.run_id, s.flow, s.kind, s.seq, c.stage, c.side, c.position, s.ns, f.fence, s.ns > f.fence AS above
FROM (
    UNPIVOT (SELECT run_id, flow, kind, seq, COLUMNS('__.+_ns$|^channel_ns$')
             FROM packets p SEMI JOIN fences e ON e.stage = 'e2e' AND e.kind = p.kind AND p.e2e_ns > e.fence)
    ON COLUMNS(* EXCLUDE (run_id, flow, kind, seq)) INTO NAME col VALUE ns
) s
JOIN stage_columns c USING (col)
JOIN fences f ON f.stage = c.stage AND f.kind = s.kind
WHERE c.side IN ('tx', 'channel', 'rx');

CREATE OR REPLACE TEMP TABLE late_causes AS
SELECT * EXCLUDE (above) FROM late_stages WHERE above;

-- Request/response exchanges: a request packet and the response that
-- carries its seq back between the same two processes and ports (sockperf's
-- ping and pong; a DNS query and its answer). The kinds are the variables
-- `request` and `response`; unset, the pair of kinds that most seqs travel
-- both ways is taken, the request being the one sent first. One row per
-- exchange whose request and response were both seen at both ends, its
-- round trip cut into stages that sum to it: the request's sender side, its
-- wire, its receiver side; the server's residence (from the request's last
-- point to the response's first); the response's three. The round trip is
-- the client's own clock from its first request point to its last response
-- point: the clock mapping moves time between the wires and the server's
-- stages, never the sum.
CREATE OR REPLACE TEMP VIEW exchange_candidates AS
SELECT q.kind AS request, r.kind AS response, count(*) AS exchanges
FROM packets q
JOIN packets r ON r.seq = q.seq AND r.tx_host = q.rx_host AND r.tx_pid = q.rx_pid
    AND r.rx_host = q.tx_host AND r.rx_pid = q.tx_pid
    AND r.src_port = q.dst_port AND r.dst_port = q.src_port AND r.sent_ns > q.sent_ns
WHERE q.e2e_ns IS NOT NULL AND r.e2e_ns IS NOT NULL
  AND (getvariable('request') IS NULL OR q.kind = getvariable('request'))
  AND (getvariable('response') IS NULL OR r.kind = getvariable('response'))
GROUP BY ALL;

CREATE OR REPLACE TEMP VIEW exchanges AS
WITH pair AS (SELECT request, response FROM exchange_candidates ORDER BY exchanges DESC, request, response LIMIT 1)
SELECT q.seq, q.kind AS request_kind, r.kind AS response_kind,
       q.tx_host AS client_host, q.tx_pid AS client_pid, q.rx_host AS server_host, q.rx_pid AS server_pid,
       q.sent_ns AS request_sent_ns,
       q.sender_total_ns AS client_send_ns,
       q.channel_ns AS request_wire_ns,
       q.receiver_total_ns AS server_receive_ns,
       r.sent_ns - (q.sent_ns + q.e2e_ns) AS server_residence_ns,
       r.sender_total_ns AS server_send_ns,
       r.channel_ns AS response_wire_ns,
       r.receiver_total_ns AS client_receive_ns,
       r.sent_ns + r.e2e_ns - q.sent_ns AS rtt_ns
FROM packets q
JOIN pair ON q.kind = pair.request
JOIN packets r ON r.kind = pair.response AND r.seq = q.seq AND r.tx_host = q.rx_host AND r.tx_pid = q.rx_pid
    AND r.rx_host = q.tx_host AND r.rx_pid = q.tx_pid
    AND r.src_port = q.dst_port AND r.dst_port = q.src_port AND r.sent_ns > q.sent_ns
WHERE q.e2e_ns IS NOT NULL AND r.e2e_ns IS NOT NULL;
