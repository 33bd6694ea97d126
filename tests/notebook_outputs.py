"""One way the distributed-array tests run an example notebook: top to bottom in a real Jupyter kernel of this
interpreter (nbclient), no cell may fail, and everything the cells showed comes back as one text to search."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from conftest import REPO


def notebook_outputs(name: str, tmp_path: Path, timeout: float = 240) -> str:
    """Execute ``notebooks/NAME`` in a fresh kernel (``sys.executable -m ipykernel_launcher``, working directory
    ``tmp_path``, ``timeout`` seconds per cell); fail if any cell's output is an error; return every output's
    ``text`` and its ``data`` (as JSON), one output per line, in cell order. Blocking; the kernel is shut down
    when execution ends."""
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    km = KernelManager(kernel_cmd=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"])
    NotebookClient(nb, km=km, timeout=timeout, resources={"metadata": {"path": str(tmp_path)}}).execute()
    texts = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            assert o.get("output_type") != "error", o
            texts.append(o.get("text", "") + json.dumps(o.get("data", {})))
    return "\n".join(texts)
