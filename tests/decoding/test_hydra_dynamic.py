"""Hydra heads and dynamic trees decode losslessly: greedy == HF greedy (stories260K with fitted heads,
batch 1 and a left-padded batch of 3; tiny models) and ``acceptance="sample"`` passes the chi-square test."""

import pytest
import torch
from chi_square import chi2_pvalue, exact_joint
from decoding_helpers import check_stories_greedy, left_padded_batch, memorise_heads, real_rows

from medusa import MedusaModel, MedusaTree
from medusa.decoding.acceptance import warp_logits
from medusa.decoding.dynamic_tree import DynamicTree
from medusa.errors import MedusaError

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer, tiny_model

NEW = 96


@pytest.fixture(scope="module")
def hydra():
    return fitted_stories_heads(num_heads=4, num_layers=1, head_type="hydra")


@pytest.fixture(scope="module")
def medusa():
    return fitted_stories_heads(num_heads=4, num_layers=1)


def _check_greedy(model, tree, min_tokens_per_step):
    return check_stories_greedy(model, tree, NEW, min_tokens_per_step)[0].tokens_per_step


@pytest.mark.parametrize("tree", [None, "dynamic:16", DynamicTree(num_nodes=48, branch=8)],
                         ids=["static", "dynamic16", "dynamic48-branch8"])
def test_hydra_greedy_equals_hf(hydra, tree):
    _check_greedy(hydra, tree, 1.8)


@pytest.mark.parametrize("nodes", [8, 32])
def test_medusa_dynamic_tree_greedy_equals_hf(medusa, nodes):
    _check_greedy(medusa, f"dynamic:{nodes}", 1.8)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
@pytest.mark.parametrize("head_type", ["linear", "hydra"])
def test_greedy_tiny_models_static_and_dynamic(arch, head_type):
    base = tiny_model(arch)
    ids, mask = left_padded_batch(base.config.vocab_size, seed=3)
    ref = base.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=40)
    model = MedusaModel.from_base(base, num_heads=3, head_type=head_type)
    # heads fitted to rows 0 and 1 only: those accept whole depth-3 paths, row 2 little (uneven compaction)
    memorise_heads(model, real_rows(ref, mask, base.generation_config.eos_token_id)[:2], steps=150)
    small = MedusaTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    for tree in (small, "dynamic:10"):
        out = model.generate(ids, attention_mask=mask, max_new_tokens=40, tree=tree,
                             return_dict_in_generate=True)
        assert torch.equal(out.sequences, ref), (head_type, tree)
        assert max(max(a) for a in out.accept_lengths) == 4, out.accept_lengths  # depth-3 paths accepted
        assert out.tokens_per_step > 1.8, out.accept_lengths


def test_dynamic_tree_spec_errors(medusa):
    ids = torch.tensor([[1, 20, 30]])
    with pytest.raises(MedusaError, match="'dynamic' or 'dynamic:N'"):
        medusa.generate(ids, max_new_tokens=4, tree="dynamic:many")


V = 8
FULL_TREE = [[r] for r in range(V)] + [[0, r] for r in range(V)] + [[1, 0], [1, 1], [0, 0, 0]]
PARTIAL_TREE = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]


def _sampler(head_type):
    base = tiny_model("llama", vocab_size=V, seed=0)
    with torch.no_grad():  # soften the scaled LM head so that many tokens have real mass
        base.lm_head.weight.mul_(0.3)
    model = MedusaModel.from_base(base, num_heads=3, head_type=head_type)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.heads.parameters():
            if p.dim() == 2 and p.shape[0] != V:  # ResBlocks / Hydra input layers, not W2
                p.copy_(torch.randn(p.shape, generator=g))
    return base, model


@pytest.mark.parametrize("setting", [{"temperature": 1.0, "top_k": 0}, {"temperature": 0.7, "top_k": 4}],
                         ids=["t1", "t0.7-topk4"])
@pytest.mark.parametrize("head_type,tree", [("hydra", FULL_TREE), ("hydra", PARTIAL_TREE),
                                            ("hydra", "dynamic:12"), ("linear", "dynamic:12"),
                                            ("linear", "dynamic:5")])
def test_sample_is_lossless_chi_square(head_type, tree, setting):
    base, model = _sampler(head_type)
    prompt = torch.tensor([[3, 5, 4, 6]])
    n = 6000
    g = torch.Generator().manual_seed(1234)
    tree = MedusaTree.from_choices(tree) if isinstance(tree, list) else tree
    out = model.generate(prompt.repeat(n, 1), max_new_tokens=2, acceptance="sample", eos_token_id=[],
                         tree=tree, generator=g, **setting)
    x1, x2 = out[:, 4], out[:, 5]
    counts = torch.zeros(V * V, dtype=torch.float64).index_add_(0, x1 * V + x2,
                                                                torch.ones(n, dtype=torch.float64))
    expected = exact_joint(base, prompt, warp_logits(**setting)).view(-1) * n
    assert chi2_pvalue(counts, expected) > 1e-3


def test_cli_generate_hydra_with_dynamic_tree(hydra, tmp_path, capsys):
    from medusa.cli import main

    heads = tmp_path / "hydra"
    hydra.save_pretrained(heads)
    prompt = stories_prompts(1)[0]
    assert main(["generate", "--heads", str(heads), "--prompt", prompt, "--max-new-tokens", "40",
                 "--tree", "dynamic", "--nodes", "16"]) == 0
    text = capsys.readouterr().out
    tok = stories_tokenizer()
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = hydra.base_model.generate(ids, do_sample=False, max_new_tokens=40)
    assert tok.decode(ref[0], skip_special_tokens=True) in text and "tokens/step" in text
    assert main(["generate", "--heads", str(heads), "--prompt", prompt, "--nodes", "16"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --nodes")
