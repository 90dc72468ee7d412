"""What the project's tools build on (the tuner, the exporters, the benchmark, the scripts), kept
out of ``tiledattention``'s own surface, which is what a user calls: the shared GPU test case of
the attention families, its float32 reference and visible-key mask, torch's SDPA arguments for
a problem, the input dtypes' sizes, the database codecs, the lookup's pieces (``Resolver``, ``pick``), provenance
stamps, architecture names, the families serving an operation, the ``.text`` digest that
restamping compares, what a compiled kernel asks of an SM (``kernel_resources``,
``resident_ctas``), and what an ahead-of-time build of cubin bundles needs (``capturing``
builds, a kernel's name and calling convention, the bundle writer) and measures (the launches
a call makes, the signatures shipped cubins served, the JIT's length-free compiles)."""

from .core._case import (AttentionCase, dequantise_fp8, paged_flops, paged_lengths, quantise_fp8,
                         ragged_lengths, torch_sdpa_kwargs)
from .core._aot import (compiles as jit_compiles, launch_path, recording as recording_launches,
                        reset as forget_shipped_cubins, served as served_from_bundles)
from .core._bundles import PACKAGE_BUNDLES, kernel_name, param_specs, write_bundle
from .core._compile import SM_COUNTS, capturing, check_arch, generation
from .core._cubin import (KernelResources, kernel_resources, kernel_symbol, text_digest,
                          without_ptx_text)
from .core._dtypes import FP8_DTYPES, array_itemsize
from .core._family import codecs, serving
from .core._lookup import Resolver, pick
from .core._problem import head_dim_parts, packable, page_tile
from .core._provenance import Provenance, current_provenance, toolchain_versions
from .core._ragged import ragged_problem
from .core._identity import module_identity
from .core._residency import Residency, resident_ctas
from .core._reference import attention_reference, varlen_reference, visible_keys
from .core._runtime import Runtime
from .core._settings import cubin_cache, simulated_database_location
from .entry_points._mixed_tables import compile_mixed_tables
from .entry_points._page_copy import compile_page_copy
from .entry_points._ragged_fill import compile_clear as compile_ragged_clear

__all__ = ["AttentionCase", "FP8_DTYPES", "KernelResources", "PACKAGE_BUNDLES", "Provenance",
           "Residency", "dequantise_fp8", "kernel_resources", "resident_ctas",
           "quantise_fp8",
           "Resolver", "Runtime", "SM_COUNTS", "array_itemsize", "attention_reference",
           "capturing", "compile_mixed_tables", "compile_page_copy", "compile_ragged_clear",
           "cubin_cache", "forget_shipped_cubins",
           "jit_compiles", "kernel_name",
           "kernel_symbol", "launch_path", "module_identity", "param_specs", "recording_launches", "served_from_bundles",
           "toolchain_versions", "write_bundle",
           "check_arch", "codecs", "current_provenance", "generation", "paged_flops",
           "head_dim_parts", "packable", "page_tile", "paged_lengths", "pick", "ragged_lengths",
           "ragged_problem", "serving", "simulated_database_location", "text_digest",
           "torch_sdpa_kwargs", "varlen_reference", "visible_keys", "without_ptx_text"]
