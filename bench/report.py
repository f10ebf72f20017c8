"""Merges one benchmark pass into bench/results/<name>.json, a markdown table and a PNG plot.

    python bench/report.py --name 2026-11-21-h200x4 --steps DIR --hash DIR --rows DIR --cpu DIR

DIR holds what bench/pass.sh's stages wrote (w1.json, w2.json, w4.json, hash.json, rows.json) or
cpu_step.py wrote (cpu1.json, cpu2.json, cpu4.json). --rows-label picks which kernels of rows.json
are reported (its "installed" ones by default). Targets are issue 5's.
"""
import json
import os
import sys

import harness

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
TARGETS = {"gather_of_copy": 0.75, "step_vs_torch": 2.0, "exchange_of_raw": 0.90,
           "weak_scaling": 0.85, "cpu_vs_native": 1.2}


def load(folder, name):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def step_table(steps_by_ranks):
    """{(workload, layer, hashtable, variant, ranks): entry} of every step entry."""
    table = {}
    for ranks, payload in steps_by_ranks.items():
        for entry in payload.get("steps", []):
            if "error" in entry:
                continue
            key = (entry["workload"], entry["layer"], entry["hashtable"], entry["variant"], ranks)
            table[key] = entry
    return table


def summarise(steps_by_ranks, hash_grid, rows, rows_label, cpu):
    steps = step_table(steps_by_ranks)
    ranks = sorted(steps_by_ranks)
    summary = {"targets": TARGETS, "step_vs_torch": [], "weak_scaling": [], "exchange": [],
               "gather": [], "hash_vs_hkv": [], "cpu": {}}
    for (workload, layer, hashtable, variant, n), entry in sorted(steps.items()):
        torch_entry = steps.get((workload, layer, False, "torch", n))
        if variant == "torch" or hashtable or torch_entry is None:
            continue
        summary["step_vs_torch"].append({
            "workload": workload, "layer": layer, "variant": variant, "ranks": n,
            "ms": entry["ms_per_step"], "torch_ms": torch_entry["ms_per_step"],
            "speedup": torch_entry["ms_per_step"] / entry["ms_per_step"]})
    for layer in ("dense", "sparse"):
        for variant in ("sok1x_device", "sok1x_api", "torch"):
            one = steps.get(("dlrm", layer, False, variant, 1))
            for n in ranks:
                other = steps.get(("dlrm", layer, False, variant, n))
                if one and other:
                    summary["weak_scaling"].append({
                        "layer": layer, "variant": variant, "ranks": n,
                        "efficiency": one["ms_per_step"] / other["ms_per_step"]})
    for n in ranks:
        for entry in steps_by_ranks[n].get("exchange", []):
            summary["exchange"].append(dict(entry, ranks=n))
    if rows:
        summary["copy_gbps"] = rows["copy"]["gbps"]
        summary["gather"] = [e for e in rows["ops"] if e["kernels"] == rows_label]
    if hash_grid:
        hkv = hash_grid["hkv"]
        for entry in hash_grid["grid"]:
            reference = hkv.get("dim %d, load %.1f" % (entry["dim"], entry["load"]))
            if reference:
                for op, figure in reference.items():
                    ours = entry[op]["gkeys_per_s"]
                    summary["hash_vs_hkv"].append({"dim": entry["dim"], "load": entry["load"],
                                                   "op": op, "sok1x": ours, "hkv": figure,
                                                   "ratio": ours / figure})
    if cpu:
        one = cpu.get(1)
        summary["cpu"] = {"sok1x_ms": one and one["sok1x_ms"],
                          "native_ms": one and one.get("native_ms"),
                          "sok1x_vs_native": one and one.get("sok1x_vs_native"),
                          "weak_scaling": {n: one["sok1x_ms"] / c["sok1x_ms"]
                                           for n, c in sorted(cpu.items()) if one}}
    return summary


