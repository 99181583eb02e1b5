"""A stand-in for SGLang's kernel package (``sgl_kernel``, PyPI ``sglang-kernel``) on a CPU.

Why it exists: the package ships CUDA binaries only, and SGLang imports it while it starts, also
with ``SGLANG_USE_CPU_ENGINE=1`` (its memory pool imports the CPU KV-cache copy); the import dies on
a machine without ``libcuda.so.1``. SGLang's CPU kernels are a source build for CPUs with AMX.
Serving a dense model such as the tiny Qwen3 with ``--attention-backend torch_native`` on a CPU
calls no function of it: SGLang's torch paths do the work.

What it does: ``slime-harbor serve --engine sglang`` puts the folder holding this package first on
SGLang's ``PYTHONPATH`` on a machine without a GPU, and only there (policy/engine_launcher.py). Every name
imported from it, in any submodule, refuses to run when called: it appends its name to the file
``$SLIME_HARBOR_SGL_KERNEL_CALLS`` (when set) and raises. The test suite sets that file and
checks it is still empty after real rollouts (tests/test_real_engines.py), so a SGLang that starts
calling a kernel here fails loudly instead of computing something else.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

CALLS_FILE_VARIABLE = "SLIME_HARBOR_SGL_KERNEL_CALLS"


class _Refusing:
    """What every name of the stand-in is: calling it refuses (records its name, raises); an
    attribute of it (``scalar_types.uint4b8``, read while SGLang's modules load) is another one."""

    def __init__(self, qualified: str):
        self._qualified = qualified

    def __call__(self, *args, **kwargs):
        path = os.environ.get(CALLS_FILE_VARIABLE)
        if path:
            with open(path, "a") as calls:
                calls.write(self._qualified + "\n")
        raise RuntimeError(f"{self._qualified} was called, but sgl_kernel is slime-harbor's CPU stand-in (no kernel runs here)")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Refusing(f"{self._qualified}.{name}")

    def __repr__(self) -> str:
        return f"<sgl_kernel CPU stand-in {self._qualified}>"


class _StandIn(types.ModuleType):
    """A module whose every public attribute is a refusing function (dunders and private names
    stay missing: ``hasattr(module, "_x")`` is False, as for a module that lacks it)."""

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        value = _Refusing(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every ``sgl_kernel.<sub>`` import a stand-in too (``from sgl_kernel.kvcacheio import ...``)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _StandIn
__version__ = "0.0.0+slime-harbor-cpu-stand-in"
