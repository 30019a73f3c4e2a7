"""medusa.calibrate.auto (``--nodes auto``): each size's step time is its fastest timed decode run, and
the chooser maximises predicted tokens per second. (Through the command and the pipeline:
tests/cli/test_calibrate.py, tests/integration/test_calibrate_auto_nodes.py.)"""

import pytest

from medusa.calibrate.auto import choose_size, time_tree_steps


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
