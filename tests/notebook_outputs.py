"""How the tests run an example notebook: top to bottom in a real Jupyter kernel of this interpreter
(nbclient), and, for the searching tests, everything the cells showed as one text."""
from __future__ import annotations

import json
from pathlib import Path

from conftest import REPO


def execute_notebook(name: str, tmp_path: Path, timeout: float = 240):
    """Execute ``notebooks/NAME`` in a fresh kernel (ipykernel's ``python3`` spec, whose ``python`` jupyter_client
    runs as this interpreter; working directory ``tmp_path``, ``timeout`` seconds per cell) and return the
    executed notebook (nbformat). Blocking; raises nbclient's ``CellExecutionError`` at the first cell that
    fails and is not tagged ``raises-exception``; the kernel is shut down when execution ends."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    km = KernelManager(kernel_name="python3")
    NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def notebook_outputs(name: str, tmp_path: Path, timeout: float = 240) -> str:
    """:func:`execute_notebook`, then fail if any cell's output is an error; return every output's ``text`` and
    its ``data`` (as JSON), one output per line, in cell order."""
    nb = execute_notebook(name, tmp_path, timeout)
    texts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            assert o.get("output_type") != "error", o
            texts.append(o.get("text", "") + json.dumps(o.get("data", {})))
    return "\n".join(texts)
