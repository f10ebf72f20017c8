"""Prints the latest result of each run over the result folders of run.py given (later folders
win): the totals, the passes per group (v1, v1-horovod, tf1, tf2) and rank count, then each
failed run with its last error line.

    python scripts/sok_scripts/summarize.py OUTDIR [OUTDIR...]
"""
import sys
latest = {}
for folder in sys.argv[1:]:
    try:
        lines = open(folder + "/results.tsv").read().splitlines()
    except OSError:
        continue
    for line in lines:
        parts = line.split("\t")
        latest[int(parts[0])] = parts
passed = sum(1 for p in latest.values() if p[3] == "PASS")
print("runs %d, passed %d" % (len(latest), passed))
for group in sorted({(p[1].split("/")[0], p[2]) for p in latest.values()}):
    runs = [p for p in latest.values() if (p[1].split("/")[0], p[2]) == group]
    print("  %s %s: %d of %d" % (group[0], group[1], sum(p[3] == "PASS" for p in runs),
                                 len(runs)))
for index in sorted(latest):
    p = latest[index]
    if p[3] != "PASS":
        print(index, p[1][:70], p[2], p[5][:150])
