#!/usr/bin/env python3
"""Counts test cases over meson's tests (TAP, or gst-check's summary line) and pytest's JUnit
XML; prints one summary line.

A meson test is counted by its TAP lines; one that died without reporting a failing case (a crash,
a timeout) counts as one failure more, so nothing that failed can read as passed."""
import json
import re
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
failures = []

with open(sys.argv[1]) as log:
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
        passed += ok
        failed += not_ok
        skipped += skip
        if not_ok:
            failures.append(test["name"])

root = ET.parse(sys.argv[2]).getroot()
for suite in root.iter("testsuite"):
    tests = int(suite.get("tests", 0))
    f = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    s = int(suite.get("skipped", 0))
    passed += tests - f - s
    failed += f
    skipped += s
    for case in suite.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failures.append(f'{case.get("classname")}::{case.get("name")}')

for name in failures:
    print(f"FAILED {name}")
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed else 0)
