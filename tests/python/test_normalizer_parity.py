#!/usr/bin/env python3
"""Parity of our text normaliser (src/text/tn, a Rust port of damga 1.0.5's run time) with damga's
own Python, on every written form of the two upstream test sets.

    cargo build
    .onebit/venv/bin/python tests/python/test_normalizer_parity.py target/debug/onebit-tts

For en, de, fr and es, every `written` of NeMo's test cases (.onebit/tn/tests/nemo/<lang>/, as
kitten-text-processing 0.1.0 ships them) and of damga's golden (.onebit/tn/tests/damga/<lang>/tn.tsv)
goes through `damga.TextNormalizer(lang=...).normalize` (the venv's damga 1.0.5) and through
`onebit-tts normalize --lines --grammar --lang <lang>` (the grammars' own output, before what they
did not read is put back as written); the two outputs must be the same string.

The only allowed differences are our own overrides of damga's readings (src/text/tn/en.rs, de.rs),
each pinned below in EXPECTED with the output we give instead, so a row there still fails when
our output changes. Prints per-language counts; exits non-zero on any unexplained mismatch (the
first 20 listed) or on an expectation that no longer applies.
"""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import in_ci  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (our language tag, damga's language, the test sets' folder name)
LANGUAGES = [("en-us", "en", "en"), ("de", "de", "de"), ("fr-fr", "fr", "fr"), ("es", "es", "es")]

# Where our output differs from damga's on purpose: (language, input) -> (our output, why). Only
# rows of the two test sets that one of our overrides changes; each pins our exact output.
US_DATE = ("en-us date override (src/text/tn/en.rs US_DATE): a numeric date is month first in the "
           "US; damga reads it day first, or leaves it unread where that cannot be a date")
DE_DATE = ("German date override (src/text/tn/de.rs OV_NUM_DATE): a numeric date is said with its "
           "month's name; damga says the month as an ordinal (\"zweiten dritten\")")
DE_YEAR = ("German year override (src/text/tn/de.rs OV_YEAR): a year from 2020 on is \"zweitausend...\"; "
           "damga reads it \"zwanzig zwanzig\", which German does not say")
EXPECTED = {
    ("en-us", "10/06/2005"): ("October sixth two thousand and five", US_DATE),
    ("en-us", "11/17/05"): ("November seventeenth two thousand and five", US_DATE),
    ("en-us", "01/07/98"): ("January seventh nineteen ninety eight", US_DATE),
    ("en-us", "3/4/1998"): ("March fourth nineteen ninety eight", US_DATE),
    ("en-us", "06/12/2012"): ("June twelfth two thousand twelve", US_DATE),
    ("de", "02.03.2003"): ("zweiten März zweitausenddrei", DE_DATE),
    ("de", "2.3.2003"): ("zweiten März zweitausenddrei", DE_DATE),
    ("de", "03.10.2012"): ("dritten Oktober zweitausendzwölf", DE_DATE),
    ("de", "Im Jahr 2020"): ("Im Jahr zweitausendzwanzig", DE_YEAR),
    ("de", "bis 2030"): ("bis zweitausenddreißig", DE_YEAR),
}
# Our third override, numbered streets ("42nd St." -> "Street", en.rs ORDINAL_STREET), changes no
# row of either set, so it has no entry.

SHOWN = 20


def tests_dir():
    """.onebit/tn/tests (ONEBIT_HOME's first when set), which scripts/setup.sh --build-tools fills."""
    homes = []
    if os.environ.get("ONEBIT_HOME"):
        homes.append(os.environ["ONEBIT_HOME"])
    homes.append(os.path.join(ROOT, ".onebit"))
    for home in homes:
        d = os.path.join(home, "tn", "tests")
        if os.path.isfile(os.path.join(d, ".complete")):
            return d
    return None


DIGIT = re.compile(r"\d")


def nemo_file(path):
    """One NeMo test-case file: (written forms, or None for `~written` blocks) and rows.

    `test_cases_normalize_with_audio.txt` is `~written` followed by its accepted spoken forms, one a
    line (NeMo's get_test_cases_multiple drops the "~"s): its written forms are returned as they are.
    The other files are `written~spoken[~spoken...]`, except that the German ones are NeMo's
    inverse-normalisation cases, `spoken~written`: the side holding digits in more rows is the
    written one, and a file without such evidence follows its language's other files."""
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    if os.path.basename(path) == "test_cases_normalize_with_audio.txt":
        return [line.lstrip("~").strip() for line in lines if line.startswith("~")], None, None
    rows = [line.split("~") for line in lines if "~" in line]
    left = sum(1 for r in rows if DIGIT.search(r[0]) and not DIGIT.search(r[-1]))
    right = sum(1 for r in rows if DIGIT.search(r[-1]) and not DIGIT.search(r[0]))
    return None, rows, (None if left == right else right > left)


