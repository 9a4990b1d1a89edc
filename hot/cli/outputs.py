"""Output folders of demo, train and memory: never overwrite a user's results, never leave a
half-written file.

A command first claims the files it will write (``claim``): if any already exists it stops
before any work, unless --overwrite is given. The folder itself is created only when the
first file is written, and every file is written to a temporary name in the same folder and
then renamed over the target, so an interrupted write leaves the previous file intact.
"""

from __future__ import annotations

import csv
import io
import os
import pathlib
from typing import Callable, Iterable

import torch

from .common import CLIError


def add_overwrite_flag(p) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace results an earlier run left in the output folder (without it, "
                        "the command stops before doing anything)")


def claim(out: pathlib.Path, names: Iterable[str], overwrite: bool, *, flag: str = "--out",
          keep: Iterable[pathlib.Path] = ()) -> None:
    """Check that the files ``names`` in folder ``out`` can be written: ``out`` is a folder or
    does not exist yet, and none of the files exists (``overwrite`` allows replacing them;
    paths in ``keep`` may be replaced anyway: a checkpoint a resumed run continues)."""
    if out.exists() and not out.is_dir():
        raise CLIError(f"{flag} {out}: this is a file, not a folder; give a folder for the "
                       f"results.")
    _check_creatable(out, flag)
    if overwrite:
        return
    kept = {pathlib.Path(k).resolve() for k in keep}
    taken = [n for n in names if (out / n).exists() and (out / n).resolve() not in kept]
    if taken:
        raise CLIError(f"{flag} {out} already holds {', '.join(taken)} from an earlier run; "
                       f"give another {flag} folder, or --overwrite to replace them.")


def _check_creatable(out: pathlib.Path, flag: str) -> None:
    """CLIError unless ``out`` (a folder, perhaps not there yet) can be created and written:
    its nearest existing ancestor must be a writable folder. Checked before any work, so that a
    bad path does not surface only when the first result is written."""
    anc = out.absolute()
    while not anc.exists():
        anc = anc.parent
    if not anc.is_dir():
        raise CLIError(f"{flag} {out}: {anc} is a file, so the folder cannot be created there; "
                       f"give a folder path.")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {out}: {anc} is not writable; give a folder you can write to.")


def atomic(path: pathlib.Path, write: Callable[[str], None]) -> None:
    """Create ``path``'s folder if needed, call ``write(tmp)`` with a temporary path beside
    ``path``, then rename it to ``path``; on any failure the temporary file is removed and a
    previous ``path`` is left as it was."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Opened by name (not mkstemp) so that the file gets the usual umask permissions.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, then rename)."""
    def w(tmp):
        with open(tmp, "w", newline="") as f:
            f.write(text)
    atomic(path, w)


def csv_text(rows: Iterable[dict], fields: list[str]) -> str:
    """``rows`` as CSV with the header ``fields`` (the per-epoch metrics.csv of hot train)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def save(obj, path: pathlib.Path) -> None:
    """torch.save ``obj`` to ``path`` atomically (temporary file, then rename)."""
    atomic(path, lambda tmp: torch.save(obj, tmp))
