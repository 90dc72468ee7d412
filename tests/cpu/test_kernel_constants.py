"""Kernel constants go by name, and schedules are normalised before they are keyed.

The argument tuple of ``attention_fwd`` is laid out from the kernel's own signature, so a swapped
pair of constants lands on the right parameters or fails here; inside the kernel file, where
cuTile inlines helper calls, the file's syntax tree is read to check that no constant travels by
position onto a parameter of another name (section (e)). ``normalise`` gives flags with no
effect for a problem their canonical value: schedules that normalise to one key compile to the
same machine code (equal ``.text`` digests, sm_90 cubins built on the CPU), and schedules that
do not, compile to different code.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import itertools
import random
from pathlib import Path

import cuda.tile as ct
import pytest
from cuda.tile import compilation as ctc

from tiledattention.core._compile import array_constraint, export_cubin
from tiledattention.core._cubin import elf_sections, text_digest
from tiledattention.errors import KernelArgumentError
from tiledattention.kernels.forward._compile import _export, compile_schedule
from tiledattention.kernels.forward._kernel import attention_fwd
from tiledattention.kernels.forward._launch import (NO_LSE, RUNTIME_PARAMETERS, UNUSED,
                                                    constant_args, grid_for, kernel_args,
                                                    kernel_constants, kernel_for, kernel_parameters,
                                                    no_effect_flags, normalise, ordered_args)
from tiledattention.core._problem import Problem, head_dim_parts
from tiledattention.kernels.forward._schedule import Schedule
from tiledattention.kernel_core import MODULES as KERNEL_CORE_MODULES

ARCH = "sm_90"


def _problem(seqlen_q: int = 256, seqlen_k: int = 256, head_dim: int = 64,
             causal: bool = False) -> Problem:
    return Problem(batch=1, heads_q=2, heads_kv=1, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
                   head_dim=head_dim, dtype="bf16", causal=causal)


FULL = _problem()  # 4 x 4 tiles of 64, no mask at all
RAGGED = _problem(seqlen_q=200, seqlen_k=200)  # no tile size divides it: ragged edges
CAUSAL = _problem(causal=True)
PROBLEMS = {
    "full": FULL, "ragged": RAGGED, "causal": CAUSAL,
    "causal_ragged_k": _problem(seqlen_q=512, seqlen_k=300, causal=True),
    "padded_d": _problem(head_dim=96),
    "one_q_tile": _problem(seqlen_q=48, seqlen_k=512, causal=True),
    "one_k_tile": _problem(seqlen_q=512, seqlen_k=64),
}
BASE = Schedule(tile_m=64, tile_n=64)
FLAGS = ("k_transposed", "allow_tma", "exp2", "approx_div", "kv_sawtooth", "longest_first",
         "unchecked_loads", "split_masked", "persistent", "paired_tiles")


# -- compiled code, built once per (problem, schedule) for the whole module ------------------------
@pytest.fixture(scope="module")
def digest():
    """``digest(problem, schedule)``: text digest of the sm_90 cubin ``compile_schedule`` builds.
    Cached by the schedule as given, never by its normalised key (that would make the equal-code
    tests hold by construction)."""
    built: dict[tuple[Problem, Schedule], str] = {}

    def build(problem: Problem, schedule: Schedule) -> str:
        if (problem, schedule) not in built:
            built[problem, schedule] = text_digest(compile_schedule(problem, schedule, ARCH).cubin)
        return built[problem, schedule]

    return build


# -- (a) the argument list comes from the kernel's signature -------------------------------------
def test_parameters_are_read_from_the_kernel_function():
    names = tuple(inspect.signature(attention_fwd._pyfunc).parameters)
    assert kernel_parameters() == names
    assert names[:len(RUNTIME_PARAMETERS)] == RUNTIME_PARAMETERS
    upper = {n for n in names if n.isupper() and n not in RUNTIME_PARAMETERS}
    assert set(kernel_constants(FULL, BASE)) == upper and len(upper) == 34


def test_values_land_on_their_parameters_whatever_the_mapping_order():
    runtime = {"Q": "q", "K": "k", "V": "v", "Out": "out", "qk_scale": 0.5, "heads_q": 2,
               "group": 2, "Lse": "lse", "window_left": "wl", "window_right": "wr",
               "softcap": "cap", "Sinks": "sinks", "Ranges": "ranges", "Work": "work",
               "Pages": "pages", "QDescale": "qd", "KDescale": "kd", "VDescale": "vd"}
    constants = kernel_constants(CAUSAL, BASE.replace(exp2=True))
    # EXP2 and APPROX_DIV differ; give them in swapped insertion order, and everything reversed
    swapped = dict(constants)
    swapped = {k: swapped[k] for k in ("APPROX_DIV", "EXP2")} | swapped
    reversed_ = dict(reversed(list(constants.items())))
    names = kernel_parameters()
    for mapping in (constants, swapped, reversed_):
        args = ordered_args(dict(reversed(list(runtime.items()))), mapping)
        assert len(args) == len(names)
        for name, value in zip(names, args):
            assert value == (runtime | constants)[name], name
        assert args[names.index("EXP2")] is True and args[names.index("APPROX_DIV")] is False


@pytest.mark.parametrize("change, message", [
    (lambda r, c: c.pop("PAIRED"), "constants missing ['PAIRED']"),
    (lambda r, c: r.pop("group"), "runtime missing ['group']"),
    (lambda r, c: c.update(TILE_K=64), "does not take: ['TILE_K']"),
    (lambda r, c: r.update(CAUSAL=True), "supplied twice"),
    (lambda r, c: c.update(Q=None), "belong in the other mapping"),
], ids=["missing_constant", "missing_runtime", "extra_constant", "twice", "misplaced"])
def test_a_missing_extra_or_doubled_name_raises(change, message):
    runtime = dict(zip(RUNTIME_PARAMETERS, range(len(RUNTIME_PARAMETERS))))
    constants = kernel_constants(FULL, BASE)
    change(runtime, constants)
    with pytest.raises(TypeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ordered_args(runtime, constants)


#: schedule flag -> (constant, value of the constant when the flag is on); on the causal even
#: problem every flag has an effect, so turning one on changes exactly its own constant.
FLAG_CONSTANT = {
    "k_transposed": ("K_TRANSPOSED", True), "allow_tma": ("ALLOW_TMA", True),
    "exp2": ("EXP2", True), "approx_div": ("APPROX_DIV", True),
    "kv_sawtooth": ("KV_SAWTOOTH", True), "longest_first": ("LONGEST_FIRST", True),
    "unchecked_loads": ("CHECK_BOUNDS", False), "split_masked": ("SPLIT_MASKED", True),
    "persistent": ("PERSISTENT", True), "paired_tiles": ("PAIRED", True),
}


@pytest.mark.parametrize("flag", FLAGS)
def test_each_flag_reaches_its_own_constant_and_no_other(flag):
    off = BASE.replace(allow_tma=False)
    on = off.replace(**{flag: True})
    before, after = kernel_constants(CAUSAL, off), kernel_constants(CAUSAL, on)
    name, value = FLAG_CONSTANT[flag]
    assert {k for k in before if before[k] != after[k]} == {name}
    assert after[name] is value
    args = kernel_args(None, None, None, None, CAUSAL, on, 0.125)
    assert args[kernel_parameters().index(name)] is value


def test_runtime_values_and_constants_in_kernel_args():
    s = BASE.replace(k_latency=3, tile_n=32)
    args = kernel_args("q", "k", "v", "o", CAUSAL, s, 0.125)
    assert args[:8] == ("q", "k", "v", "o", 0.125, 2, 2, NO_LSE)
    # no window, softcap, sinks, ranges, work table, pages, descale factors
    assert args[8:18] == (UNUSED,) * 10
    assert args[18:] == constant_args(CAUSAL, s)
    named = dict(zip(kernel_parameters(), args))
    assert (named["TILE_M"], named["TILE_N"], named["TILE_D"], named["K_LATENCY"],
            named["V_LATENCY"], named["EVEN_K"]) == (64, 32, 64, 3, 0, True)
    assert kernel_constants(_problem(head_dim=96), s)["TILE_D"] == 128


@pytest.mark.parametrize("head_dim, split, parts", [
    (96, False, (128, 0)), (96, True, (64, 32)), (80, True, (64, 16)), (72, True, (64, 16)),
    (40, True, (32, 16)), (192, True, (128, 64)), (160, True, (128, 32)),
    (128, True, (128, 0)), (64, True, (64, 0)),
    (224, True, (256, 0)),  # 128 + 128 pads as much as 256: one part
    (112, True, (128, 0)),  # 64 + 48 padded to 64: as many columns as one part of 128
    (56, True, (64, 0)),  # 32 + 24 padded to 32: likewise
])
def test_head_dim_parts(head_dim, split, parts):
    assert head_dim_parts(head_dim, split) == parts


# -- (b) schedules that normalise to one key compile the same code -------------------------------
SAME = {
    "longest_first_full": (FULL, BASE.replace(longest_first=True), BASE),
    "paired_tiles_full": (FULL, BASE.replace(paired_tiles=True), BASE),
    "unchecked_loads_ragged": (RAGGED, BASE.replace(unchecked_loads=True), BASE),
    "split_masked_full": (FULL, BASE.replace(split_masked=True), BASE),
    "longest_first_paired_causal": (CAUSAL, BASE.replace(paired_tiles=True, longest_first=True),
                                    BASE.replace(paired_tiles=True)),
}


@pytest.mark.parametrize("problem, a, b", SAME.values(), ids=SAME.keys())
def test_schedules_with_one_normalised_key_compile_the_same_code(digest, problem, a, b):
    assert a.key != b.key
    assert normalise(problem, a).key == normalise(problem, b).key
    assert kernel_constants(problem, a) == kernel_constants(problem, b)
    assert digest(problem, a) == digest(problem, b)


def test_split_masked_without_a_mask_is_dead_code_in_the_kernel():
    """The rule is not only the launcher's choice: with SPLIT_MASKED forced on for a problem
    without a mask, the kernel compiles to the same instructions."""
    constants = kernel_constants(FULL, BASE)
    built = [_export(FULL, kernel_for(BASE), constants | {"SPLIT_MASKED": flag}, ARCH, "raw")
             for flag in (False, True)]
    assert text_digest(built[0].cubin) == text_digest(built[1].cubin)


# -- (c) schedules that do not normalise to one key compile different code -----------------------
DIFFERENT = {
    "longest_first_causal": (CAUSAL, BASE.replace(longest_first=True), BASE),
    "paired_tiles_causal": (CAUSAL, BASE.replace(paired_tiles=True), BASE),
    "split_masked_causal": (CAUSAL, BASE.replace(split_masked=True), BASE),
    "exp2_full": (FULL, BASE.replace(exp2=True), BASE),
    # Without TMA: with TMA loads, sm_90 (and sm_120) compile unchecked_loads to the same code
    # as checked ones (TMA bounds-checks in hardware), while sm_80 and sm_100 do not. normalise
    # knows no architecture, so that no-op is the search space's business.
    "unchecked_loads_full_no_tma": (FULL, BASE.replace(allow_tma=False, unchecked_loads=True),
                                    BASE.replace(allow_tma=False)),
    "kv_sawtooth_full": (FULL, BASE.replace(kv_sawtooth=True), BASE),
}


@pytest.mark.parametrize("problem, a, b", DIFFERENT.values(), ids=DIFFERENT.keys())
def test_schedules_with_different_normalised_keys_compile_different_code(digest, problem, a, b):
    assert normalise(problem, a) == a and normalise(problem, b) == b
    assert digest(problem, a) != digest(problem, b)


# -- (d) normalise: idempotent, touches only flags, keeps constants and grid ---------------------
def _schedules(count: int = 300) -> list[Schedule]:
    rng = random.Random(20261)
    out = [BASE, BASE.replace(**{f: not getattr(BASE, f) for f in FLAGS})]
    for _ in range(count):
        out.append(BASE.replace(
            tile_m=rng.choice((16, 64, 128)), tile_n=rng.choice((32, 64, 256)),
            occupancy=rng.choice((1, 2)), k_latency=rng.choice((None, 2)),
            **{f: rng.random() < 0.5 for f in FLAGS}))
    return out


SCHEDULES = _schedules()
#: what normalise may change: the flags whose effect depends on the problem
NORMALISED = {"paired_tiles", "longest_first", "kv_sawtooth", "unchecked_loads", "split_masked"}


@pytest.mark.parametrize("problem", PROBLEMS.values(), ids=PROBLEMS.keys())
def test_normalise_is_idempotent_and_keeps_what_the_kernel_sees(problem):
    defaults = Schedule()
    changed_somewhere = set()
    for s in SCHEDULES:
        n = normalise(problem, s)
        assert normalise(problem, n) == n
        assert no_effect_flags(problem, n) == {}
        changed = {f.name for f in dataclasses.fields(Schedule)
                   if getattr(n, f.name) != getattr(s, f.name)}
        assert changed <= NORMALISED
        assert changed == set(no_effect_flags(problem, s))
        assert all(getattr(n, f) == getattr(defaults, f) for f in changed)
        changed_somewhere |= changed
        assert kernel_constants(problem, n) == kernel_constants(problem, s)
        assert grid_for(problem, n, 132) == grid_for(problem, s, 132)
        assert kernel_for(n) is kernel_for(s)
    assert changed_somewhere  # each problem above has some flag without effect


@pytest.mark.parametrize("problem", PROBLEMS.values(), ids=PROBLEMS.keys())
def test_one_normalised_key_iff_one_set_of_constants(problem):
    """Toggling any flag of any schedule changes the constants exactly when it changes the
    normalised schedule: no flag is dropped silently and none is kept that does nothing."""
    for s, flag in itertools.product(SCHEDULES[:60], FLAGS):
        t = s.replace(**{flag: not getattr(s, flag)})
        same_key = normalise(problem, s).key == normalise(problem, t).key
        assert same_key == (kernel_constants(problem, s) == kernel_constants(problem, t)), flag


def test_rules_on_hand_picked_cases():
    everything = BASE.replace(**{f: True for f in NORMALISED})
    assert set(no_effect_flags(FULL, everything)) == {"paired_tiles", "longest_first",
                                                      "split_masked"}
    assert set(no_effect_flags(RAGGED, everything)) == {"paired_tiles", "longest_first",
                                                        "unchecked_loads"}
    assert set(no_effect_flags(CAUSAL, everything)) == {"longest_first"}  # paired wins
    assert set(no_effect_flags(PROBLEMS["one_q_tile"], everything)) == {
        "paired_tiles", "longest_first", "kv_sawtooth", "unchecked_loads"}
    assert set(no_effect_flags(PROBLEMS["one_k_tile"], everything)) == {
        "paired_tiles", "longest_first", "kv_sawtooth", "split_masked"}
    assert set(no_effect_flags(PROBLEMS["padded_d"], everything)) >= {"unchecked_loads"}
    assert no_effect_flags(CAUSAL, BASE) == {}


# -- the cubin reader --------------------------------------------------------------------------
def test_text_digest_counts_code_sections_only(digest):
    cubin = compile_schedule(FULL, BASE, ARCH).cubin
    sections = elf_sections(cubin)
    names = [name for name, _ in sections]
    text = next(name for name in names if name.startswith(".text"))
    other = next(name for name in names if name.startswith(".debug_line")
                 or name.startswith(".nv_debug"))
    assert text_digest(cubin) == digest(FULL, BASE)

    def flip_first_byte_of(section: str) -> bytes:
        at = cubin.index(dict(sections)[section])
        return cubin[:at] + bytes([cubin[at] ^ 0xFF]) + cubin[at + 1:]

    assert text_digest(flip_first_byte_of(other)) == text_digest(cubin)
    assert text_digest(flip_first_byte_of(text)) != text_digest(cubin)
    with pytest.raises(ValueError, match="ELF"):
        text_digest(b"not a cubin" * 10)


def test_split_d_reaches_the_head_dim_parts_only_where_it_saves_columns():
    d96 = _problem(head_dim=96)
    one, two = kernel_constants(d96, BASE), kernel_constants(d96, BASE.replace(split_d=True))
    assert {k for k in one if one[k] != two[k]} == {"TILE_D", "TILE_D2"}
    assert (two["TILE_D"], two["TILE_D2"]) == (64, 32)
    assert (one["TILE_D"], one["TILE_D2"]) == (128, 0)
    # a power-of-two head dim has nothing to split: the flag normalises away
    assert normalise(FULL, BASE.replace(split_d=True)) == BASE
    # exact parts (64 + 32) never cross the head dim's edge: unchecked loads stay possible
    even96 = _problem(head_dim=96, seqlen_q=256, seqlen_k=256)
    unchecked = BASE.replace(split_d=True, unchecked_loads=True)
    assert kernel_constants(even96, unchecked)["CHECK_BOUNDS"] is False
    assert kernel_constants(even96, BASE.replace(unchecked_loads=True))["CHECK_BOUNDS"] is True


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120", "sm_121"])
def test_split_head_dim_compiles_for_every_architecture(arch):
    problem = _problem(head_dim=80, seqlen_q=200, seqlen_k=300, causal=True)
    built = compile_schedule(problem, BASE.replace(split_d=True, exp2=True), arch)
    assert built.cubin and text_digest(built.cubin)


# -- (e) the kernel files: one entry each, closures, no constant travels by position ----------
#: every kernel file, each checked together with the kernel core its calls reach
KERNEL_MODULES = ("tiledattention.kernels.forward._kernel", "tiledattention.kernels.decode._kernel",
                  "tiledattention.kernels.backward._kernel", "tiledattention.core._work_kernel")
KERNEL_SOURCES = {name: Path(importlib.util.find_spec(name).origin).read_text()
                  for name in KERNEL_MODULES}
CORE_SOURCES = tuple(Path(importlib.util.find_spec(name).origin).read_text()
                     for name in KERNEL_CORE_MODULES)
KERNEL_SOURCE = KERNEL_SOURCES["tiledattention.kernels.forward._kernel"]
#: the most positional parameters a kernel helper may take (the ``@ct.kernel`` entries, whose
#: arguments ``_launch`` lays out by name, excepted)
MAX_POSITIONAL = 12
#: the most ``NAME=NAME`` keyword pass-throughs a kernel file may hold: constants reach the
#: per-tile work by closure, not down a chain of helpers
MAX_PASS_THROUGHS = 10


def _constant_mismatches(source: str, *library: str) -> list[str]:
    """Each call in ``source`` (or in ``library``, the kernel core's sources) to a function
    defined in any of them (module level or nested) whose positional argument is an
    UPPER_CASE name (a compile-time constant: any all-capitals name but the kernel's arrays
    Q, K, V) bound to a parameter of another name, or whose keyword argument for an
    UPPER_CASE parameter is an UPPER_CASE name of another one; ``*`` and ``**`` arguments are
    refused outright, since they hide where a value lands. Also two functions of one name
    (a call to it is ambiguous), and every function with more than ``MAX_POSITIONAL``
    positional parameters, but the ``@ct.kernel`` entries (``_launch`` lays their arguments
    out by name)."""
    trees = [ast.parse(text) for text in (source, *library)]
    functions: dict[str, ast.FunctionDef] = {}
    problems = []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                if node.name in functions:
                    problems.append(f"two functions named {node.name}: calls to it are "
                                    f"ambiguous")
                functions[node.name] = node
                positional = node.args.posonlyargs + node.args.args
                entry = any(ast.unparse(d) == "ct.kernel" for d in node.decorator_list)
                if len(positional) > MAX_POSITIONAL and not entry:
                    problems.append(f"{node.name} takes {len(positional)} positional "
                                    f"parameters")

    def constant(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name) and expr.id.isupper() and expr.id not in ("Q", "K", "V"):
            return expr.id
        return None

    for tree in trees:
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                    and call.func.id in functions):
                continue
            callee = functions[call.func.id]
            where = f"line {call.lineno}: {callee.name}"
            params = [a.arg for a in callee.args.posonlyargs + callee.args.args]
            for i, arg in enumerate(call.args):
                if isinstance(arg, ast.Starred):
                    problems.append(f"{where}(*...) hides where its values land")
                elif constant(arg) and (i >= len(params) or params[i] != constant(arg)):
                    lands = params[i] if i < len(params) else "no parameter"
                    problems.append(f"{where}: positional {constant(arg)} lands on {lands}")
            for keyword in call.keywords:
                if keyword.arg is None:
                    problems.append(f"{where}(**...) hides where its values land")
                elif (keyword.arg.isupper() and constant(keyword.value)
                      and constant(keyword.value) != keyword.arg):
                    problems.append(f"{where}: {keyword.arg}={constant(keyword.value)}")
    return problems


def _pass_throughs(source: str) -> int:
    """The keyword arguments ``NAME=NAME`` (a value handed on under its own name) of the
    calls in ``source``."""
    return sum(isinstance(k.value, ast.Name) and k.value.id == k.arg
               for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
               for k in node.keywords)


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_no_constant_lands_on_a_parameter_of_another_name(module):
    assert _constant_mismatches(KERNEL_SOURCES[module], *CORE_SOURCES) == []


@pytest.mark.parametrize("module", KERNEL_MODULES)
def test_constants_reach_the_per_tile_work_by_closure(module):
    assert _pass_throughs(KERNEL_SOURCES[module]) <= MAX_PASS_THROUGHS


def test_the_constant_check_sees_a_swapped_pair():
    """The check itself: a planted swap, by position or by keyword, is reported, in a call to
    a helper of the kernel file or of the kernel core; so are a long helper and a chain of
    pass-throughs."""
    planted = ("def helper(x, EXP2, APPROX_DIV):\n    pass\n\n\n"
               "def caller(x, EXP2, APPROX_DIV):\n    helper(x, APPROX_DIV, EXP2)\n")
    assert _constant_mismatches(planted) == [
        "line 6: helper: positional APPROX_DIV lands on EXP2",
        "line 6: helper: positional EXP2 lands on APPROX_DIV"]
    swapped = KERNEL_SOURCE.replace("TILE_N, CAUSAL, BOTTOM_RIGHT)",
                                    "TILE_N, BOTTOM_RIGHT, CAUSAL)")
    assert swapped != KERNEL_SOURCE
    assert sorted(p.split(": ", 1)[1] for p in _constant_mismatches(swapped, *CORE_SOURCES)) == [
        "forward_key_tiles: positional BOTTOM_RIGHT lands on CAUSAL",
        "forward_key_tiles: positional CAUSAL lands on BOTTOM_RIGHT"]
    by_keyword = "def f(x, EXP2):\n    pass\n\n\ndef g(APPROX_DIV):\n    f(1, EXP2=APPROX_DIV)\n"
    assert _constant_mismatches(by_keyword) == ["line 6: f: EXP2=APPROX_DIV"]
    too_long = "def f(a, b, c, d, e, f, g, h, i, j, k, l, m):\n    pass\n"
    assert _constant_mismatches(too_long) == ["f takes 13 positional parameters"]
    chain = "f(" + ", ".join(f"{n}={n}" for n in "ABCDEFGHIJK") + ", x=y)\n"
    assert _pass_throughs(chain) == MAX_PASS_THROUGHS + 1


@pytest.mark.parametrize("module, entries", [
    ("tiledattention.kernels.forward._kernel", ["attention_fwd"]),
    ("tiledattention.kernels.decode._kernel", ["decode_split", "decode_order", "decode_combine"]),
    ("tiledattention.kernels.backward._kernel", ["attention_bwd_dq", "attention_bwd_dkdv",
                                         "attention_bwd_sum", "attention_bwd_delta",
                                         "attention_bwd_dq_scale"]),
], ids=["forward", "decode", "backward"])
def test_one_entry_per_kernel_and_launchers_import_them_statically(module, entries):
    """Variants are constants of one kernel, not entries of their own; each family's launcher
    imports its kernels by name (an editor jumps to them), inside functions so that ``import
    tiledattention`` stays light, never through a module name in a string."""
    kernels = importlib.import_module(module)
    assert [name for name, value in vars(kernels).items()
            if isinstance(value, ct.kernel)] == entries
    launcher = importlib.util.find_spec(module.replace("._kernel", "._launch")).origin
    tree = ast.parse(Path(launcher).read_text())
    imported = {alias.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "_kernel"
                and node.level == 1 for alias in node.names}
    assert imported == set(entries)
    strings = [node.value for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert not [s for s in strings if s.endswith("_kernel") and "." in s]
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                and "_kernel" in ast.unparse(node)]


def test_one_kernel_entry_with_the_log_sum_exp_a_constant():
    names = kernel_parameters()
    assert "Lse" in names and "STORE_LSE" in names
    # only the variants', the ragged batch's and FP8's values (zero bytes when unused) follow
    # Lse: the plain forward keeps its parameter offsets
    assert names.index("Lse") == len(RUNTIME_PARAMETERS) - 11
    assert kernel_constants(CAUSAL, BASE)["STORE_LSE"] is False
    assert kernel_constants(CAUSAL, BASE, store_lse=True)["STORE_LSE"] is True


def test_kernel_args_with_and_without_lse_differ_in_lse_and_store_lse_only():
    plain = dict(zip(kernel_parameters(), kernel_args("q", "k", "v", "o", CAUSAL, BASE, 0.5)))
    with_lse = dict(zip(kernel_parameters(),
                        kernel_args("q", "k", "v", "o", CAUSAL, BASE, 0.5, lse="lse")))
    assert (plain["Lse"], plain["STORE_LSE"]) == (NO_LSE, False)
    assert (with_lse["Lse"], with_lse["STORE_LSE"]) == ("lse", True)
    assert {n for n in plain if plain[n] != with_lse[n]} == {"Lse", "STORE_LSE"}


def test_ordered_args_fills_the_placeholder_only_without_store_lse():
    runtime = {"Q": "q", "K": "k", "V": "v", "Out": "o", "qk_scale": 0.5, "heads_q": 2,
               "group": 2}
    constants = kernel_constants(CAUSAL, BASE)
    assert ordered_args(runtime, constants)[kernel_parameters().index("Lse")] == NO_LSE
    with pytest.raises(KernelArgumentError, match=r"runtime missing \['Lse'\]"):
        ordered_args(runtime, constants | {"STORE_LSE": True})


def test_store_lse_compiles_its_own_code_and_leaves_the_forward_alone(digest):
    """The plain forward built with the placeholder (``compile_schedule``) is the same code
    as with ``STORE_LSE`` named off; turning it on, with a float32 ``[B, H_q, S_q]`` array,
    compiles other code."""
    problem = _problem(seqlen_q=200, seqlen_k=300, causal=True)
    assert text_digest(_export(problem, kernel_for(BASE), kernel_constants(problem, BASE),
                               ARCH, "plain").cubin) == digest(problem, BASE)
    q = array_constraint("bf16", (1, 2, 200, 64))
    kv = array_constraint("bf16", (1, 1, 300, 64))
    runtime = {"Q": q, "K": kv, "V": kv, "Out": q, "Lse": array_constraint("fp32", (1, 2, 200)),
               "qk_scale": ctc.ScalarConstraint(ct.float32),
               "heads_q": ctc.ScalarConstraint(ct.int32), "group": ctc.ScalarConstraint(ct.int32)}
    args = ordered_args(runtime, kernel_constants(problem, BASE, store_lse=True))
    with_lse = export_cubin(kernel_for(BASE), args, ARCH, "forward+lse")
    assert text_digest(with_lse.cubin) != digest(problem, BASE)


def test_no_kernel_module_is_imported_by_a_string():
    """``lazy_module`` binds cuda.tile (and its compilation module) only: a kernel module is
    imported by name, where it is used, so that an editor can jump to it."""
    root = Path(importlib.util.find_spec("tiledattention").origin).parent
    by_string = [f"{path.relative_to(root)}:{node.lineno}" for path in sorted(root.rglob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Call) and ast.unparse(node.func) == "lazy_module"
                 and not (isinstance(node.args[0], ast.Constant)
                          and str(node.args[0].value).startswith("cuda."))]
    assert by_string == []


def test_a_paged_problem_passes_its_page_size_not_the_keys_a_load_takes():
    """``PAGE_SIZE``: the pools' keys a page, by which the kernel finds a key's page and its
    row there; ``PAGE_ROWS``: the keys one load takes (a page of 48 keys: 16)."""
    paged = Problem(batch=4, heads_q=32, heads_kv=8, seqlen_q=512, seqlen_k=16384,
                    head_dim=128, dtype="bf16", causal=True, bottom_right=True, ragged=True,
                    page_size=48)
    for page, rows in ((48, 16), (64, 64), (256, 64)):  # BASE's key tiles: 64 keys
        constants = kernel_constants(dataclasses.replace(paged, page_size=page), BASE)
        assert (constants["PAGE_ROWS"], constants["PAGE_SIZE"]) == (rows, page)
    assert kernel_constants(FULL, BASE)["PAGE_SIZE"] == 0
