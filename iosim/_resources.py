"""Where the data folders `kernels/`, `scenarios/`, the validation records and the benchmark records live,
installed or not.

A wheel carries them inside the package as ``iosim/_data/<name>`` (see pyproject.toml); a source
checkout or an editable install has them in the repository, beside ``iosim/``: ``kernels/``, ``scenarios/``,
``docs/validation/`` (the per-device records the report reads) and ``docs/benchmarks/`` (the committed CPU
measurement the report's "Attention on a CPU" section shows).
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


_IN_CHECKOUT = {"kernels": "kernels", "scenarios": "scenarios", "validation": "docs/validation",
                "benchmarks": "docs/benchmarks"}


def data_dir(name: str) -> Path:
    """Return the folder ``kernels``, ``scenarios``, ``validation`` or ``benchmarks`` from any working directory."""
    if name not in _IN_CHECKOUT:
        raise ValueError(f"unknown data folder {name!r}: expected one of {', '.join(map(repr, _IN_CHECKOUT))}")
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / _IN_CHECKOUT[name]):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"iosim's data folder {name!r} is missing: looked in {_PACKAGE / '_data' / name} and "
        f"{_PACKAGE.parent / _IN_CHECKOUT[name]}; reinstall iosim (pip install .)"
    )


def kernels_dir() -> Path:
    return data_dir("kernels")


def scenarios_dir() -> Path:
    return data_dir("scenarios")


def validation_dir() -> Path:
    return data_dir("validation")


def benchmarks_dir() -> Path:
    return data_dir("benchmarks")
