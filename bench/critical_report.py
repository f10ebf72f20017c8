"""Tables and a figure of pass.sh's critical stage: each process's critical_path.py result
(critical_TREE_ROUND_WORKLOAD.json), the trees side by side.

    python bench/critical_report.py FOLDER... --out results/DATE-MACHINE-critical

Per workload: the step (ms, median of repeats, min-max) and the host's path from the wake to
the next forward's launch (us) of each tree and round; then each process's path part by part.
Writes OUT.md, OUT.json (the rows) and OUT.png (the path of each process, its parts stacked).
"""
import argparse
import glob
import json
import os
import re
import sys

NAME = re.compile(r"critical_(?P<tree>[a-z]+)_(?P<round>\d+)_(?P<workload>\w+)\.json$")


def load(folders):
    """[(label, tree, round, workload, entry)] of every critical_*.json in `folders`; label is
    the folder's name (a lease)."""
    rows = []
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "critical_*.json"))):
            match = NAME.search(os.path.basename(path))
            if match is None:
                continue
            with open(path) as handle:
                result = json.load(handle)
            for workload, entry in result["workloads"].items():
                rows.append((os.path.basename(os.path.normpath(folder)), match["tree"],
                             int(match["round"]), workload, entry))
    return rows


def markdown(rows):
    lines = ["# The replayed step's host path (bench/critical_path.py)", "",
             "Per process: the step in ms (median of repeats, min-max) and the host's path from "
             "the wake of the step's one wait to the next forward's launch, us (median over the "
             "steps).", "",
             "| lease | workload | tree | round | step ms | path us |", "|---|---|---|---|---|---|"]
    for label, tree, round_, workload, entry in rows:
        lines.append("| %s | %s | %s | %d | %.3f (%.3f-%.3f) | %.0f |" % (
            label, workload, tree, round_, entry["step_ms"], entry["step_ms_min"],
            entry["step_ms_max"], entry["segments_us"].get("path_us", float("nan"))))
    lines += ["", "Part by part (us):", ""]
    for label, tree, round_, workload, entry in rows:
        parts = ", ".join("%s %.1f" % (name[3:], us) for name, us in
                          sorted(entry["segments_us"].items()) if name != "path_us")
        lines.append("- %s %s %s %d: %s" % (label, workload, tree, round_, parts))
    return "\n".join(lines) + "\n"


def figure(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(14, 0.35 * len(rows) + 1.5))
    colors = {}
    palette = [plt.get_cmap(name)(k) for name in ("tab20", "tab20b") for k in range(20)]
    for y, row in enumerate(rows):
        entry = row[4]
        left = 0.0
        for name, us in sorted(entry["segments_us"].items()):
            if name == "path_us":
                continue
            part = name[3:]
            if part not in colors:
                colors[part] = palette[len(colors) % len(palette)]
            ax.barh(y, us, left=left, color=colors[part])
            left += us
        ax.text(left + 5, y, "%.0f us, step %.3f ms" % (left, entry["step_ms"]), va="center",
                fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(["%s %s %s %d" % (label, workload, tree, round_)
                        for label, tree, round_, workload, entry in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("host us from the wake to the next forward's launch")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color) for color in colors.values()]
    ax.legend(handles, list(colors), fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--out", required=True, help="path without extension")
    args = parser.parse_args(argv)
    rows = load(args.folders)
    if not rows:
        sys.exit("no critical_*.json in %s" % ", ".join(args.folders))
    with open(args.out + ".md", "w") as handle:
        handle.write(markdown(rows))
    with open(args.out + ".json", "w") as handle:
        json.dump([{"lease": label, "tree": tree, "round": round_, "workload": workload,
                    **entry} for label, tree, round_, workload, entry in rows], handle, indent=1)
    figure(rows, args.out + ".png")


if __name__ == "__main__":
    main(sys.argv[1:])
