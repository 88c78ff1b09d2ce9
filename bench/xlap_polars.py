#!/usr/bin/env python3
"""The default analysis set of `xlap-trace analyze` written the way a polars
user would write it, over an xlap-trace packets table: the second anchor
`just bench-analysis` runs side by side with xlap-trace (pandas, in
xlap_pandas.py, is the first).

Per kind and stage: box statistics with tail quantiles (the jitter table),
the end-to-end fence and each outlier's stages above their own fences (the
outlier causes), the correlation with end-to-end latency and the variance
share, the trend over the run (slopes, first and last tenth), the losses;
then the summary of the most common kind. Lazy frames, one collect per
question, as polars' guide advises. Prints one JSON object: seconds per
step and the results the benchmark compares with xlap-trace's.

Usage: xlap_polars.py RUN_DIR_OR_PACKETS_PARQUET
"""
import json
import sys
import time

import polars as pl

from anchor import Steps, packets_path, stage_columns

TAILS = [0.5, 0.9, 0.99, 0.999]


def main(path):
    path = packets_path(path)
    steps = Steps()
    step = steps.done

    lf = pl.scan_parquet(path)
    names = lf.collect_schema().names()
    stages = stage_columns(names)
    path_stages = [c for c in names if "__" in c and c.endswith("_ns")] + ["channel_ns"]
    delivered = lf.filter(pl.col("e2e_ns").is_not_null())
    results = {}

    t0 = time.perf_counter()
    # Box statistics: quartiles, fences, whiskers, outliers, mean, spread,
    # tail quantiles, per kind and stage (wide: one expression per stage and
    # statistic; a long table of every packet and stage cost 4x the time).
    stats = {f"q{p}": (lambda c, p=p: pl.col(c).quantile(p, "linear")) for p in [0.25, 0.75] + TAILS}
    stats.update({"min": lambda c: pl.col(c).min(), "max": lambda c: pl.col(c).max(),
                  "mean": lambda c: pl.col(c).mean(), "std": lambda c: pl.col(c).std(),
                  "n": lambda c: pl.col(c).count()})
    box = delivered.group_by("kind").agg(
        [f(c).alias(f"{name}|{c}") for c in stages for name, f in stats.items()]
    ).collect()
    fence = box.select(
        ["kind"]
        + [(pl.col(f"q0.75|{c}") + 1.5 * (pl.col(f"q0.75|{c}") - pl.col(f"q0.25|{c}"))).alias(f"hi|{c}") for c in stages]
        + [(pl.col(f"q0.25|{c}") - 1.5 * (pl.col(f"q0.75|{c}") - pl.col(f"q0.25|{c}"))).alias(f"lo|{c}") for c in stages]
    )
    with_fences = delivered.join(fence.lazy(), on="kind")
    with_fences.group_by("kind").agg(
        [pl.col(c).filter(pl.col(c) >= pl.col(f"lo|{c}")).min().alias(f"whisker_lo|{c}") for c in stages]
        + [pl.col(c).filter(pl.col(c) <= pl.col(f"hi|{c}")).max().alias(f"whisker_hi|{c}") for c in stages]
        + [((pl.col(c) < pl.col(f"lo|{c}")) | (pl.col(c) > pl.col(f"hi|{c}"))).sum().alias(f"outliers|{c}") for c in stages]
    ).collect()
    step("jitter", t0)
    results["e2e_median"] = {int(r["kind"]): float(r["q0.5|e2e_ns"]) for r in box.iter_rows(named=True)}

    t0 = time.perf_counter()
    # Outlier causes: the packets above their kind's e2e fence, and which of
    # their path stages are above their own fence.
    late = with_fences.filter(pl.col("e2e_ns") > pl.col("hi|e2e_ns"))
    counts = late.group_by("kind").agg(
        [(pl.col(c) > pl.col(f"hi|{c}")).sum().alias(c) for c in path_stages]
    ).collect()
    step("outlier_causes", t0)
    results["top_cause"] = {}
    for r in counts.iter_rows(named=True):
        top = max(path_stages, key=lambda c: r[c])
        results["top_cause"][int(r["kind"])] = top[:-3]

    t0 = time.perf_counter()
    # Correlation with e2e and the variance share (a missing stage counts 0).
    delivered.group_by("kind").agg(
        [pl.corr(c, "e2e_ns").alias(f"r_{c}") for c in stages[:-1]]
        + [pl.cov(c, "e2e_ns").alias(f"cov_{c}") for c in stages[:-1]]
        + [pl.col(c).var().alias(f"var_{c}") for c in stages[:-1]]
        + [pl.cov(pl.col(c).fill_null(0), "e2e_ns").alias(f"cov0_{c}") for c in stages[:-1]]
        + [pl.col("e2e_ns").var().alias("var_e2e")]
    ).collect()
    step("correlation", t0)

    t0 = time.perf_counter()
    # Trend: slopes over seq and send time, r² over time, first and last tenth.
    span = delivered.group_by("kind").agg(
        pl.col("seq").min().alias("s0"), pl.col("sent_ns").min().alias("t0"),
        (pl.col("sent_ns").max() - pl.col("sent_ns").min()).alias("span"),
    )
    c = delivered.join(span, on="kind").with_columns(
        s=(pl.col("seq") - pl.col("s0")).cast(pl.Float64),
        t=(pl.col("sent_ns") - pl.col("t0")).cast(pl.Float64),
    )
    c.group_by("kind").agg(
        [(pl.cov(x, "s") / pl.col("s").filter(pl.col(x).is_not_null()).var()).alias(f"slope_seq_{x}") for x in stages]
        + [(pl.cov(x, "t") / pl.col("t").filter(pl.col(x).is_not_null()).var()).alias(f"slope_t_{x}") for x in stages]
        + [(pl.corr(x, "t") ** 2).alias(f"r2_{x}") for x in stages]
        + [pl.col(x).filter(pl.col("t") * 10 <= pl.col("span")).mean().alias(f"first_{x}") for x in stages]
        + [pl.col(x).filter(pl.col("t") * 10 >= 9 * pl.col("span")).mean().alias(f"last_{x}") for x in stages]
    ).collect()
    step("trend", t0)

    t0 = time.perf_counter()
    # Losses per flow and kind, with the longest run of consecutive losses.
    flags = ["lost", "recovered", "duplicate", "reordered", "retransmitted"]
    lf.group_by("flow", "kind").agg([pl.col(f).sum() for f in flags] + [pl.len()]).collect()
    (
        lf.filter(pl.col("lost"))
        .sort("flow", "kind", "seq")
        .with_columns(island=(pl.col("seq").diff().over("flow", "kind").fill_null(0) != 1).cum_sum())
        .group_by("flow", "kind", "island")
        .len()
        .group_by("flow", "kind")
        .agg(pl.col("len").max())
        .collect()
    )
    step("loss", t0)

    t0 = time.perf_counter()
    main_kind = delivered.select(pl.col("kind").mode().first()).collect().item()
    delivered.filter(pl.col("kind") == main_kind).select(
        [pl.col(s).quantile(0.5, "linear").alias(f"p50_{s}") for s in stages]
        + [pl.col(s).quantile(0.99, "linear").alias(f"p99_{s}") for s in stages]
        + [pl.col(s).max().alias(f"max_{s}") for s in stages]
    ).collect()
    step("summary", t0)

    total = steps.total()
    print(json.dumps({"seconds": total, "steps": steps.seconds, "results": results}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
