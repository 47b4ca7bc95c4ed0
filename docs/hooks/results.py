"""mkdocs hook: serve the repository's ``results/`` tree at ``results/`` in the site.

Pages link figures as ``../results/...``; the files stay where the commands wrote them (no
copies in git under ``docs/``), and strict mode can still check every link.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

_ROOT = Path(__file__).resolve().parents[2]
_RESULTS = _ROOT / "results"


class _ResultFile(File):
    """A static file, whatever its extension (``results/*.md`` are data, not pages)."""

    def is_documentation_page(self) -> bool:
        return False


def on_files(files: Files, config) -> Files:
    for path in sorted(_RESULTS.rglob("*")):
        if path.is_file():
            uri = path.relative_to(_ROOT).as_posix()
            files.append(
                _ResultFile(uri, str(_ROOT), config["site_dir"], config["use_directory_urls"])
            )
    return files
