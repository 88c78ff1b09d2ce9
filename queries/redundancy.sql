-- name: redundancy
-- description: Redundant transmission over several paths (AFDX's networks A and B, PRP, D2DRR): the packets of one sending and one receiving process and kind that arrive over two or more flows are copies of one another. Per such stream: its paths (the receiving address:port of each) with the copies each carried and how often each delivered first, the packets that came over one path only, the seqs the usually slower path won, the skew between the copies at the receiver's device (p50, p99, max), and the copies later than `skew_max` after the first (AFDX's SkewMax: beyond it a receiver cannot tell a late copy from a new frame) with their seqs.
-- reads: packets
-- params: skew_max = SkewMax in µs (default: none, statistics only); kind = packet kind to keep (default: every kind)
-- c is read more than once: inlined, each reader scans the columns it
-- needs; materialised, it held a copy of them (10 M packets: up to 1.9 GB)
WITH c AS NOT MATERIALIZED (
    SELECT tx_host, tx_pid, rx_host, rx_pid, kind, seq, flow,
           coalesce(dst_addr || ':' || dst_port, 'flow ' || flow) AS path,
           sent_ns + sender_total_ns + channel_ns AS arrival_ns
    FROM packets
    WHERE channel_ns IS NOT NULL AND sender_total_ns IS NOT NULL
      AND (getvariable('kind') IS NULL OR kind = getvariable('kind'))
), streams AS (
    SELECT tx_host, tx_pid, rx_host, rx_pid, kind
    FROM c
    GROUP BY ALL
    HAVING count(DISTINCT flow) > 1
), s AS (
    SELECT c.* FROM c JOIN streams USING (tx_host, tx_pid, rx_host, rx_pid, kind)
), per_seq AS (
    SELECT tx_host, tx_pid, rx_host, rx_pid, kind, seq,
           count(*) AS copies,
           arg_min(path, arrival_ns) AS winner,
           max(arrival_ns) - min(arrival_ns) AS skew_ns
    FROM s
    GROUP BY ALL
), per_path AS (
    SELECT s.tx_host, s.tx_pid, s.rx_host, s.rx_pid, s.kind, s.path,
           count(*) AS copies,
           count(*) FILTER (WHERE p.winner = s.path) AS wins
    FROM s JOIN per_seq p USING (tx_host, tx_pid, rx_host, rx_pid, kind, seq)
    GROUP BY ALL
), paths AS (
    SELECT tx_host, tx_pid, rx_host, rx_pid, kind,
           list(path ORDER BY path) AS paths,
           list(copies ORDER BY path) AS copies,
           list(wins ORDER BY path) AS wins,
           arg_max(path, wins) AS usual_winner
    FROM per_path
    GROUP BY ALL
)
SELECT p.tx_host, p.rx_host, p.kind, any_value(a.paths) AS paths,
       any_value(a.copies) AS copies_per_path, any_value(a.wins) AS wins_per_path,
       count(*) AS packets,
       count(*) FILTER (WHERE p.copies > 1) AS with_copies,
       count(*) FILTER (WHERE p.copies = 1) AS one_path_only,
       min(p.seq, 20) FILTER (WHERE p.copies = 1) AS one_path_only_seqs,
       count(*) FILTER (WHERE p.winner <> a.usual_winner) AS upsets,
       min(p.seq, 100) FILTER (WHERE p.winner <> a.usual_winner) AS upset_seqs,
       round((quantile_cont(p.skew_ns, [0.5, 0.99]) FILTER (WHERE p.copies > 1))[1] / 1e3, 3) AS skew_p50_us,
       round((quantile_cont(p.skew_ns, [0.5, 0.99]) FILTER (WHERE p.copies > 1))[2] / 1e3, 3) AS skew_p99_us,
       round(max(p.skew_ns) FILTER (WHERE p.copies > 1) / 1e3, 3) AS skew_max_us,
       getvariable('skew_max')::DOUBLE AS skew_limit_us,
       count(*) FILTER (WHERE p.copies > 1 AND p.skew_ns > getvariable('skew_max') * 1000) AS over_skew_max,
       min(p.seq, 100) FILTER (WHERE p.copies > 1 AND p.skew_ns > getvariable('skew_max') * 1000) AS over_skew_max_seqs
FROM per_seq p
JOIN paths a USING (tx_host, tx_pid, rx_host, rx_pid, kind)
GROUP BY p.tx_host, p.tx_pid, p.rx_host, p.rx_pid, p.kind
ORDER BY p.tx_host, p.rx_host, p.kind;
