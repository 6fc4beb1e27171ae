"""The ``iosim`` command. Bad input gets a message on stderr and exit code 2, never a traceback: one line, or,
for a profile file, one line per bad field as ``iosim profiles validate`` prints them. Warnings (questionable but
legal input, :class:`~iosim.problem.InputWarning`) print once each as ``iosim: warning: ...``."""

from __future__ import annotations

import importlib
import sys
import warnings

import click

from ..hardware.gpu import ProfileError
from ..problem import InputWarning, ProblemError
from ..schedules import ScheduleError
from ..simulate_cpu import CpuModelError
from ..timing import KernelError
from ..units import UnitError

USER_ERRORS = (ProblemError, ProfileError, ScheduleError, UnitError, CpuModelError, KernelError, FileNotFoundError)


# command -> (module of iosim.cli, attribute), imported when the command runs: `iosim simulate` loads neither the
# report (plotly) nor the CPU path (numba), so a simulation answers in well under a second
COMMANDS = {
    "simulate": ("simulate", "simulate_cmd"), "profiles": ("profiles", "profiles"), "run": ("report", "run_cmd"),
    "plot": ("report", "plot_cmd"), "report": ("report", "report_cmd"), "measure": ("measure", "measure_cmd"),
    "calibrate": ("calibrate", "calibrate"), "schema": ("schema", "schema_cmd"), "tune": ("tune", "tune_cmd"),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in COMMANDS:
            return None
        module, attr = COMMANDS[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="iosim")
def cli():
    """Memory traffic of attention schedules (naive, FlashAttention-1/2/3, Flash-Decoding, block-sparse,
    forward and backward) across DRAM, L2 and SRAM."""


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """One line per warning, no source line: the text says what is questionable and what to change."""
    kind = "warning" if issubclass(category, InputWarning) else category.__name__
    click.echo(f"iosim: {kind}: {message}", err=True)


def main(argv: list[str] | None = None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # each distinct warning once
        warnings.showwarning = _show_warning
        _main(argv)


def _main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="iosim", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("iosim: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"iosim: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except ProfileError as exc:  # a file's errors one per line, as `iosim profiles validate` lists them
        click.echo(f"iosim: error: {exc}", err=True)
        sys.exit(2)
    except USER_ERRORS as exc:
        msg = " ".join(line.strip() for line in str(exc).splitlines())
        click.echo(f"iosim: error: {msg}", err=True)
        sys.exit(2)
