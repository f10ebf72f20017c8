"""Prints one closing line, 'total: N passed, N failed, N skipped', over JUnit XML files.

    python junit_total.py [--label LABEL] FILE...

With --label the line starts with LABEL instead of 'total' (one lane's line). A file that is
missing or unreadable (a job that aborted before writing it) counts as one failure. Exits 1 when
anything failed."""
import sys
import xml.etree.ElementTree as ElementTree


def count(paths):
    """Returns (passed, failed, skipped) over the JUnit files `paths`, printing a line for each
    file that holds no results."""
    passed = failed = skipped = 0
    for path in paths:
        try:
            root = ElementTree.parse(path).getroot()
        except (OSError, ElementTree.ParseError):
            print("no results in %s (the job ended before writing them)" % path)
            failed += 1
            continue
        for suite in root.iter("testsuite"):
            tests = int(suite.get("tests", 0))
            bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            skip = int(suite.get("skipped", 0))
            passed += tests - bad - skip
            failed += bad
            skipped += skip
    return passed, failed, skipped


def main(args):
    label = "total"
    if args[:1] == ["--label"]:
        label, args = args[1], args[2:]
    passed, failed, skipped = count(args)
    print("%s: %d passed, %d failed, %d skipped" % (label, passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
