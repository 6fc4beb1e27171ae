"""``iosim run``, ``iosim plot`` and ``iosim report``: scenario files in, results, figures and a report out."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..cpu.compare import scenario_data
from ..problem import AttentionProblem
from ..report import (
    CpuMeasurement,
    committed_cpu_record,
    load_run,
    render_report,
    saved_runs,
    write_figures,
    write_run,
)
from ..scenario import (
    ScenarioError,
    check_claims,
    default_scenarios,
    expand,
    load_scenario,
    resolve_scenario_arg,
    run_scenarios,
)
from ..simulate import simulate
from .simulate import compile_notice


def _load(args: tuple[str, ...]):
    try:
        if not args:
            return default_scenarios()
        return [load_scenario(resolve_scenario_arg(a)) for a in args]
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from None


def check_writable(path: Path, folder: bool) -> None:
    """Refuse, before any simulation, an output path that cannot be written: the message names the path,
    why, and the fix (click exits with code 2). A results folder is made with the folders on the way; a file's
    folder must exist (a typo in it would otherwise make a tree nobody meant). A file that was not there is not
    left behind."""
    what = f"cannot write the {'folder' if folder else 'file'} {path}"
    fix = "choose another path with -o/--out"
    above = next(a for a in path.absolute().parents if a.exists())
    if not above.is_dir():
        raise click.ClickException(f"{what}: {above} is a file, not a folder; {fix}")
    if not folder and not path.parent.absolute().is_dir():
        raise click.ClickException(f"{what}: the folder {path.parent} does not exist; make it first, or {fix}")
    try:
        if folder:
            path.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()
        else:
            existed = path.exists()
            with open(path, "a", encoding="utf-8"):
                pass
            if not existed:
                path.unlink()
    except OSError as exc:
        raise click.ClickException(f"{what}: {exc.strerror or exc}; {fix}") from None


def _n(count: int, noun: str) -> str:
    """``1 figure``, ``3 figures``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


@contextlib.contextmanager
def _progress(quiet: bool):
    """A rich progress bar on stderr, only where stderr is a terminal and --quiet is not given."""
    if quiet or not sys.stderr.isatty():
        yield lambda label, total: (lambda done, total: None)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=False) as bar:
        def make(label: str, total: int):
            task = bar.add_task(label, total=total)
            return lambda done, _total: bar.update(task, completed=done)

        yield make


def _warm_l2_model() -> None:
    """Compile the L2 model's loop here, before the worker processes fork, saying so on the first run after an
    install (numba caches it on disk): each worker would otherwise compile it again, silently."""
    with compile_notice():
        simulate("flash2", AttentionProblem(seq_len=256, head_dim=64), l2=True)


def _run_all(scenarios, quiet: bool):
    """Every scenario simulated on this machine's cores; a case that several scenarios share, once."""
    _warm_l2_model()
    with _progress(quiet) as make:
        cb = make(f"simulating {_n(len(scenarios), 'scenario')}",
                  sum(len(expand(scn)) for scn in scenarios))
        try:
            return run_scenarios(scenarios, progress=cb, workers=_cores())
        except ScenarioError as exc:
            raise click.ClickException(str(exc)) from None


def _cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@click.command("run")
@click.argument("scenarios", nargs=-1, required=True)
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="folder for the results (one sub-folder per scenario)")
@click.option("-q", "--quiet", is_flag=True, help="no progress bar and no summary")
@click.option("--check", is_flag=True, help="exit with code 1 if a published number (claim) does not match")
def run_cmd(scenarios, out_dir, quiet, check):
    """Simulate SCENARIOS (files, or names of built-in scenarios) and write tidy CSV + JSON results and the
    figures (HTML, with each figure's data as CSV beside it) under OUT/<scenario>/."""
    check_writable(out_dir, folder=True)
    runs = _run_all(_load(scenarios), quiet)
    for run in runs:
        try:
            paths = write_run(run, out_dir)
        except ScenarioError as exc:
            raise click.ClickException(str(exc)) from None
        if not quiet:
            checks = check_claims(run, run.scenario.claims)
            claims = f", claims {sum(c.ok for c in checks)}/{len(checks)} match" if checks else ""
            click.echo(f"{run.scenario.name}: {_n(len(run.records), 'case')}, {_n(len(paths), 'file')} in "
                       f"{out_dir / run.scenario.name}{claims}")
    _claims_verdict(runs, check)


def _claims_verdict(runs, check: bool) -> None:
    """Every claim that does not match goes to stderr; with --check, they make the exit code 1."""
    bad = [(run, c) for run in runs for c in check_claims(run, run.scenario.claims) if not c.ok]
    for run, c in bad:
        click.echo(f"iosim: {run.scenario.name}: claim {c.claim.label!r}: simulated {c.shown}, published "
                   f"{c.claim.expect}{' (' + c.error + ')' if c.error else ''}", err=True)
    if check and bad:
        sys.exit(1)


@click.command("plot")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("-q", "--quiet", is_flag=True)
def plot_cmd(results_dir, quiet):
    """Redraw the figures from results saved by 'iosim run' (RESULTS_DIR or its sub-folders), without
    simulating again."""
    for folder in saved_runs(results_dir):
        try:
            paths = write_figures(load_run(folder), folder)
        except ScenarioError as exc:
            raise click.ClickException(str(exc)) from None
        if not quiet:
            click.echo(f"{folder}: {_n(len(paths) // 2, 'figure')} redrawn in {folder / 'figures'}")


@click.command("report")
@click.argument("scenarios", nargs=-1)
@click.option("-o", "--out", "out_file", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("report.html"), show_default=True, help="the HTML file to write")
@click.option("--title", default="iosim report: attention I/O, simulated", show_default=True)
@click.option("-q", "--quiet", is_flag=True)
@click.option("--check", is_flag=True, help="exit with code 1 if a published number (claim) does not match")
@click.option("--cpu", "measure_cpu", is_flag=True,
              help="measure attention on this CPU (naive vs tiled, about 50 s) for the section 'Attention on a CPU', "
                   "instead of showing the committed record")
def report_cmd(scenarios, out_file, title, quiet, check, measure_cpu):
    """Write ONE self-contained HTML report (plotly embedded, opens offline) for SCENARIOS, or for the
    built-in scenarios when none is named. The built-in report ends with "Attention on a CPU" from the
    committed measurement record; --cpu measures this machine instead (and adds the section to named scenarios)."""
    t0 = time.perf_counter()
    check_writable(out_file, folder=False)
    runs = _run_all(_load(scenarios), quiet)
    try:
        cpu = _cpu_measurement(measure_cpu, default=not scenarios, quiet=quiet)
        page = render_report(runs, title=title, elapsed_s=time.perf_counter() - t0, cpu=cpu)
    except ScenarioError as exc:
        raise click.ClickException(str(exc)) from None
    out_file.write_text(page, encoding="utf-8")
    if not quiet:
        n = page.count('class="plotly-graph-div"')
        click.echo(f"wrote {out_file} ({len(page) / 1e6:.1f} MB, {_n(len(runs), 'scenario')}, {_n(n, 'figure')}) in "
                   f"{time.perf_counter() - t0:.1f} s")
    _claims_verdict(runs, check)


def _cpu_measurement(measure: bool, default: bool, quiet: bool) -> CpuMeasurement | None:
    """This machine measured now (--cpu), else the committed record for the built-in report, else none."""
    if measure:
        if not quiet:
            click.echo("measuring attention on this CPU: its profile, then naive vs tiled (about 50 s) ...", err=True)
        return CpuMeasurement(scenario_data())
    return committed_cpu_record() if default else None


