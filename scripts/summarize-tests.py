#!/usr/bin/env python3
"""Counts test cases over meson's tests (TAP, or gst-check's summary line), pytest's JUnit XML and
the fuzz targets' results; prints one summary line.

    summarize-tests.py TESTLOG_JSON PYTEST_XML [--meson SUITE=TESTLOG_JSON]... [--fuzz DIR]

A meson test is counted by its TAP lines; one that died without reporting a failing case (a crash,
a timeout, a sanitizer report at exit) counts as one failure more, so nothing that failed can read
as passed. --meson adds another meson run of the same tests (the sanitizer build): its cases count
on their own and its failures are named SUITE/test. --fuzz reads the one-line JSON results
tests/fuzz/run.sh writes; each fuzz target's run counts as one test case, and a results directory
that lacks one is a failure."""
import argparse
import json
import os
import re
import xml.etree.ElementTree as ET


class Counts:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0
        self.failures = []

    def fail(self, name, n=1):
        self.failed += n
        self.failures.append(name)


def count_meson(path, counts, suite=None):
    prefix = f"{suite}/" if suite else ""
    if not os.path.exists(path):
        counts.fail(f"{prefix}(no test log at {path})")
        return
    with open(path) as log:
        for line in log:
            test = json.loads(line)
            ok = not_ok = skip = 0
            stdout = test.get("stdout") or ""
            # gst-check (libcheck): "100%: Checks: 5, Failures: 0, Errors: 0"
            check = re.search(r"Checks: (\d+), Failures: (\d+), Errors: (\d+)", stdout)
            if check:
                total, check_failures, check_errors = map(int, check.groups())
                ok, not_ok = total - check_failures - check_errors, check_failures + check_errors
            for out in stdout.splitlines() if not check else ():
                if re.match(r"^ok \d+", out):
                    if re.search(r"#\s*SKIP", out, re.I):
                        skip += 1
                    else:
                        ok += 1
                elif re.match(r"^not ok \d+", out):
                    if re.search(r"#\s*TODO", out, re.I):
                        skip += 1
                    else:
                        not_ok += 1
            if test["result"] not in ("OK", "SKIP", "EXPECTEDFAIL") and not_ok == 0:
                not_ok = 1
            if test["result"] == "SKIP" and ok + not_ok + skip == 0:
                skip = 1
            counts.passed += ok
            counts.skipped += skip
            if not_ok:
                counts.fail(prefix + test["name"], not_ok)


def count_junit(path, counts):
    root = ET.parse(path).getroot()
    for suite in root.iter("testsuite"):
        tests = int(suite.get("tests", 0))
        f = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        s = int(suite.get("skipped", 0))
        counts.passed += tests - f - s
        counts.failed += f
        counts.skipped += s
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                counts.failures.append(f'{case.get("classname")}::{case.get("name")}')


def count_fuzz(directory, counts):
    names = sorted(n for n in os.listdir(directory) if n.endswith(".json")) \
        if os.path.isdir(directory) else []
    if not names:
        counts.fail(f"fuzz/(no results in {directory})")
    for name in names:
        with open(os.path.join(directory, name)) as f:
            result = json.load(f)
        if result.get("ok") is True:
            counts.passed += 1
        else:
            counts.fail(f'fuzz/{result.get("name", name)}')


parser = argparse.ArgumentParser()
parser.add_argument("testlog")
parser.add_argument("junit")
parser.add_argument("--meson", action="append", default=[], metavar="SUITE=TESTLOG_JSON")
parser.add_argument("--fuzz", metavar="DIR")
args = parser.parse_args()

counts = Counts()
count_meson(args.testlog, counts)
count_junit(args.junit, counts)
for extra in args.meson:
    suite, _, path = extra.partition("=")
    count_meson(path, counts, suite)
if args.fuzz:
    count_fuzz(args.fuzz, counts)

for name in counts.failures:
    print(f"FAILED {name}")
line = f"{counts.passed} passed, {counts.failed} failed"
if counts.skipped:
    line += f", {counts.skipped} skipped"
print(line)
raise SystemExit(1 if counts.failed else 0)