def inputs(base, folder):
    """Every written form of both sets for a language, in file order, without repeats."""
    nemo = os.path.join(base, "nemo", folder)
    parsed = [nemo_file(os.path.join(nemo, name)) for name in sorted(os.listdir(nemo))
              if name.startswith("test_cases_") and name.endswith(".txt")]
    votes = [rev for _, rows, rev in parsed if rows is not None and rev is not None]
    majority = sum(votes) * 2 > len(votes)
    out = []
    for written, rows, rev in parsed:
        if written is not None:
            out.extend(written)
            continue
        rev = majority if rev is None else rev
        out.extend(r[-1] if rev else r[0] for r in rows)
    with open(os.path.join(base, "damga", folder, "tn.tsv"), encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line and not line.startswith("#") and "\t" in line:
                out.append(line.split("\t", 1)[0])
    seen = set()
    return [s for s in out if not (s in seen or seen.add(s))]


def ours(binary, lang, texts):
    """`onebit-tts normalize --lines`: one output line per input line, grammars loaded once."""
    for t in texts:
        assert "\n" not in t and "\r" not in t, t
    res = subprocess.run(
        [binary, "normalize", "--lines", "--grammar", "--lang", lang],
        input="".join(t + "\n" for t in texts),
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=600,
    )
    if res.returncode != 0:
        sys.exit("onebit-tts normalize failed (exit %d):\n%s" % (res.returncode, res.stderr))
    lines = res.stdout.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(texts):
        sys.exit("onebit-tts normalize gave %d lines for %d inputs" % (len(lines), len(texts)))
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    if not os.access(binary, os.X_OK):
        sys.exit("FAIL  normalizer parity: no onebit-tts binary at %s (cargo build first)" % binary)
    t0 = time.time()
    base = tests_dir()
    if base is None:
        why = "no .onebit/tn/tests: run scripts/setup.sh --build-tools"
        if in_ci():
            sys.exit("FAIL  normalizer parity: skipped in CI (%s): scripts/setup.sh must provide it" % why)
        print("skip  normalizer parity (%s)" % why)
        return
    from damga import TextNormalizer, __version__

    if __version__ != "1.0.5":
        sys.exit("FAIL  normalizer parity: the venv has damga %s, not 1.0.5" % __version__)

    unexplained = []
    used = set()
    stale = []
    for lang, damga_lang, folder in LANGUAGES:
        texts = inputs(base, folder)
        tn = TextNormalizer(lang=damga_lang)
        theirs = [tn.normalize(t) for t in texts]
        mine = ours(binary, lang, texts)
        same = expected = 0
        for text, d, o in zip(texts, theirs, mine):
            if d == o:
                same += 1
                if (lang, text) in EXPECTED:
                    stale.append("%s %r: damga now gives what EXPECTED pins (%r)" % (lang, text, o))
                continue
            want = EXPECTED.get((lang, text))
            if want is not None:
                used.add((lang, text))
                if o == want[0]:
                    expected += 1
                    print("  %s override %r: damga %r, ours %r (%s)" % (lang, text, d, o, want[1]))
                    continue
            unexplained.append((lang, text, d, o, want))
        bad = len(texts) - same - expected
        print("%-5s %4d inputs: %4d identical, %2d intended overrides, %2d unexplained"
              % (lang, len(texts), same, expected, bad))
    for key in EXPECTED:
        if key not in used and not any(s.startswith("%s %r" % key) for s in stale):
            stale.append("%s %r: not among the inputs any more" % key)
    for line in stale:
        print("STALE " + line)
    for lang, text, d, o, want in unexplained[:SHOWN]:
        print("MISMATCH %s\n  input  %r\n  damga  %r\n  ours   %r" % (lang, text, d, o))
        if want is not None:
            print("  EXPECTED pins ours as %r (%s)" % want)
    if len(unexplained) > SHOWN:
        print("... and %d more" % (len(unexplained) - SHOWN))
    ok = not unexplained and not stale
    print("normalizer parity: %s, %d unexplained mismatches (%.1f s)"
          % ("ok" if ok else "FAIL", len(unexplained), time.time() - t0))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
