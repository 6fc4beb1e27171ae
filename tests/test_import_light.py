"""``import iosim`` stays light: numba (the L2 model's compiled loop, about a second to import) and rich (the
command line's progress bars) load when first used, not at import."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint({m: m in sys.modules for m in "
                          "('numba', 'rich')})"], capture_output=True, text=True, check=True, timeout=120)
    return eval(out.stdout.strip().splitlines()[-1])


def test_import_iosim_loads_neither_numba_nor_rich():
    assert _modules_after("import iosim") == {"numba": False, "rich": False}


def test_the_l2_model_loads_numba_when_first_run():
    code = ("import iosim\nr = iosim.simulate('flash2', iosim.AttentionProblem(seq_len=256, head_dim=64), l2=True)\n"
            "assert r.hbm_model.startswith('l2-lru')")
    assert _modules_after(code) == {"numba": True, "rich": False}