def markdown(name, summary, hash_grid):
    lines = ["# Benchmarks %s" % name, "",
             "Training step, ms (speed-up over the PyTorch step; target >= 2x):", "",
             "| workload | layer | GPUs | PyTorch | sok1x device arrays | sok1x api (host) |",
             "|---|---|---|---|---|---|"]
    rows = {}
    for e in summary["step_vs_torch"]:
        rows.setdefault((e["workload"], e["layer"], e["ranks"]), {})[e["variant"]] = e
    for (workload, layer, n), by_variant in sorted(rows.items()):
        any_entry = next(iter(by_variant.values()))
        cells = []
        for variant in ("sok1x_device", "sok1x_api"):
            e = by_variant.get(variant)
            cells.append("-" if e is None else "%.2f (%.2fx)" % (e["ms"], e["speedup"]))
        lines.append("| %s | %s | %d | %.2f | %s | %s |" % (workload, layer, n,
                                                           any_entry["torch_ms"], *cells))
    lines += ["", "Weak scaling, DLRM-like (16384 samples per GPU; target >= 85%):", "",
              "| layer | variant | 2 GPUs | 4 GPUs |", "|---|---|---|---|"]
    weak = {}
    for e in summary["weak_scaling"]:
        weak.setdefault((e["layer"], e["variant"]), {})[e["ranks"]] = e["efficiency"]
    for (layer, variant), by_n in sorted(weak.items()):
        lines.append("| %s | %s | %s | %s |" % (layer, variant, *[
            "%.0f%%" % (100 * by_n[n]) if n in by_n else "-" for n in (2, 4)]))
    lines += ["", "Exchange, engine all-to-all vs torch all_to_all_single over NCCL "
              "(target >= 90%):", "", "| GPUs | MiB per rank | engine ms | raw ms | % of raw | "
              "with host header |", "|---|---|---|---|---|---|"]
    for e in summary["exchange"]:
        lines.append("| %d | %g | %.3f | %.3f | %.0f%% | %.0f%% |" % (
            e["ranks"], e["mib_per_rank"], e["engine_ms"], e["torch_nccl_ms"],
            100 * e["engine_vs_raw"], 100 * e["engine_with_header_vs_raw"]))
    if summary["gather"]:
        lines += ["", "Rows vs a device-to-device copy of %.0f GB/s (gather target >= 75%%):"
                  % summary["copy_gbps"], "", "| op | dim | GB/s | % of copy |",
                  "|---|---|---|---|"]
        for e in summary["gather"]:
            lines.append("| %s | %d | %.0f | %.0f%% |" % (e["op"], e["dim"], e["gbps"],
                                                       100 * e["of_copy"]))
    if hash_grid:
        lines += ["", "Hash table, 2^30 keys/s, 1M keys per call, 2^26 slots (HierarchicalKV on "
                  "an H200: dim 8 load 0.5 find 4.02 / find_or_insert 2.30 / insert_or_assign "
                  "2.26; dim 64: 3.65 / 1.92 / 1.88):", "",
                  "| load | dim | find | find_or_insert | insert_or_assign |",
                  "|---|---|---|---|---|"]
        for e in hash_grid["grid"]:
            lines.append("| %.2f | %d | %.2f | %.2f | %.2f |" % (
                e["load"], e["dim"], e["find"]["gkeys_per_s"], e["find_or_insert"]["gkeys_per_s"],
                e["insert_or_assign"]["gkeys_per_s"]))
    cpu = summary["cpu"]
    if cpu:
        lines += ["", "CPU graph step (2 cores; target <= 1.2x native TF): sok1x %.1f ms, native "
                  "TF %.1f ms (%.2fx). Weak scaling: %s." % (
                      cpu["sok1x_ms"], cpu["native_ms"], cpu["sok1x_vs_native"], ", ".join(
                          "%s ranks %.0f%%" % (n, 100 * e)
                          for n, e in cpu["weak_scaling"].items()))]
    return "\n".join(lines) + "\n"


