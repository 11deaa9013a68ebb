"""Where the project's own files are: a checkout (editable install) or an installed wheel.

The data (`data/azure`, `data/prompts`) and the shipped serve configs live at the top of the
repository. In a checkout they are read from there; a wheel carries copies of them as package
data under `wattwise/_resources/` (setup.py's build step copies them in), read with
`importlib.resources`. The checkout wins when both exist, so an edited serve_config.yaml is
the one that runs.
"""

from __future__ import annotations

import atexit
import contextlib
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Top-level files and folders a wheel carries as package data (setup.py copies these).
SHIPPED = ("serve_config.yaml", "serve_config.cpu.yaml", "serve_config.gpu.yaml",
           "serve_config.splitwise.yaml", "data")
RESOURCES = "_resources"

_extracted = contextlib.ExitStack()
atexit.register(_extracted.close)


def shipped(relative: str) -> Path:
    """The path of a shipped file (e.g. 'data/azure/x.csv', 'serve_config.yaml').

    The checkout's copy if this module runs from one, else the installed package data.
    Raises FileNotFoundError naming both places when neither has it.
    """
    local = ROOT / relative
    if local.exists():
        return local
    packaged = resources.files("wattwise").joinpath(RESOURCES, *relative.split("/"))
    if packaged.is_file() or packaged.is_dir():
        if isinstance(packaged, Path):
            return packaged
        return _extracted.enter_context(resources.as_file(packaged))  # zipped installs
    raise FileNotFoundError(f"{relative}: neither in the checkout ({local}) nor in the installed "
                            f"package data (wattwise/{RESOURCES}/{relative})")


def _lazy(relative: str) -> Path:
    """The path when it exists, else the checkout's (a missing file fails where it is read)."""
    try:
        return shipped(relative)
    except FileNotFoundError:
        return ROOT / relative


SERVE_CONFIG = _lazy("serve_config.yaml")
DATA = _lazy("data")
