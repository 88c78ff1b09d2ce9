-- name: exchange
-- description: Request/response round trips (the `exchanges` view: sockperf's ping and pong, a query and its answer): each stage of the round trip (client send, request wire, server receive, server residence, server send, response wire, client receive; they sum to it) with its quantiles, its share of the mean round trip, its correlation with the round trip, and how often it is above its own Tukey fence in the round trips above theirs (the outlier causes). One row per stage, the round trip last.
-- reads: exchanges (views.sql)
-- params: request = the request's kind (default: of the pair of kinds most seqs travel both ways, the one sent first); response = the response's kind (`analyze --exchange REQ:RESP` sets both, by number or name)
WITH e AS MATERIALIZED (SELECT * FROM exchanges),
stage_names (stage, position) AS (VALUES
    ('client_send', 1), ('request_wire', 2), ('server_receive', 3), ('server_residence', 4),
    ('server_send', 5), ('response_wire', 6), ('client_receive', 7), ('rtt', 8)),
long AS (
    SELECT seq, regexp_replace(stage, '_ns$', '') AS stage, ns, round_trip
    FROM (UNPIVOT (SELECT seq, rtt_ns AS round_trip, COLUMNS('^(client_send|request_wire|server_receive|server_residence|server_send|response_wire|client_receive|rtt)_ns$') FROM e)
          ON COLUMNS(* EXCLUDE (seq, round_trip)) INTO NAME stage VALUE ns)
), fence AS (
    SELECT stage, quantile_cont(ns, 0.75) + 1.5 * (quantile_cont(ns, 0.75) - quantile_cont(ns, 0.25)) AS fence
    FROM long GROUP BY stage
), slow AS (
    SELECT l.seq FROM long l JOIN fence f USING (stage) WHERE l.stage = 'rtt' AND l.ns > f.fence
), causes AS (
    SELECT l.stage, count(*) AS n
    FROM long l JOIN fence f USING (stage) SEMI JOIN slow s ON s.seq = l.seq
    WHERE l.stage <> 'rtt' AND l.ns > f.fence GROUP BY l.stage
)
SELECT (SELECT any_value(kind_label(request_kind)) FROM e) || ' → ' || (SELECT any_value(kind_label(response_kind)) FROM e) AS exchange,
       l.stage, count(*) AS exchanges,
       round(quantile_cont(l.ns, 0.5) / 1e3, 3) AS p50_us,
       round(quantile_cont(l.ns, 0.9) / 1e3, 3) AS p90_us,
       round(quantile_cont(l.ns, 0.99) / 1e3, 3) AS p99_us,
       round(max(l.ns) / 1e3, 3) AS max_us,
       round(avg(l.ns) / 1e3, 3) AS mean_us,
       round(avg(l.ns) / (SELECT avg(rtt_ns) FROM e), 4) AS share_of_rtt,
       CASE WHEN l.stage <> 'rtt' THEN round(corr(l.ns, l.round_trip), 4) END AS r_with_rtt,
       (SELECT count(*) FROM slow) AS slow_round_trips,
       CASE WHEN l.stage <> 'rtt' THEN round(coalesce(any_value(c.n), 0) / nullif((SELECT count(*) FROM slow), 0), 4) END AS cause_share
FROM long l JOIN stage_names n USING (stage) LEFT JOIN causes c USING (stage)
GROUP BY l.stage, n.position
ORDER BY n.position;
