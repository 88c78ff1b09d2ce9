#!/usr/bin/env python3
"""How often `xlap-trace compare` is right on short single runs of the CI job.

N unchanged pairs and N injected pairs, interleaved: each pair records a
single-run baseline with examples/ci/xlap-ci.sh (`baseline DIR 1`) and then
runs its `check` step once, unchanged or with XLAP_INJECT (default
decode=50: a 50 µs busy-wait in the receiver's decode). The check's exit code
is the verdict (1 regression, 0 none). Prints the regressions of the N
injected pairs and the false alarms of the N unchanged ones, and writes them
as JSON (default bench-results/compare.json).

    bench/compare_verdicts.py [--pairs N] [--count PACKETS] [--inject STAGE=US]
    bench/compare_verdicts.py --rejudge DIR   # the kept runs of an earlier
                                              # run judged again (another build)

Needs root, and xlap-trace and xlap-example on PATH (`just bench-compare`
puts the build's there). Standard library only.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CI = os.path.join(REPO, "examples", "ci", "xlap-ci.sh")


def ci(args, env):
    """One xlap-ci.sh step; its exit code and output."""
    p = subprocess.run(["sh", CI] + args, env=env, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def judge(base, cand):
    """compare --json on a kept pair: what it called regressions."""
    p = subprocess.run(
        ["xlap-trace", "compare", base, cand, "--json"],
        capture_output=True,
        text=True,
    )
    if p.returncode not in (0, 1):
        sys.exit(f"compare {base} {cand} failed ({p.returncode}): {p.stderr}")
    c = json.loads(p.stdout)
    regressed = [
        f"{r['metric']} kind {r['kind']}" for r in c["rows"] if r["verdict"] == "regression"
    ]
    return p.returncode, c["verdict"], regressed


def record_pair(work, mode, i, args, env):
    """A single-run baseline and one check against it: the check's exit."""
    pair = os.path.join(work, f"{mode}-{i:02}")
    shutil.rmtree(pair, ignore_errors=True)
    for attempt in range(3):
        rc, _, err = ci(["baseline", os.path.join(pair, "base"), "1"], env)
        if rc == 0:
            break
        print(f"  baseline of {mode} pair {i} failed ({rc}), again: {err.strip()[-300:]}")
    else:
        sys.exit(f"the baseline of {mode} pair {i} failed three times")
    cenv = dict(env)
    if mode == "injected":
        cenv["XLAP_INJECT"] = args.inject
    base = os.path.join(pair, "base", "baseline.json")
    for attempt in range(3):
        rc, _, err = ci(["check", base, os.path.join(pair, "check")], cenv)
        # 0 no regression, 1 regression; the check's own failures (the
        # protocol or the recorder) say so on stderr.
        if rc in (0, 1) and os.path.exists(os.path.join(pair, "check", "compare.md")):
            return pair, rc
        print(f"  check of {mode} pair {i} failed ({rc}), again: {err.strip()[-300:]}")
    sys.exit(f"the check of {mode} pair {i} failed three times")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=10, help="pairs of each mode (default 10)")
    ap.add_argument("--count", type=int, default=3000, help="data packets per run (default 3000: 0.3 s)")
    ap.add_argument("--inject", default="decode=50", help="the injected delay (default decode=50)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench-results", "compare.json"))
    ap.add_argument("--work", default=os.path.join(REPO, "bench-results", "compare-runs"),
                    help="where the pairs' runs are kept (replaced)")
    ap.add_argument("--port", default="47620", help="the example's port (default 47620)")
    ap.add_argument("--rejudge", metavar="DIR",
                    help="judge the pairs kept in DIR again with this xlap-trace; record nothing")
    args = ap.parse_args()
    for tool in ("xlap-trace",) + (() if args.rejudge else ("xlap-example",)):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not on PATH (just bench-compare puts the build's there)")

    pairs = []
    if args.rejudge:
        work = args.rejudge
        for name in sorted(os.listdir(work)):
            mode, _, i = name.rpartition("-")
            if mode not in ("unchanged", "injected"):
                continue
            pair = os.path.join(work, name)
            rc = None
            pairs.append((mode, int(i), pair, rc))
        meta_path = os.path.join(work, "bench.json")
        if os.path.exists(meta_path):
            with open(meta_path) as f:
                meta = json.load(f)
            args.count, args.inject = meta["count"], meta["inject"]
    else:
        if os.geteuid() != 0:
            sys.exit("needs root: it traces the example protocol (sudo -E)")
        work = args.work
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        with open(os.path.join(work, "bench.json"), "w") as f:
            json.dump({"count": args.count, "inject": args.inject}, f)
        env = dict(os.environ, XLAP_CI_COUNT=str(args.count), XLAP_CI_PORT=args.port)
        env.pop("XLAP_INJECT", None)
        start = time.monotonic()
        for i in range(args.pairs):
            # Interleaved, the order alternating: the machine's states fall on
            # both modes alike.
            modes = ("unchanged", "injected") if i % 2 == 0 else ("injected", "unchanged")
            for mode in modes:
                pair, rc = record_pair(work, mode, i, args, env)
                pairs.append((mode, i, pair, rc))
                print(f"  {mode} pair {i}: exit {rc}", flush=True)
        print(f"recorded {4 * args.pairs} runs in {time.monotonic() - start:.0f} s")

    results = []
    for mode, i, pair, rc in sorted(pairs, key=lambda p: (p[0] != "injected", p[1])):
        base = os.path.join(pair, "base", "baseline.json")
        cand = os.path.join(pair, "check", "run")
        code, verdict, regressed = judge(base, cand)
        if rc is not None and rc != code:
            # The check ran compare on the same files: the same verdict.
            sys.exit(f"{pair}: the check exited {rc}, compare --json {code}")
        results.append({
            "mode": mode,
            "pair": i,
            "exit": code,
            "verdict": verdict,
            "regressed": regressed,
        })
        first = f", first {regressed[0]}" if regressed else ""
        print(f"{mode:9} pair {i:2}: {verdict}, {len(regressed)} metrics regressed{first}")

    inj = [r for r in results if r["mode"] == "injected"]
    unch = [r for r in results if r["mode"] == "unchanged"]
    hits = sum(r["exit"] == 1 for r in inj)
    alarms = sum(r["exit"] == 1 for r in unch)
    out = {
        "packets_per_run": args.count,
        "inject": args.inject,
        "injected": {"regressions": hits, "of": len(inj)},
        "unchanged": {"false_alarms": alarms, "of": len(unch)},
        "xlap_trace": shutil.which("xlap-trace"),
        "runs": os.path.abspath(work),
        "pairs": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(
        f"\n{args.inject} injected: {hits} of {len(inj)} regressions; "
        f"unchanged: {alarms} of {len(unch)} false alarms "
        f"({args.count}-packet single-run baselines); wrote {args.out}"
    )


if __name__ == "__main__":
    main()
