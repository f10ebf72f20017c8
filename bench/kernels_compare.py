"""Two trees' kernels a step side by side, from step_kernels.py's tables (pass.sh's kernels
stage writes them to kernels.txt):

    python3 bench/kernels_compare.py --before A/kernels.txt --after B/kernels.txt \
        --labels 241fb8a,361cc84 --out results/NAME      # NAME.md, NAME.json, NAME.png

Kernels are matched by name and by their order among those of the same name within a workload
(the k-th scan_tiles_int64 of one table against the k-th of the other); a kernel one tree runs
and the other does not is listed with nothing beside it. Several files may be given to each
side (comma-separated): a workload takes its table from the first file that has it.
"""
import argparse
import collections
import json
import re

LINE = re.compile(r"^\s*\d+\s+(\S+)\s+([\d.]+) us\s+([\d.]+) MB")
HEAD = re.compile(r"^(\S+): kernels ([\d.]+) us a step in (\d+) launches")


def parse(paths):
    """{workload: [(kernel, us, MB)]} from step_kernels.py's tables in `paths` (the first file
    holding a workload wins)."""
    tables = {}
    for path in paths:
        workload = None
        with open(path) as handle:
            for line in handle:
                head = HEAD.match(line)
                if head:
                    workload = head.group(1) if head.group(1) not in tables else None
                    if workload:
                        tables[workload] = []
                    continue
                row = LINE.match(line)
                if row and workload:
                    tables[workload].append((row.group(1), float(row.group(2)),
                                             float(row.group(3))))
    return tables


def keyed(rows):
    """[(name#k, us)] with k counting a name's earlier rows."""
    seen = collections.Counter()
    out = []
    for name, us, _ in rows:
        out.append(("%s#%d" % (name, seen[name]), us))
        seen[name] += 1
    return out


def compare(before, after):
    """{workload: [(kernel, before us or None, after us or None)]}, in the after tree's order
    with the before tree's own kernels after them, for the workloads both hold."""
    out = {}
    for workload in sorted(set(before) & set(after)):
        old, new = dict(keyed(before[workload])), keyed(after[workload])
        rows = [(key, old.get(key), us) for key, us in new]
        rows += [(key, us, None) for key, us in keyed(before[workload])
                 if key not in dict(new)]
        out[workload] = rows
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--labels", default="before,after")
    parser.add_argument("--out", required=True, help="path without extension")
    args = parser.parse_args()
    labels = args.labels.split(",")
    table = compare(parse(args.before.split(",")), parse(args.after.split(",")))
    lines = ["# Kernels a step, %s against %s" % (labels[1], labels[0]), "",
             "step_kernels.py's tables (Nsight Compute, each kernel alone, us a step).", ""]
    for workload, rows in table.items():
        total = [sum(r[i] or 0.0 for r in rows) for i in (1, 2)]
        lines += ["## %s: %.1f -> %.1f us" % (workload, total[0], total[1]), "",
                  "| kernel | %s | %s | change |" % tuple(labels), "|---|---|---|---|"]
        for key, old, new in rows:
            change = "" if old is None or new is None else "%+.1f" % (new - old)
            lines.append("| %s | %s | %s | %s |" % (
                key.replace("#0", ""), "-" if old is None else "%.1f" % old,
                "-" if new is None else "%.1f" % new, change))
        lines.append("")
    with open(args.out + ".md", "w") as handle:
        handle.write("\n".join(lines))
    with open(args.out + ".json", "w") as handle:
        json.dump({"labels": labels, "workloads": table}, handle, indent=1)
    plot(table, labels, args.out + ".png")


def plot(table, labels, path):
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, len(table), figsize=(7 * len(table), 9), squeeze=False)
    for axis, (workload, rows) in zip(axes[0], table.items()):
        names = [key.replace("#0", "") for key, _, _ in rows][::-1]
        places = range(len(rows))
        axis.barh([p + 0.2 for p in places], [r[1] or 0 for r in rows][::-1], 0.4,
                  label=labels[0])
        axis.barh([p - 0.2 for p in places], [r[2] or 0 for r in rows][::-1], 0.4,
                  label=labels[1])
        axis.set_yticks(list(places))
        axis.set_yticklabels(names, fontsize=7)
        axis.set_xlabel("us a step")
        axis.set_title("%s: %.0f -> %.0f us" % (workload, sum(r[1] or 0 for r in rows),
                                                sum(r[2] or 0 for r in rows)))
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
