"""BLAS for the numba kernels: NumPy's own OpenBLAS, called from compiled code, without SciPy.

numba's ``np.dot`` reaches BLAS through SciPy (``scipy.linalg.cython_blas``), a ~40 MB dependency that would
bring a second OpenBLAS into the process. NumPy's wheels already ship one (``numpy.libs/libscipy_openblas64_*``
on Linux, ``numpy/.dylibs`` on macOS), the very library ``q @ k.T`` runs on. iosim loads it, registers its
ILP64 ``cblas_sgemm``/``cblas_dgemm`` and ``openblas_set_num_threads_local`` under names of its own
(``iosim_cblas_sgemm`` ...) and the kernels declare those names as external functions; numba's on-disk cache
keeps the names, not addresses, so cached kernels link in a new process. So naive and tiled attention use the
same GEMM code, and the measured ratio is the schedule's.

Where no such library is found (NumPy built against MKL or Accelerate), stubs are registered under the same
names and the kernels run their own loop GEMMs (correct, several times slower); :data:`BLAS` says which.
"""

from __future__ import annotations

import ctypes
import glob
import os

import llvmlite.binding as llvm
import numpy as np
from numba import cfunc, types

SGEMM = "iosim_cblas_sgemm"
DGEMM = "iosim_cblas_dgemm"
THREADS_LOCAL = "iosim_openblas_set_num_threads_local"

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS enums

# cblas_?gemm(order, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc), 64-bit integers (ILP64);
# pointers travel as uintp (same register class on every 64-bit ABI)
_i32, _i64, _p = types.int32, types.int64, types.uintp
SGEMM_SIG = types.void(_i32, _i32, _i32, _i64, _i64, _i64, types.float32, _p, _i64, _p, _i64, types.float32,
                       _p, _i64)
DGEMM_SIG = types.void(_i32, _i32, _i32, _i64, _i64, _i64, types.float64, _p, _i64, _p, _i64, types.float64,
                       _p, _i64)
THREADS_SIG = types.int32(_i32)

_NAMES = {
    SGEMM: ("scipy_cblas_sgemm64_", "cblas_sgemm64_"),
    DGEMM: ("scipy_cblas_dgemm64_", "cblas_dgemm64_"),
    THREADS_LOCAL: ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_"),
}


def _library_paths() -> list[str]:
    root = os.path.dirname(np.__file__)
    pats = ("../numpy.libs/*openblas*", ".dylibs/*openblas*", "../numpy.libs/*openblas*.dll")
    return sorted({p for pat in pats for p in glob.glob(os.path.join(root, pat))})


@cfunc(SGEMM_SIG, cache=True)
def _sgemm_stub(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):  # never called: BLAS is False
    pass


@cfunc(DGEMM_SIG, cache=True)
def _dgemm_stub(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    pass


@cfunc(THREADS_SIG, cache=True)
def _threads_stub(n):
    return 0


def _find() -> tuple[str | None, dict[str, int]]:
    """(library path, {our name: address}) of the first NumPy OpenBLAS that has both GEMMs."""
    for path in _library_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        found = {}
        for ours, theirs in _NAMES.items():
            for name in theirs:
                fn = getattr(lib, name, None)
                if fn is not None:
                    found[ours] = ctypes.cast(fn, ctypes.c_void_p).value
                    break
        if SGEMM in found and DGEMM in found:
            return path, found
    return None, {}


LIBRARY, _addresses = _find()
BLAS: bool = LIBRARY is not None
"""True when the kernels' GEMMs run on NumPy's OpenBLAS; False: numba loop GEMMs."""
THREADS_LOCAL_FOUND: bool = THREADS_LOCAL in _addresses

for _name, _stub in ((SGEMM, _sgemm_stub), (DGEMM, _dgemm_stub), (THREADS_LOCAL, _threads_stub)):
    llvm.add_symbol(_name, _addresses.get(_name, _stub.address))

sgemm = types.ExternalFunction(SGEMM, SGEMM_SIG)
dgemm = types.ExternalFunction(DGEMM, DGEMM_SIG)
set_num_threads_local = types.ExternalFunction(THREADS_LOCAL, THREADS_SIG)


def describe() -> str:
    """One line: which GEMM the kernels use."""
    if BLAS:
        return f"NumPy's OpenBLAS ({os.path.basename(LIBRARY)}), one BLAS thread per numba thread"
    return "numba loop GEMMs (no NumPy OpenBLAS found: NumPy built against another BLAS)"
