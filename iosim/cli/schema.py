"""``iosim schema``: the JSON Schema of what iosim writes, generated from the typed models that write it.

The committed copies in ``docs/schema/`` are this command's output (a test keeps them equal):
``iosim schema NAME > docs/schema/NAME.schema.json`` for NAME in result, results, cpu-result.
"""

from __future__ import annotations

import json

import click

from ..result import ResultJSON
from ..scenario import SavedRun
from ..simulate_cpu import CpuResultJSON

SCHEMAS = {
    "result": (ResultJSON, "one simulation: iosim simulate --json, Result.to_json()"),
    "results": (SavedRun, "the results.json that iosim run writes and iosim plot reads"),
    "cpu-result": (CpuResultJSON, "one CPU simulation: iosim simulate --json --profile <a CPU profile>"),
}
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_text(name: str) -> str:
    """The JSON Schema of ``name`` (a key of SCHEMAS) as the text ``iosim schema NAME`` prints."""
    model, _ = SCHEMAS[name]
    return json.dumps({"$schema": DIALECT, **model.model_json_schema(by_alias=True)}, indent=2) + "\n"


@click.command("schema")
@click.argument("name", type=click.Choice(list(SCHEMAS)), default="result")
def schema_cmd(name):
    """Print the JSON Schema of NAME: 'result' (one simulation, iosim simulate --json), 'results' (the
    results.json of iosim run) or 'cpu-result' (iosim simulate --json on a CPU profile). Committed as
    docs/schema/NAME.schema.json."""
    click.echo(schema_text(name), nl=False)