def plot(path, summary, hash_grid):
    import matplotlib
    import matplotlib.ticker
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(2, 2, figsize=(12, 9))
    ax = axes[0][0]
    for (workload, layer), style in ((("dlrm", "dense"), "o-"), (("seed", "dense"), "s--")):
        for variant, color in (("sok1x_device", "C0"), ("sok1x_api", "C2")):
            points = sorted((e["ranks"], e["ms"], e["torch_ms"]) for e in summary["step_vs_torch"]
                            if e["workload"] == workload and e["layer"] == layer
                            and e["variant"] == variant)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color,
                        label="%s %s %s" % (workload, layer, variant))
                if variant == "sok1x_device":
                    ax.plot([p[0] for p in points], [p[2] for p in points], style, color="C3",
                            label="%s %s PyTorch" % (workload, layer))
    ax.set(xscale="log", yscale="log")
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set(xticks=[1, 2, 4], xticklabels=["1", "2", "4"],
           xlabel="GPUs", ylabel="ms per step", title="Training step (fwd + bwd + LazyAdam)")
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for layer, variant, color in (("dense", "sok1x_device", "C0"), ("dense", "torch", "C3"),
                                  ("sparse", "sok1x_device", "C1"), ("dense", "sok1x_api", "C2")):
        points = sorted((e["ranks"], e["efficiency"]) for e in summary["weak_scaling"]
                        if e["layer"] == layer and e["variant"] == variant)
        ax.plot([p[0] for p in points], [100 * p[1] for p in points], "o-", color=color,
                label="DLRM %s %s" % (layer, variant))
    if summary["cpu"]:
        points = sorted((int(n), e) for n, e in summary["cpu"]["weak_scaling"].items())
        ax.plot([p[0] for p in points], [100 * p[1] for p in points], "k^:",
                label="CPU sok1x (2 cores)")
    ax.axhline(85, color="grey", lw=0.8, ls="--")
    ax.set(xticks=[1, 2, 4], xlabel="GPUs / ranks", ylabel="% (T1 / TN)",
           title="Weak scaling", ylim=(0, 110))
    ax.legend(fontsize=7)
    ax = axes[1][0]
    labels, values = [], []
    for e in summary["gather"]:
        labels.append("%s d%d" % (e["op"].replace("scatter_add", "scat+"), e["dim"]))
        values.append(100 * e["of_copy"])
    for e in summary["exchange"]:
        labels.append("a2a %dG %gM" % (e["ranks"], e["mib_per_rank"]))
        values.append(100 * e["engine_vs_raw"])
    ax.bar(range(len(values)), values, color=["C0"] * len(summary["gather"]) +
           ["C1"] * len(summary["exchange"]))
    ax.set_xticks(range(len(values)))
    ax.set_xticklabels(labels, rotation=70, fontsize=7)
    ax.axhline(75, color="C0", lw=0.8, ls="--")
    ax.axhline(90, color="C1", lw=0.8, ls="--")
    ax.set(ylabel="%", title="% of limits: rows vs D2D copy, all-to-all vs raw NCCL")
    ax = axes[1][1]
    if hash_grid:
        for op, color in (("find", "C0"), ("find_or_insert", "C1"), ("insert_or_assign", "C2")):
            for load, style in ((0.5, "o-"), (0.9, "x:")):
                points = [(e["dim"], e[op]["gkeys_per_s"]) for e in hash_grid["grid"]
                          if e["load"] == load]
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color,
                        label="%s load %.1f" % (op, load))
        hkv = ((8, "find", 4.02, "C0"), (64, "find", 3.65, "C0"), (8, "find_or_insert", 2.30, "C1"),
               (64, "find_or_insert", 1.92, "C1"), (8, "insert_or_assign", 2.26, "C2"),
               (64, "insert_or_assign", 1.88, "C2"))
        for dim, _, hkv_figure, color in hkv:
            ax.plot([dim], [hkv_figure], "*", color=color, markersize=12)
        ax.set(xscale="log")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set(xticks=[8, 32, 64, 128], xticklabels=["8", "32", "64", "128"],
               xlabel="dim", ylabel="2^30 keys/s", title="Hash table (stars: HierarchicalKV, "
               "load 0.5)")
        ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv):
    parser = harness.parser(__doc__)
    parser.add_argument("--name", required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--hash", required=True)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--rows-label", default="installed")
    parser.add_argument("--cpu", default=None)
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    steps_by_ranks = {}
    for n in (1, 2, 4, 8):
        payload = load(args.steps, "w%d.json" % n)
        if payload:
            steps_by_ranks[n] = payload
    hash_grid = load(args.hash, "hash.json")
    rows = load(args.rows, "rows.json")
    cpu = {}
    if args.cpu:
        for n in (1, 2, 4):
            payload = load(args.cpu, "cpu%d.json" % n)
            if payload:
                cpu[n] = payload
    summary = summarise(steps_by_ranks, hash_grid, rows, args.rows_label, cpu)
    merged = {"name": args.name, "note": args.note, "summary": summary,
              "steps": {str(n): p for n, p in steps_by_ranks.items()}, "hash": hash_grid,
              "rows": rows, "cpu": {str(n): p for n, p in cpu.items()},
              "sources": {"steps": args.steps, "hash": args.hash, "rows": args.rows,
                          "rows_label": args.rows_label, "cpu": args.cpu}}
    base = os.path.join(RESULTS, args.name)
    harness.write_json(base + ".json", merged)
    with open(base + ".md", "w") as handle:
        handle.write(markdown(args.name, summary, hash_grid))
        if args.note:
            handle.write("\n" + args.note + "\n")
    plot(base + ".png", summary, hash_grid)
    print("wrote %s.json, .md, .png" % base)


if __name__ == "__main__":
    main(sys.argv[1:])
