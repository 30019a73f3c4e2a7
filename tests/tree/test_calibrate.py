import json

import pytest
import torch

from medusa import MedusaModel, MedusaTree
from medusa.calibrate.auto import AUTO_SIZES, choose_size, time_tree_steps
from medusa.calibrate.calibrate import (
    NO_TARGET,
    HeadStats,
    accuracy_tables,
    build_choices,
    calibrate,
    collect_hit_ranks,
    empirical_tokens_per_step,
    path_counts,
    simulated_tokens_per_step,
)
from medusa.cli import main

from tiny_models import STORIES, require_shared, tiny_model


def _perturbed(num_heads=3, seed=0):
    torch.manual_seed(seed)
    model = MedusaModel.from_base(tiny_model("llama"), num_heads=num_heads, num_layers=1)
    with torch.no_grad():
        for p in model.heads.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def _examples(n=5, vocab=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = 9 + 3 * i
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        prompt = 2 + i % 3
        labels = [-100] * prompt + ids[prompt:]
        if i == 2:
            labels[prompt + 2] = -100  # a hole in the labels (e.g. a user turn)
        out.append({"input_ids": ids, "labels": labels})
    return out


def _naive_ranks(model, example, topk):
    """Hit ranks of one example, alone and unpadded: ``ranks[t][k]`` (-1 miss, NO_TARGET no target)."""
    ids, labels = example["input_ids"], example["labels"]
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids])).hidden_states[0]  # [T, d]
        tops = [model.heads.head_logits(k, hidden).topk(topk, dim=-1).indices.tolist()
                for k in range(model.num_heads)]
    ranks = [[NO_TARGET] * model.num_heads for _ in ids]
    for k, top in enumerate(tops):
        for t in range(len(ids)):
            j = t + k + 2
            if j < len(ids) and labels[j] != -100:
                ranks[t][k] = top[t].index(ids[j]) if ids[j] in top[t] else -1
    return ranks


def test_hit_ranks_match_a_naive_reference():
    model = _perturbed()
    examples = _examples()
    topk = 4
    stats = collect_hit_ranks(model, examples, topk=topk, batch_size=2, chunk=3, progress=False)
    for ex, ranks, start in zip(examples, stats.ranks, stats.starts):
        assert start == next(i for i, l in enumerate(ex["labels"]) if l != -100)
        assert ranks.tolist() == _naive_ranks(model, ex, topk)


def _stats(rows, topk=3):
    return HeadStats(ranks=[torch.tensor(rows, dtype=torch.int8)], starts=[1], topk=topk,
                     num_tokens=len(rows))


def test_tables_paths_and_predictions_by_hand():
    rows = [[0, 0], [0, 1], [1, -1], [-1, 0], [0, NO_TARGET], [NO_TARGET, NO_TARGET]]
    stats = _stats(rows)
    t = accuracy_tables(stats)
    assert t["totals"] == [5, 4] and t["counts"] == [[3, 1, 0], [2, 1, 0]]
    # head 2 given head 1 right (rows 0, 1, 2; row 4 has no target for head 2)
    assert t["conditional_totals"] == [5, 3] and t["conditional_counts"][1] == [1, 1, 0]
    assert (t["accuracy"][0][0] == pytest.approx(0.6)
            and t["conditional_accuracy"][1][0] == pytest.approx(1 / 3))
    counts, total = path_counts(stats)
    assert total == 4  # positions with both targets present
    assert counts == {(0,): 2, (1,): 1, (0, 0): 1, (0, 1): 1}
    choices = build_choices(stats, t, counts, total, 3, "empirical")
    assert choices[0] == (0,) and len(choices) == 2
    # by frequency, not by the product of accuracies: (0, 0) (seen once) beats (2,) (never seen) although
    # head 1's rank-2 accuracy makes (2,)'s product larger
    counts2, acc2 = {(0,): 4, (0, 0): 1}, [[0.5, 0.0, 0.4], [0.1, 0.0, 0.0]]
    stats2 = _stats([[0, 0]])
    assert build_choices(stats2, {"accuracy": acc2, "conditional_accuracy": acc2}, counts2, 8,
                         3) == [(0,), (0, 0)]
    assert build_choices(stats2, {"accuracy": acc2, "conditional_accuracy": acc2}, counts2, 8, 3,
                         "conditional") == [(0,), (2,)]
    assert empirical_tokens_per_step([(0,), (0, 0)], counts, total) == pytest.approx(1 + 2 / 4 + 1 / 4)


