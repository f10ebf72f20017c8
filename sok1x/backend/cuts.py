"""Where the parts of a concatenation start: a group's members, a batch's tables, a rank's
peers. One place for the running sum every front door and both backends cut arrays by."""
import numpy as np


def cut_points(counts):
    """int64 [n + 1]: 0, then the running sums of `counts` (n part sizes): part t of their
    concatenation is [cut_points[t], cut_points[t + 1])."""
    return np.concatenate(([0], np.cumsum(counts, dtype=np.int64)))


def part_starts(counts):
    """int64 [n]: where each of the n parts of sizes `counts` starts (cut_points less its
    end)."""
    return cut_points(counts)[:-1]
