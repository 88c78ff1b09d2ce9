#!/usr/bin/env python3
"""X-LAP's analyses the way its notebook did them (pandas/numpy), over an
xlap-trace packets table: the baseline `just bench-analysis` runs side by side
with `xlap-trace analyze --query all` on the same Parquet file.

It computes the same set as the bundled queries (jitter box statistics,
outlier causes, correlation, latency profile, histogram, trend, loss,
summary, slowest traces) and prints one JSON object: seconds per step and a
few results the benchmark compares with xlap-trace's, so both sides are seen
to do the same work.

Usage: xlap_pandas.py RUN_DIR_OR_PACKETS_PARQUET
"""
import json
import sys
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from anchor import Steps, packets_path, stage_columns

LEVELS = [0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 0.997, 0.998, 0.999,
          0.9995, 0.9998, 0.9999, 0.99995, 0.99998, 0.99999, 0.999995, 0.999998, 0.999999]


def main(path):
    path = packets_path(path)
    steps = Steps()
    step = steps.done

    t0 = time.perf_counter()
    # Only what the analyses read (the point columns are not needed).
    names = pq.read_schema(path).names
    stages = stage_columns(names)
    keys = ["flow", "kind", "seq", "sent_ns", "lost", "recovered", "duplicate", "reordered", "retransmitted"]
    df = pd.read_parquet(path, engine="pyarrow", columns=keys + stages)
    step("read", t0)
    d = df[df["e2e_ns"].notna()]
    groups = d.groupby("kind")
    results = {}

    t0 = time.perf_counter()
    q = groups[stages].quantile([0.25, 0.5, 0.75, 0.9, 0.99, 0.999])
    q1, q3 = q.xs(0.25, level=1), q.xs(0.75, level=1)
    iqr = q3 - q1
    lo, hi = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    jitter = {}
    for kind, g in groups:
        x = g[stages]
        inside = x.where((x >= lo.loc[kind]) & (x <= hi.loc[kind]))
        jitter[kind] = pd.DataFrame({
            "min": x.min(), "max": x.max(), "mean": x.mean(), "std": x.std(),
            "whisker_lo": inside.min(), "whisker_hi": inside.max(),
            "outliers": x.notna().sum() - inside.notna().sum(),
        })
    step("jitter", t0)
    results["e2e_median"] = {int(k): float(q.loc[(k, 0.5), "e2e_ns"]) for k in jitter}

    t0 = time.perf_counter()
    causes = {}
    for kind, g in groups:
        late = g[g["e2e_ns"] > hi.loc[kind, "e2e_ns"]]
        above = late[stages[:-4] + ["channel_ns"]] > hi.loc[kind, stages[:-4] + ["channel_ns"]]
        causes[kind] = above.sum().sort_values(ascending=False)
    step("outlier_causes", t0)
    results["top_cause"] = {int(k): v.index[0][:-3] for k, v in causes.items()}

    t0 = time.perf_counter()
    corr = {}
    for kind, g in groups:
        x = g[stages[:-1]]
        y = g["e2e_ns"]
        cov = x.apply(lambda c: c.cov(y))
        corr[kind] = pd.DataFrame({"r": x.corrwith(y), "slope": cov / x.var(), "share": cov / y.var()})
    step("correlation", t0)

    t0 = time.perf_counter()
    groups[stages].quantile(LEVELS)
    step("latency_profile", t0)

    t0 = time.perf_counter()
    for kind, g in groups:
        e = g["e2e_ns"].to_numpy()
        np.histogram(e, bins=40, range=(e.min(), np.quantile(e, 0.999)))
    step("histogram", t0)

    t0 = time.perf_counter()
    for kind, g in groups:
        s = g["seq"].to_numpy(dtype=float) - g["seq"].min()
        t = g["sent_ns"].to_numpy(dtype=float) - g["sent_ns"].min()
        span = t.max()
        for c in stages:
            v = g[c].to_numpy(dtype=float)
            ok = ~np.isnan(v)
            np.polyfit(s[ok], v[ok], 1)
            np.polyfit(t[ok], v[ok], 1)
            np.corrcoef(t[ok], v[ok])
            v[t <= span / 10].mean(), v[t >= 9 * span / 10].mean()
    step("trend", t0)

    t0 = time.perf_counter()
    for (flow, kind), g in df.groupby(["flow", "kind"]):
        lost = np.sort(g.loc[g["lost"], "seq"].to_numpy())
        if len(lost):
            islands = np.cumsum(np.diff(lost, prepend=lost[0] - 2) != 1)
            np.bincount(islands).max()
        g[["lost", "recovered", "duplicate", "reordered", "retransmitted"]].sum()
    step("loss", t0)

    t0 = time.perf_counter()
    main_kind = d["kind"].mode()[0]
    g = d[d["kind"] == main_kind]
    g[stages].quantile([0.5, 0.99]), g[stages].max()
    step("summary", t0)

    t0 = time.perf_counter()
    d.nlargest(5, "e2e_ns")
    step("trace", t0)

    total = steps.total()
    print(json.dumps({"seconds": total, "steps": steps.seconds, "packets": len(df), "results": results}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