def test_simulation_replays_the_decode_loop():
    # start=1: the prefill writes token 1; steps run at hidden positions 0, then jump by tokens gained
    rows = [[0, 0], [0, 0], [-1, 0], [1, 0], [0, -1], [0, NO_TARGET], [NO_TARGET, NO_TARGET],
            [NO_TARGET, NO_TARGET]]
    stats = _stats(rows)
    # s=0: path (0,0) -> 3 tokens (2..4); s=3: (1,) in tree, (1,0) not -> 2 (5, 6); s=5: (0,) accepts
    # token 7, the last one (the bonus would be past the end) -> 1; s=6 stops
    assert simulated_tokens_per_step([(0,), (1,), (0, 0)], stats) == pytest.approx((3 + 2 + 1) / 3)
    # only the root: one token per step
    assert simulated_tokens_per_step([], stats) == pytest.approx(1.0)


def test_calibrate_record_and_budget():
    model = _perturbed()
    tree = calibrate(model, _examples(8), nodes=10, topk=5, progress=False, data_name="mem")
    cal = tree.calibration
    assert len(tree) == 10 and tree.depth <= 3 and tree.num_heads == 3
    assert cal["nodes"] == 10 and cal["data"] == "mem" and len(cal["accuracy"]) == 3
    assert all(len(r) == 5 for r in cal["accuracy"]) and cal["top1"] == [r[0] for r in cal["accuracy"]]
    # the record's figures against an independent replay on naively computed hit ranks
    ranks = [_naive_ranks(model, ex, 5) for ex in _examples(8)]
    assert cal["expected_tokens_per_step"] == pytest.approx(_naive_replay(set(tree.choices),
                                                                          ranks, _examples(8)))
    full = [r for rs in ranks for r in rs if NO_TARGET not in r]  # positions with all 3 targets
    assert cal["num_positions"] == len(full)
    assert cal["position_mean_tokens_per_step"] == pytest.approx(
        1 + sum(_accepted(set(tree.choices), r) for r in full) / len(full))
    valid = [[r[k] for rs in ranks for r in rs if r[k] != NO_TARGET] for k in range(3)]
    assert cal["top1"] == pytest.approx([v.count(0) / len(v) for v in valid])
    json.dumps(tree.to_dict())  # serialisable
    shallow = calibrate(model, _examples(8), nodes=10, topk=5, max_depth=1, progress=False)
    assert shallow.depth == 1
    with pytest.raises(Exception, match="deeper"):
        calibrate(model, _examples(8), nodes=10, max_depth=4, progress=False)


def _accepted(tree, ranks):
    """How many tree nodes greedy verification accepts at a position with hit ranks ``ranks``."""
    n = 0
    while n < len(ranks) and ranks[n] >= 0 and tuple(ranks[:n + 1]) in tree:
        n += 1
    return n


def _naive_replay(tree, ranks, examples):
    """Tokens per step of greedy tree decoding replayed on each example from its first labelled token."""
    tokens = steps = 0
    for rs, ex in zip(ranks, examples):
        labels = ex["labels"]
        pos = next(i for i in range(1, len(labels)) if labels[i] != -100) - 1  # the prefill's hidden position
        last = len(labels) - 1
        while pos + 2 <= last:  # a step writes tokens pos + 2 .. pos + 2 + accepted, the last one at most
            gained = min(1 + _accepted(tree, rs[pos]), last - pos - 1)
            tokens, steps, pos = tokens + gained, steps + 1, pos + gained
    return tokens / steps


