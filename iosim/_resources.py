"""Where the data folders `kernels/` and `scenarios/` live, installed or not.

A wheel carries them inside the package as ``iosim/_data/<name>`` (see pyproject.toml); a source
checkout or an editable install has them at the repository's top level, beside ``iosim/``.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the folder ``kernels`` or ``scenarios`` from any working directory."""
    if name not in ("kernels", "scenarios"):
        raise ValueError(f"unknown data folder {name!r}: expected 'kernels' or 'scenarios'")
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"iosim's data folder {name!r} is missing: looked in {_PACKAGE / '_data' / name} and "
        f"{_PACKAGE.parent / name}; reinstall iosim (pip install .)"
    )


def kernels_dir() -> Path:
    return data_dir("kernels")


def scenarios_dir() -> Path:
    return data_dir("scenarios")
