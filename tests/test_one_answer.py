"""Issue 30 item 1, "one answer for one question": the API's signature names every option a schedule takes."""

from __future__ import annotations

import inspect

import pytest

from iosim import AttentionProblem, simulate

# -- the schedules' options are simulate's own keyword parameters ---------------------------------------------------

OPTIONS = ("splits", "density", "mask", "seed", "gqa")


def test_the_signature_names_every_schedule_option():
    params = inspect.signature(simulate).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name in OPTIONS:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY and params[name].default is None


@pytest.mark.parametrize("typo", ["split", "densty", "masks", "sead", "GQA"])
def test_a_misspelled_option_is_pythons_own_type_error(typo):
    with pytest.raises(TypeError, match=rf"^simulate\(\) got an unexpected keyword argument '{typo}'$"):
        simulate("flash-decoding", AttentionProblem(seq_len=1, kv_len=4096), **{typo: 4})


def test_options_reach_the_schedules_as_before():
    p = AttentionProblem(seq_len=1, kv_len=65536)
    assert simulate("flash-decoding", p, splits=8, l2=False).tiles.splits == 8
    a, b = (simulate("block-sparse", AttentionProblem(seq_len=1024), density=0.25, seed=s) for s in (1, 2))
    assert a.tiles.mask != b.tiles.mask