def test_time_tree_steps_takes_the_fastest_step_after_warm_up(monkeypatch):
    """Each size's time is decode time / steps of its fastest timed run; the warm-up round never counts."""
    import types

    import medusa.calibrate.auto as A

    trees = {4: [(0,), (1,), (0, 0)], 3: [(0,), (0, 0)]}
    runs = {4: iter([(0.001, 1), (0.8, 4), (0.3, 3), (1.0, 4)]),  # (decode seconds, steps); warm-up first
            3: iter([(0.0001, 1), (0.3, 2), (0.5, 2), (0.2, 1)])}
    seen = []

    def fake_generate(model, ids, max_new_tokens, tree, return_dict_in_generate):
        n = len(tree)
        seen.append((n, ids.tolist()))
        seconds, steps = next(runs[n])
        return types.SimpleNamespace(decode_time_s=seconds, num_steps=steps)

    monkeypatch.setattr(A, "medusa_generate", fake_generate)
    times = time_tree_steps(types.SimpleNamespace(num_heads=2), trees, [5, 6, 7], new_tokens=8, repeats=3)
    assert times == {4: pytest.approx(0.1), 3: pytest.approx(0.15)}
    assert [n for n, _ in seen] == [4, 3] * 4  # sizes interleaved round by round
    assert all(ids == [[5, 6, 7]] for _, ids in seen)
    runs[4] = iter([(0.0, 0)] * 4)
    runs[3] = iter([(0.1, 1)] * 4)
    with pytest.raises(Exception, match="stopped at the first token"):
        time_tree_steps(types.SimpleNamespace(num_heads=2), trees, [5], repeats=3)


def test_choose_size_maximises_predicted_tokens_per_second(monkeypatch):
    import types

    import medusa.calibrate.auto as A

    monkeypatch.setattr(A, "time_tree_steps", lambda model, trees, prompt: {8: 1.0, 16: 1.5, 32: 4.0})
    record = choose_size(types.SimpleNamespace(device="cpu"), {8: [], 16: [], 32: []},
                         {8: 1.5, 16: 2.4, 32: 3.0}, [1, 2])
    assert record["chosen"] == 16  # 1.5, 1.6, 0.75 tokens/s: not the most tokens/step nor the fastest step
    assert record["sizes"] == [8, 16, 32] and record["tokens_per_s"] == pytest.approx([1.5, 1.6, 0.75])
    assert record["step_time_s"] == [1.0, 1.5, 4.0] and record["expected_tokens_per_step"] == [1.5, 2.4, 3.0]


