"""Issue 42's split of measurements from studies: ``benchmarks/`` holds at most 8 speed and
cost scripts, each named in the performance page; every study in ``experiments/`` is listed
with its command in the experiments index; no page cites a script where it no longer is; and
the studies record the command that made each result."""

import ast
import re
from pathlib import Path

from grassflow_paper import provenance

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_are_few_and_each_says_what_it_measures_and_where_it_is_documented():
    """Catches a study added to `benchmarks/` again (a ninth script), a benchmark whose
    docstring does not open with one line saying what it measures, or one that the performance
    page does not name."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert 1 <= len(scripts) <= 8, [p.name for p in scripts]
    page = (ROOT / "docs" / "performance.md").read_text()
    for path in scripts:
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        assert doc, path
        first, _, rest = doc.partition("\n")
        assert first.rstrip().endswith((".", "?")) and (not rest or rest.startswith("\n")), path
        assert f"benchmarks/{path.name}" in page, path


def test_every_study_is_in_the_experiments_index_and_readme():
    """Catches a study script in `experiments/` that the docs' table of studies (where it is,
    its command, its result) or `experiments/README.md` leaves out."""
    index = (ROOT / "docs" / "experiments" / "index.md").read_text()
    readme = (ROOT / "experiments" / "README.md").read_text()
    studies = sorted((ROOT / "experiments").rglob("*.py"))
    assert len(studies) >= 17
    for path in studies:
        name = path.relative_to(ROOT).as_posix()
        assert name in index, name
        assert path.relative_to(ROOT / "experiments").as_posix() in readme, name


def test_no_page_or_docstring_cites_a_script_that_left_benchmarks():
    """Catches a docs page, docstring, tool or example naming `benchmarks/X.py` for a study
    that moved to `experiments/` (or a benchmark that was removed). Result files and the
    changelog keep such names on purpose: they say what was run at the time."""
    kept = {p.name for p in (ROOT / "benchmarks").glob("*.py")}
    files = [*(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py"),
             *(ROOT / "tools").rglob("*.py"), *(ROOT / "examples").rglob("*.py"),
             *(ROOT / "experiments").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]  # fmt: skip
    stale = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in re.findall(r"benchmarks/(\w+\.py)", path.read_text())
        if name not in kept
    ]
    assert stale == []


def test_the_recorded_command_is_the_one_typed(monkeypatch):
    """Catches a recorded command that loses an argument's quoting, the environment that
    chose the source tree and threads, or the script's path from the repository root."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PYTHONPATH", "src")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    argv = [str(ROOT / "experiments/two_part/gram_bound.py"), "--settings", "16 Wisharts, 64 x 2"]
    assert provenance.command(argv) == (
        "PYTHONPATH=src python experiments/two_part/gram_bound.py --settings '16 Wisharts, 64 x 2'"
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert provenance.command(["benchmarks/x.py"]).startswith("PYTHONPATH=src OMP_NUM_THREADS=1 ")


def test_made_by_lists_each_command_once_and_says_which_were_written_by_hand():
    """Catches a "Made by" block that repeats a command per row, drops a row's command, or
    passes off a command written by hand (with `made_at`) as recorded."""
    one = [{"command": "python a.py"}, {"command": "python a.py"}]
    assert provenance.made_by(one) == "Made by: `python a.py`\n\n"
    two = [{"command": "python a.py"}, {"command": "python b.py", "made_at": "abc1234"}]
    text = provenance.made_by(two)
    assert text.startswith("Made by:\n\n- `python a.py`\n- `python b.py` (at commit abc1234)\n")
    assert "by hand" in text and text.endswith("\n\n")
