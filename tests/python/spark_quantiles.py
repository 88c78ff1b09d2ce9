"""Spark reads an xlap-trace dataset (`xlap-trace dataset add`) as any
partitioned Parquet dataset and computes, for the delivered packets of one
kind (optionally of one run), the exact median and 99th percentile of every
stage column: what `xlap-trace analyze -q jitter` reports as median_ns and
p99_ns. Prints {stage: [p50, p99, packets]} as JSON.

usage: spark_quantiles.py DATASET KIND [RUN_ID]
"""

import json
import re
import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

STAGE = re.compile(r"^(.*__.+|sender_total|channel|receiver_total|e2e)_ns$")


def main() -> None:
    dataset, kind = sys.argv[1], int(sys.argv[2])
    run_id = sys.argv[3] if len(sys.argv) > 3 else None
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("xlap-dataset")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # Partition discovery from the base path: run_id comes from the
    # directory names, as DuckDB's hive_partitioning takes it.
    packets = (
        spark.read.option("basePath", dataset)
        .option("mergeSchema", "true")
        .parquet(f"{dataset}/run_id=*/packets.parquet")
    )
    packets.createOrReplaceTempView("packets")
    where = f"e2e_ns IS NOT NULL AND kind = {kind}"
    if run_id is not None:
        where += f" AND run_id = '{run_id}'"
    stages = [c for c in packets.columns if STAGE.match(c)]
    row = spark.sql(
        "SELECT "
        + ", ".join(
            f"percentile(`{c}`, array(0.5, 0.99)) AS `{c}_q`, count(`{c}`) AS `{c}_n`"
            for c in stages
        )
        + f" FROM packets WHERE {where}"
    ).collect()[0]
    out = {}
    for c in stages:
        q, n = row[f"{c}_q"], row[f"{c}_n"]
        if n:
            out[c[: -len("_ns")]] = [float(q[0]), float(q[1]), int(n)]
    print(json.dumps(out, sort_keys=True))
    spark.stop()


if __name__ == "__main__":
    main()
