"""Scenario files: declarative experiments (YAML) that ``iosim run`` and ``iosim report`` execute.

A scenario names hardware profiles, schedules, a sweep of attention problems, the tiles, and which tables,
figures and checked claims to make. :mod:`.schema` is the format, :mod:`.loading` reads and validates files,
:mod:`.cases` and :mod:`.run` simulate them, :mod:`.claims` checks published numbers against the results,
:mod:`.saved` is the typed ``results.json`` that ``iosim run`` writes and ``iosim plot`` reads.
The Python API is quiet: :func:`run_scenario` reports progress only through the optional ``progress``
callback (the CLI draws a progress bar with it).
"""

from .cases import (
    BOUNDARIES,
    RECORD_FIELDS,
    Case,
    CaseResult,
    compulsory_bytes,
    expand,
    run_case,
    tiles_from_sram,
)
from .claims import ClaimCheck, check_claims, claim_value, format_sig, round_sig, select
from .loading import (
    builtin_names,
    builtin_paths,
    default_scenarios,
    load_scenario,
    resolve_scenario_arg,
    scenario_from_dict,
)
from .run import ScenarioRun, profile_summary, run_scenario, run_scenarios
from .saved import ClaimOutcome, ProfileRates, Record, SavedRun
from .schema import (
    SCHEMA_VERSION,
    Claim,
    FigureSpec,
    ProblemSweep,
    Reference,
    Scenario,
    ScenarioError,
    TableSpec,
    TilesSpec,
)

__all__ = [
    "BOUNDARIES", "RECORD_FIELDS", "SCHEMA_VERSION", "Case", "CaseResult", "Claim", "ClaimCheck", "ClaimOutcome",
    "FigureSpec", "ProblemSweep", "ProfileRates", "Record", "Reference", "SavedRun", "Scenario", "ScenarioError",
    "ScenarioRun", "TableSpec", "TilesSpec",
    "builtin_names", "builtin_paths", "check_claims", "claim_value", "compulsory_bytes", "default_scenarios",
    "expand", "format_sig", "load_scenario", "profile_summary", "resolve_scenario_arg",
    "round_sig", "run_case", "run_scenario", "run_scenarios", "scenario_from_dict", "select", "tiles_from_sram",
]
