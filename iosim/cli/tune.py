"""``iosim tune``: a kernel's legal tiles on one problem, ranked by predicted time, with why each loses."""

from __future__ import annotations

import json

import click

from ..problem import AttentionProblem
from ..schedules import SCHEDULES
from ..tune import tune
from ..units import fmt_seconds
from .simulate import problem_options


@click.command("tune")
@click.argument("schedule", type=click.Choice(list(SCHEDULES)))
@click.option("--profile", default=None, help="built-in profile name or a .yaml/.json file [default: h100-sxm5-80gb]")
@problem_options
@click.option("--kernel", default=None,
              help="whose tiles and time model: iosim-flash2 (its compiled tiles), fa2, fa3, cudnn or a YAML file "
                   "[default: the schedule's own; without a tile list, the powers of two 16-256 that fit]")
@click.option("--json", "as_json", is_flag=True, help="print the ranking as JSON")
def tune_cmd(schedule, profile, kernel, as_json, **problem_kw):
    """Rank the tiles SCHEDULE can run with on a problem by predicted time, fastest first.

    Each loser says what the time model charges it for against the winner (occupancy, waves, bytes, step cost);
    a tile that cannot run says why."""
    choices = tune(schedule, AttentionProblem.make(**problem_kw), profile, kernel=kernel)
    if as_json:
        click.echo(json.dumps([{"block_q": c.block_q, "block_kv": c.block_kv, "predicted_s": c.predicted_s,
                                "legal": c.legal, "reason": c.reason} for c in choices], indent=2))
        return
    for i, c in enumerate(choices, 1):
        time = fmt_seconds(c.predicted_s) if c.legal else "cannot run"
        click.echo(f"{i:>2}. {c.block_q:>3} x {c.block_kv:<3} {time:>12}  {c.reason or 'first choice'}")
