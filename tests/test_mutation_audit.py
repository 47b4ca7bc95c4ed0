"""The mutation audit stays runnable: each planted bug's text is in today's code once."""

from pathlib import Path

import mutation_audit

SRC = Path(__file__).resolve().parents[1] / "src"


def test_every_planted_bug_still_finds_its_text_once():
    """Catches an audit that rots: code edited so that a mutation's text is gone or appears
    twice (the audit then stops with an error at that bug and checks none after it), or a
    mutation that changes nothing or names a test file that does not exist."""
    stale = []
    for name, (path, old, new, tests) in mutation_audit.MUTATIONS.items():
        count = (SRC / path).read_text().count(old)
        missing = [t for t in tests if not (SRC.parent / t).exists()]
        if count != 1 or old == new or missing:
            stale.append(f"{name}: found {count} times, tests missing {missing}")
    assert stale == []
