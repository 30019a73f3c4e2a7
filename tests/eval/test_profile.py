"""``medusa generate --profile`` (medusa.eval.profile): the printed profile with the overhead floor and the
op counts, on fitted heads; the text layout from fixed figures."""

import re

from medusa.eval.profile import format_profile

from fit_heads import fitted_stories_heads, stories_prompts


def test_generate_profile_cli_prints_the_floor_and_the_ops(tmp_path, capsys):
    from medusa.cli import main

    fitted_stories_heads(4, 1).save_pretrained(tmp_path / "heads")
    code = main(["generate", "--heads", str(tmp_path / "heads"), "--prompt", stories_prompts(1)[0],
                 "--max-new-tokens", "16", "--profile"])
    out = capsys.readouterr().out
    assert code == 0
    assert "overhead floor" in out and "per MEDUSA step vs" in out and "identical to HF      True" in out
    tokens_per_step = float(re.search(r"^tokens/step +([0-9.]+)$", out, re.M).group(1))
    assert tokens_per_step > 1.5  # identical with tree paths accepted, not by the root alone
    line = re.search(r"^step phases \(ms\) +(.*)$", out, re.M).group(1)
    phases = dict(re.findall(r"([a-z ]+) ([0-9.]+)", line))
    assert list(phases) == ["drafting", " target forward", " acceptance", " host", " cache", " loop"]
    assert float(phases[" target forward"]) > 0 and float(phases["drafting"]) > 0


def test_step_phases_add_up_to_the_decode_time():
    import torch

    from medusa.decoding.step import PHASES, PhaseClock
    from medusa.eval.profile import step_phases

    from tiny_models import stories_tokenizer

    model = fitted_stories_heads(4, 1)
    ids = stories_tokenizer()(stories_prompts(1)[0], return_tensors="pt").input_ids
    phases = step_phases(model, ids, 12, None)
    assert list(phases) == [*PHASES, "loop"] and all(v >= 0 for v in phases.values())
    clock = PhaseClock()
    out = model.generate(ids, max_new_tokens=12, return_dict_in_generate=True, step_clock=clock)
    assert clock.steps == out.num_steps and 0 < sum(clock.seconds.values()) <= out.decode_time_s
    plain = model.generate(ids, max_new_tokens=12)
    assert torch.equal(out.sequences, plain)  # the clock changes nothing in the output


def test_profile_without_a_decoding_step_is_an_error():
    import pytest

    from medusa.errors import MedusaError
    from medusa.eval.profile import profile_decoding

    from tiny_models import stories_tokenizer

    with pytest.raises(MedusaError, match="no decoding step ran .*a chat model needs --chat"):
        profile_decoding(fitted_stories_heads(4, 1), stories_tokenizer(), stories_prompts(1),
                         max_new_tokens=1)


def test_format_profile_lays_out_the_figures():
    s = {"tree_nodes": None, "prompts": 2, "max_new_tokens": 16, "tokens_per_step": 2.5,
         "medusa_step_ms": 3.0, "plain_step_ms": 2.0, "overhead": 1.5, "medusa_tokens_per_s": 700.4,
         "hf_tokens_per_s": 500.0, "speedup_vs_hf_generate": 1.4008, "all_identical_to_hf": True}
    lines = format_profile(s).splitlines()
    assert lines == ["tree default nodes, 2 prompts x 16 tokens", "tokens/step          2.50",
                     "MEDUSA step          3.00 ms", "plain decode step    2.00 ms",
                     "overhead             1.50",
                     "MEDUSA tokens/s      700", "HF generate tokens/s 500", "speedup              1.40x",
                     "identical to HF      True"]
    s.update(tree_nodes=16, verify_forward_ms=2.4, plain_forward_ms=1.6, overhead_floor=1.5,
             medusa_ops_per_step=120, hf_ops_per_token=80,
             added_ops={"aten::topk": 1.0, "aten::gather": 2.0, "aten::add": -0.5})
    text = format_profile(s)
    assert text.startswith("tree 16 nodes, 2 prompts x 16 tokens\n")
    s["phases_ms_per_step"] = {"drafting": 0.5, "target_forward": 2.0}
    assert "\nstep phases (ms)     drafting 0.50, target forward 2.00\n" in format_profile(s)
    assert text.splitlines()[-2:] == [
        "verify forward alone 2.40 ms vs 1-token forward 1.60 ms: overhead floor 1.50",
        "compute ops          120 per MEDUSA step vs 80 per HF token (added: topk +1, gather +2, add -0.5)"]


def test_profile_runs_for_an_eagle3_drafter():
    """``--profile`` on eagle3 heads: the drafter's per-step tree is timed as a static tree of as many nodes
    (it raised AttributeError on DraftTreeShape.paths)."""
    from medusa import MedusaModel
    from medusa.eval.profile import profile_decoding

    from tiny_models import stories_model, stories_tokenizer

    model = MedusaModel.from_base(stories_model(), num_heads=2, head_type="eagle3").eval()
    s = profile_decoding(model, stories_tokenizer(), stories_prompts(1), max_new_tokens=8, repeats=1)
    assert s["all_identical_to_hf"] and s["overhead_floor"] > 0
    assert s["phases_ms_per_step"]["drafting"] > 0 and s["phases_ms_per_step"]["target_forward"] > 0
