"""medusa/native/pick.py: the C picks give argmax's answer exactly (ties and NaN included) and the top-k of
log_softmax (ties to the lower index, values to float32 rounding), at every width and row layout; the torch
path answers the same where the library is not used."""

import pytest
import torch

from medusa.native import library, pick

needs_library = pytest.mark.skipif(not library.available(),
                                   reason=f"native library unavailable: {library.unavailable_reason()}")


def _tie_heavy(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=g).to(torch.bfloat16)  # 7 values: ties everywhere


@needs_library
@pytest.mark.parametrize("width", [1, 5, 16, 17, 33, 4096 + 7, 49152])
def test_first_max_is_argmax(width):
    x = _tie_heavy((3, 4, width), width)
    assert torch.equal(pick.first_max(x), x.argmax(dim=-1))
    x[1, 2, width // 2] = float("nan")  # NaN wins, the first one
    x[2, 0, -1] = float("nan")
    x[2, 0, width // 3] = float("nan")
    assert torch.equal(pick.first_max(x), x.argmax(dim=-1))
    x[0, 1] = float("-inf")  # all -inf: index 0
    x[0, 3] = float("inf")
    assert torch.equal(pick.first_max(x), x.argmax(dim=-1))


@needs_library
def test_first_max_reads_views_and_large_magnitudes():
    x = torch.randn(2, 40, 100).mul(1e30).to(torch.bfloat16)[:, ::3, :77]  # not contiguous
    assert torch.equal(pick.first_max(x), x.argmax(dim=-1))
    x = torch.zeros(2, 64, dtype=torch.bfloat16)
    x[0, 5], x[0, 9], x[1, 40] = -0.0, 0.0, 1.0  # -0 == +0: the first zero wins
    assert torch.equal(pick.first_max(x), x.argmax(dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_first_max_other_dtypes_take_torch(dtype):
    x = _tie_heavy((2, 3, 50), 1).to(dtype)
    assert torch.equal(pick.first_max(x), x.argmax(dim=-1))


@needs_library
@pytest.mark.parametrize("width,k", [(8192, 2), (8192, 4), (37, 3), (16, 16), (5, 1), (300, 64)])
def test_top_log_softmax_is_the_top_of_log_softmax(width, k):
    g = torch.Generator().manual_seed(width + k)
    for x in (torch.randn(2, 3, width, generator=g).mul(4).to(torch.bfloat16), _tie_heavy((2, 3, width), k)):
        values, indices = pick.top_log_softmax(x, k)
        assert values.dtype == torch.float32 and values.shape == indices.shape == (2, 3, k)
        want = x.float().sort(dim=-1, descending=True, stable=True).indices[..., :k]  # ties: lower index
        assert torch.equal(indices, want)
        ref = torch.log_softmax(x.float(), dim=-1).gather(-1, indices)
        torch.testing.assert_close(values, ref, rtol=0, atol=2e-5)


@needs_library
def test_top_log_softmax_edge_rows():
    x = torch.randn(3, 40).to(torch.bfloat16)
    x[1, 7] = float("nan")  # a NaN row: NaN values, no crash
    x[2] = float("-inf")
    x[2, 30] = 0.0
    values, indices = pick.top_log_softmax(x, 2)
    assert torch.isnan(values[1]).all()
    assert indices[2, 0] == 30 and values[2, 0] == 0.0 and values[2, 1] == float("-inf")


def test_top_log_softmax_torch_path_beyond_the_c_limit():
    x = torch.randn(2, 200).to(torch.bfloat16)
    values, indices = pick.top_log_softmax(x, pick.MAX_K + 1)
    top = torch.log_softmax(x.float(), dim=-1).topk(pick.MAX_K + 1, dim=-1)
    assert torch.equal(values, top.values) and torch.equal(indices, top.indices)
