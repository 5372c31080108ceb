"""The few lines both Python test scripts share: named checks counted, a case that raises counts
as a failure with its traceback, and JSON loading. No pytest needed."""
import json
import os
import traceback


def in_ci():
    return os.environ.get("CI", "") not in ("", "0", "false")


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, cond, detail=""):
        if cond:
            self.passed += 1
            print("ok    %s" % name)
        else:
            self.failed += 1
            print("FAIL  %s %s" % (name, detail))

    def skip(self, name, why):
        """A check that cannot run here. In CI that is a failure: scripts/setup.sh must provide
        what every check needs (the Rust tests' CI_ALLOWED_SKIPS lists the only exceptions,
        and none concerns these scripts)."""
        if in_ci():
            self.check(name, False, "skipped in CI (%s): scripts/setup.sh must provide it" % why)
        else:
            print("skip  %s (%s)" % (name, why))

    def run_case(self, name, fn):
        try:
            fn()
        except Exception:
            self.check(name, False, "raised:\n" + traceback.format_exc())


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
