"""Every example notebook under ``notebooks/`` is a valid nbformat 4.5 file, each cell with its id (nbformat
warns about missing ids today and will refuse them), and the test suite executes each of them."""
from __future__ import annotations

import json

import nbformat
import pytest

from conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_valid_with_cell_ids(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)   # raises ValidationError
    assert (nb.nbformat, nb.nbformat_minor) >= (4, 5), path.name
    ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]   # as stored (nbformat.read adds missing ids)
    assert all(ids) and len(set(ids)) == len(ids), f"{path.name}: cells without an id or with the same id"


def test_every_notebook_is_executed_by_a_test():
    named = "\n".join(p.read_text() for p in (REPO / "tests").glob("test_*.py"))
    named += "\n".join(p.read_text() for p in (REPO / "tests").glob("notebook_*.py"))
    missing = [p.name for p in NOTEBOOKS if p.name not in named]
    assert NOTEBOOKS and not missing, f"notebooks no test executes: {missing}"
