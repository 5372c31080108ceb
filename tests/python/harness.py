"""The few lines the Python test scripts share: named checks counted, a case that raises counts
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


class Cases:
    """Named cases run against a live server: each is a function that returns an optional detail
    or raises. One line per case ("PASS name (detail)", or "FAIL name" and the traceback), then
    "N passed, M failed", which the Rust tests read."""

    def __init__(self):
        self.results = []

    def _report(self, name, detail, ok):
        self.results.append(ok)
        if ok:
            print(f"PASS {name}" + (f" ({detail})" if detail else ""), flush=True)
        else:
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()

    def check(self, name, fn):
        try:
            detail = fn()
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            self._report(name, None, False)
        else:
            self._report(name, detail, True)

    async def check_async(self, name, fn):
        try:
            detail = await fn()
        except Exception:  # noqa: BLE001 - every failure is reported, then counted
            self._report(name, None, False)
        else:
            self._report(name, detail, True)

    def finish(self):
        """Prints the summary; the exit status: 1 on any failure."""
        passed = sum(self.results)
        failed = len(self.results) - passed
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)
