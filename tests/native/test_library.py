"""medusa/native/library.py: the C library is built once per machine into the cache (no temporary left),
its entry points are declared, ``MEDUSA_BF16_KERNEL=0`` switches it off with the reason and ``=avx512`` takes
AVX-512 BF16 where AMX is too."""

import os
import subprocess
import sys

import pytest

from medusa.native import library

pytestmark = pytest.mark.skipif(not library.available(),
                                reason=f"native library unavailable: {library.unavailable_reason()}")


def test_built_once_per_machine_and_switched_off_by_the_environment(tmp_path):
    built = sorted(library.kernel_dir().glob("medusa_kernels-*.so"))
    assert built and not list(library.kernel_dir().glob(".medusa_kernels-*"))  # no temporary left
    code = "from medusa.modeling import bf16_kernel as a; print(a.available(), a.unavailable_reason())"
    env = {**os.environ, library.ENV: "0"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert off.stdout.split() == ["False", f"{library.ENV}=0"]
    env = {**os.environ, "MEDUSA_CACHE": str(tmp_path)}  # a fresh machine: builds into its cache
    fresh = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert fresh.stdout.split() == ["True"] and len(list((tmp_path / "kernels").glob("*.so"))) == 1
    code = "from medusa.native import library as a; print(a.kind())"
    env = {**os.environ, library.ENV: "avx512"}
    chosen = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert chosen.stdout.split() == [library.AVX512]


def test_the_matmul_is_amx_exactly_where_the_cpu_has_it():
    flags = library._cpu_flags()
    assert library.kind() == (library.AMX if {"amx_tile", "amx_bf16"} <= flags else library.AVX512)


def test_every_entry_point_is_declared():
    lib = library.library()
    for name in ("medusa_bf16_rows", "medusa_bf16_pack", "medusa_rms_norm", "medusa_attention",
                 "medusa_kv_append", "medusa_first_max", "medusa_top_log_softmax", "medusa_body_forward",
                 "medusa_draft_layer"):
        assert getattr(lib, name).argtypes, name


def test_every_source_and_header_is_hashed_into_the_name():
    assert {p.name for p in library.SOURCES} >= {"amx_bf16_rows.c", "avx512_bf16_rows.c", "bf16_rows.c",
                                                "bf16_layers.c", "bf16_pick_ops.c"}
    included = {line.split('"')[1] for p in library.SOURCES for line in p.read_text().splitlines()
                if line.startswith('#include "')}
    assert included == {p.name for p in library.HEADERS}
