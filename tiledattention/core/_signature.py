"""Kernel arguments by name: a ``ct.kernel``'s parameters read from its signature, so launchers
and compile-only builds lay values out in the kernel's own order and never by hand.

``KernelParameters(kernel, runtime)`` splits the parameters into launch-time values (the names
in ``runtime``) and ``ct.Constant`` ones, and refuses a kernel whose launch-time parameters are
not exactly ``runtime``. ``ordered(runtime_values, constants)`` places each value by its name,
naming what is missing, unknown, doubly supplied or in the wrong mapping. A function of no
arguments that imports and returns the kernel may stand for it: it is then called, and the
kernel checked, on first use, so that the modules describing launches import without cuda.tile
(``import tiledattention`` stays light) and still import their kernels statically.
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
import typing
from typing import Any, Iterable, Mapping

from ..errors import KernelArgumentError

__all__ = ["KernelParameters"]


@functools.cache
def _constant_mark() -> type:
    import cuda.tile as ct

    return type(typing.get_args(ct.Constant[int])[1])  # cuda.tile's ConstantAnnotation


def _python_function(kernel: Any) -> types.FunctionType:
    """The Python function under a ``ct.kernel`` object. cuda-tile 1.7.0 keeps it as the
    ``_pyfunc`` property (its own ``replace_hints`` rebuilds kernels from it); there is no public
    accessor, so a release without it fails here, loudly, rather than guessing an order."""
    pyfunc = getattr(kernel, "_pyfunc", None)
    if not isinstance(pyfunc, types.FunctionType):
        raise KernelArgumentError(
            f"cannot read the parameters of kernel {kernel!r}: expected the cuda.tile.kernel "
            f"attribute _pyfunc to be its Python function (cuda-tile 1.7.0); got {pyfunc!r}. "
            f"Update tiledattention.core._signature._python_function for this cuda-tile.")
    return pyfunc


class KernelParameters:
    """The parameters of one kernel template, split into runtime values and constants."""

    #: what ``_read`` sets, from the kernel's signature
    _READ = frozenset({"kernel_name", "names", "constants", "runtime", "_in_order"})

    def __init__(self, kernel: Any, runtime: Iterable[str]) -> None:
        """``kernel``: a ``ct.kernel`` (checked now) or a function of no arguments returning one
        (called, and the kernel checked, when an attribute is first read)."""
        self._expected = frozenset(runtime)
        if (isinstance(kernel, types.FunctionType)
                and not inspect.signature(kernel).parameters):
            self._load = kernel
        else:
            self._read(kernel)

    def __getattr__(self, name: str) -> Any:  # only for attributes not set yet
        if name not in KernelParameters._READ:
            raise AttributeError(name)
        self._read(self.__dict__["_load"]())
        return self.__dict__[name]

    def _read(self, kernel: Any) -> None:
        runtime = self._expected
        pyfunc = _python_function(kernel)
        self.kernel_name = pyfunc.__name__
        parameters = inspect.signature(pyfunc).parameters
        for p in parameters.values():
            if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or p.default is not p.empty:
                raise KernelArgumentError(f"kernel parameter {p.name} of {self.kernel_name} must "
                                          f"be a plain positional parameter without a default; "
                                          f"got {p}")
        hints = typing.get_type_hints(pyfunc, include_extras=True)
        self.names: tuple[str, ...] = tuple(parameters)
        self.constants = frozenset(
            name for name in parameters
            if typing.get_origin(hints.get(name)) is typing.Annotated
            and any(isinstance(m, _constant_mark()) for m in hints[name].__metadata__))
        self.runtime = frozenset(self.names) - self.constants
        if self.runtime != frozenset(runtime):  # the kernel gained or lost a launch-time value
            raise KernelArgumentError(
                f"{self.kernel_name}'s runtime parameters are {sorted(self.runtime)}; its "
                f"launcher supplies {sorted(runtime)}. Update the launcher with the kernel.")
        self._in_order = operator.itemgetter(*self.names)

    def ordered(self, runtime: Mapping[str, Any], constants: Mapping[str, Any]) -> tuple:
        """The positional argument tuple: each value placed by its name. ``runtime`` must name
        exactly the launch-time parameters and ``constants`` exactly the ``ct.Constant`` ones."""
        if runtime.keys() != self.runtime or constants.keys() != self.constants:
            raise KernelArgumentError(f"{self.kernel_name}({', '.join(self.names)}): "
                                      + self._mismatch(runtime, constants))
        return self._in_order({**constants, **runtime})

    def constant_values(self, constants: Mapping[str, Any]) -> tuple:
        """The constants in the kernel's parameter order (the tail after the runtime values
        when, as in this project's kernels, the constants come last)."""
        return tuple(constants[name] for name in self.names if name in self.constants)

    def _mismatch(self, runtime: Mapping[str, Any], constants: Mapping[str, Any]) -> str:
        problems = []
        twice = sorted(runtime.keys() & constants.keys())
        if twice:
            problems.append(f"supplied twice (in runtime and constants): {twice}")
        supplied = runtime.keys() | constants.keys()
        known = frozenset(self.names)
        for label, given, expected in (("runtime", runtime, self.runtime),
                                       ("constants", constants, self.constants)):
            missing = sorted(expected - supplied)
            unknown = sorted(given.keys() - known)
            misplaced = sorted(given.keys() & (known - expected))
            if missing:
                problems.append(f"{label} missing {missing}")
            if unknown:
                problems.append(f"{label} has names {self.kernel_name} does not take: {unknown}")
            if misplaced:
                problems.append(f"{label} has {misplaced}, which belong in the other mapping")
        return "; ".join(problems)
