"""What the analysis anchors (xlap_pandas.py, xlap_polars.py) share: where
a run's packets are, the stage columns, and the clock of each step."""
import os
import time

# The totals of the packets table; the stages are the columns with `__`.
TOTALS = ["sender_total_ns", "channel_ns", "receiver_total_ns", "e2e_ns"]


def packets_path(path):
    """A run directory's packets table, or the Parquet file given."""
    return os.path.join(path, "packets.parquet") if os.path.isdir(path) else path


def stage_columns(names):
    """Every stage and total column of a packets table, path stages first."""
    return [c for c in names if "__" in c and c.endswith("_ns")] + TOTALS


class Steps:
    """Seconds per named step, and in all."""

    def __init__(self):
        self.seconds = {}
        self.t_all = time.perf_counter()

    def done(self, name, t0):
        self.seconds[name] = round(time.perf_counter() - t0, 3)

    def total(self):
        return round(time.perf_counter() - self.t_all, 3)
