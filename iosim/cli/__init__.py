"""The ``iosim`` command. Bad input gets one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import sys

import click

from ..problem import ProblemError
from ..profile import ProfileError
from ..schedules import ScheduleError
from ..units import UnitError

USER_ERRORS = (ProblemError, ProfileError, ScheduleError, UnitError, FileNotFoundError)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="iosim")
def cli():
    """Memory traffic of attention schedules (naive, FlashAttention-1/2) across DRAM, L2 and SRAM."""


def _register():
    from . import profiles, simulate

    cli.add_command(simulate.simulate_cmd)
    cli.add_command(profiles.profiles)
    for extra in ("report", "measure", "calibrate"):  # optional command modules (reports, GPU measurement)
        try:
            mod = __import__(f"{__name__}.{extra}", fromlist=["COMMANDS"])
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{extra}":
                raise
            continue
        for cmd in mod.COMMANDS:
            cli.add_command(cmd)


_register()


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="iosim", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("iosim: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"iosim: error: {exc.format_message()}", err=True)
        sys.exit(2)
    except USER_ERRORS as exc:
        msg = " ".join(line.strip() for line in str(exc).splitlines())
        click.echo(f"iosim: error: {msg}", err=True)
        sys.exit(2)
