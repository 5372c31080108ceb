"""The few lines both Python test scripts share: named checks counted, a case that raises counts
as a failure with its traceback, and JSON loading. No pytest needed."""
import json
import traceback


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

    def run_case(self, name, fn):
        try:
            fn()
        except Exception:
            self.check(name, False, "raised:\n" + traceback.format_exc())


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
