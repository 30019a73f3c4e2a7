"""``medusa generate --profile`` (medusa.eval.profile): the printed profile with the overhead floor and the
op counts, on fitted heads; the text layout from fixed figures."""

import re

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