@pytest.fixture(scope="module")
def stories_checkpoint(tmp_path_factory):
    require_shared(STORIES)
    from tiny_models import stories_model

    path = tmp_path_factory.mktemp("cal") / "heads"
    MedusaModel.from_base(stories_model(), num_heads=3, num_layers=1).save_pretrained(path)
    data = path.parent / "calib.jsonl"
    rows = [{"prompt": "Once upon a time",
             "completion": " there was a little girl named Lily. She liked to play."},
            {"prompt": "Tom had a dog.",
             "completion": " The dog was big and brown. Tom and the dog ran to the park."}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, data


def test_cli_calibrate_writes_tree_and_plots(stories_checkpoint, tmp_path, capsys):
    path, data = stories_checkpoint
    heads_before = (path / "medusa_heads.safetensors").read_bytes()
    assert main(["calibrate", "--heads", str(path), "--data", str(data), "--nodes", "12", "--topk", "4",
                 "--plots", str(tmp_path), "--quiet"]) == 0
    assert (path / "medusa_heads.safetensors").read_bytes() == heads_before
    tree = MedusaTree.from_json(path / "tree.json")
    assert len(tree) == 12 and tree.calibration["data"] == str(data)
    for png in ("calibration_accuracy.png", "tree.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = MedusaModel.from_pretrained(path)
    assert loaded.tree == tree
    assert "expected" in capsys.readouterr().out


def test_cli_calibrate_auto_nodes(stories_checkpoint, tmp_path, capsys):
    path, data = stories_checkpoint
    if (path / "tree.json").exists():  # an earlier calibration is replaced only with --overwrite
        before = (path / "tree.json").read_bytes()
        assert main(["calibrate", "--heads", str(path), "--data", str(data), "--no-plots", "--quiet"]) == 2
        assert "tree.json: exists; pass --overwrite" in capsys.readouterr().err
        assert (path / "tree.json").read_bytes() == before
    assert main(["calibrate", "--heads", str(path), "--data", str(data), "--nodes", "auto", "--no-plots",
                 "--quiet", "--overwrite"]) == 0
    cal = MedusaTree.from_json(path / "tree.json").calibration
    auto = cal["auto"]
    assert auto["chosen"] in auto["sizes"] and len(auto["step_time_s"]) == len(auto["sizes"])
    best = max(range(len(auto["sizes"])), key=lambda i: auto["tokens_per_s"][i])
    assert auto["sizes"][best] == auto["chosen"]
    assert cal["nodes"] <= auto["chosen"]
    assert auto["sizes"] == list(AUTO_SIZES) and max(AUTO_SIZES) <= 64  # the "<= 64 nodes" the CLIs document


def test_pipeline_and_cli_auto_share_the_chooser(stories_checkpoint, tmp_path, monkeypatch):
    """``medusa calibrate --nodes auto`` and the demo/bench pipelines' calibrate stage pick the size alike:
    with step times that make 24 nodes the fastest by far, both choose 24."""
    import medusa.calibrate.auto as A
    from medusa.pipelines.stages import calibrate_stage

    monkeypatch.setattr(A, "time_tree_steps", lambda model, trees,
                        prompt: {n: 1.0 if n == 24 else 1e6 for n in trees})
    path, data = stories_checkpoint
    summary = calibrate_stage(path, tmp_path / "final", data, nodes="auto", progress=False)
    assert summary["auto"]["chosen"] == 24 and summary["auto"]["sizes"] == list(AUTO_SIZES)
    assert main(["calibrate", "--heads", str(path), "--data", str(data), "--nodes", "auto", "--no-plots",
                 "--quiet", "--overwrite"]) == 0
    cli = MedusaTree.from_json(path / "tree.json")
    assert cli.calibration["auto"]["chosen"] == 24
    assert MedusaTree.from_json(tmp_path / "final" / "tree.json") == cli


def test_cli_calibrate_bad_input(stories_checkpoint, tmp_path, capsys):
    path, data = stories_checkpoint
    for argv, needle in (
        (["--heads", str(tmp_path), "--data", str(data)], "medusa_config.json"),
        (["--heads", str(path), "--data", str(data), "--max-depth", "4"], "--max-depth"),
        (["--heads", str(path), "--data", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
        (["--heads", str(path), "--data", str(data), "--method", "magic"], "magic"),
    ):
        capsys.readouterr()
        assert main(["calibrate", *argv, "--quiet", "--no-plots"]) == 2
        err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
        assert len(err) == 1 and needle in err[0], err


def _greedy_examples(model, tokenizer, prompts, new_tokens):
    rows = []
    for p in prompts:
        ids = tokenizer(p, return_tensors="pt").input_ids  # [1, P]
        with torch.no_grad():
            out = model.base_model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
        seq, n = out[0].tolist(), ids.shape[1]
        rows.append({"input_ids": seq, "labels": [-100] * n + seq[n:]})
    return rows


def test_prediction_within_15_percent_of_measured_greedy_decoding():
    """stories260K with fitted heads: calibrate on the model's greedy replies to some held-out prompts,
    then decode other held-out prompts greedily with the calibrated tree and compare tokens/step."""
    from fit_heads import fitted_stories_heads, stories_prompts
    from tiny_models import stories_tokenizer

    model = fitted_stories_heads(4, 1)
    tokenizer = stories_tokenizer()
    prompts = stories_prompts(24)
    examples = _greedy_examples(model, tokenizer, prompts[:12], 64)
    def measured(tree, ps):
        lengths = []
        for p in ps:
            ids = tokenizer(p, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=64, tree=tree, return_dict_in_generate=True)
            lengths += out.accept_lengths[0]
        return sum(lengths) / len(lengths)

    for nodes in (8, 32):
        tree = calibrate(model, examples, nodes=nodes, progress=False)
        predicted = tree.calibration["expected_tokens_per_step"]
        held_out = measured(tree, prompts[12:])
        assert held_out > 1.3, held_out  # the heads are accepted at all
        assert abs(predicted - held_out) / held_out < 0.15, (nodes, predicted, held_out)
        if nodes == 8:  # on the calibration replies themselves the replay is the decode loop, exactly
            assert predicted == pytest.approx(measured(tree, prompts[:12]), rel=1e-9)
