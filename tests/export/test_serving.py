"""medusa.export.serving: the commands that load an export in its engine, and what official MEDUSA needs."""

import json
import shlex

import pytest

from medusa.export.serving import (
    OFFICIAL_NUM_HEADS,
    official_depth,
    official_note,
    serving_commands,
    trt_convert_command,
)


def test_official_depth_is_capped_at_the_heads_official_medusa_builds():
    assert [official_depth(k) for k in (1, 3, 5, 6, 9)] == [1, 3, 5, 5, 5]
    assert OFFICIAL_NUM_HEADS == 5


@pytest.mark.parametrize("num_heads, depth, says", [
    (3, 3, "3 are ours, heads 4..5 stay randomly initialised"),
    (5, 4, "all 5 are ours"),
    (7, 5, "it loads our first 5 and ignores heads 6..7"),
])
def test_official_note(num_heads, depth, says):
    note = official_note(num_heads, depth)
    assert says in note and f"(depth {depth} <= {official_depth(num_heads)})" in note
    assert note.startswith("official MEDUSA (medusa_model.py) builds 5 heads: ")


def test_trt_convert_command_passes_every_count_and_a_known_dtype():
    argv = shlex.split(trt_convert_command("/x/out dir", "/models/base", 3, 2, 17, "bfloat16"))
    assert argv[:2] == ["python", "examples/medusa/convert_checkpoint.py"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags == {"--model_dir": "/models/base", "--medusa_model_dir": "/x/out dir",
                     "--output_dir": "/x/out dir-tllm-checkpoint", "--dtype": "bfloat16",
                     "--num_medusa_heads": "3", "--num_medusa_layers": "2", "--max_medusa_token_len": "17"}
    assert "--dtype" not in trt_convert_command("o", "b", 3, 1, 8, "float64")  # not a converter choice


def test_vllm_commands_name_the_backbone_the_count_and_the_hub_id():
    serve, offline = serving_commands("vllm", "/e/vllm", "/m/base", None, 3, 1, None, "float32",
                                      hub_id="org/model")
    cmd, comment = serve.split("  # ")
    argv = shlex.split(cmd)
    assert argv[:3] == ["vllm", "serve", "/m/base"] and len(argv) == 5 and comment == "org/model"
    assert json.loads(argv[4]) == {"method": "medusa", "model": "/e/vllm", "num_speculative_tokens": 3}
    assert offline.startswith("LLM(model='/m/base', speculative_config={'method': 'medusa'")
    serve, _ = serving_commands("vllm", "/e/vllm", "/m/base", "/m/tok", 4, 1, None, "float32")
    assert shlex.split(serve)[-2:] == ["--tokenizer", "/m/tok"]  # a tokenizer elsewhere is passed
    assert "#" not in serve  # no hub id: no comment


def test_tgi_tensorrt_and_official_commands():
    assert serving_commands("tgi", "/e/tgi", "/m/base", None, 2, 1, None, "float16") == [
        "text-generation-launcher --model-id /e/tgi"]
    convert, build, run = serving_commands("tensorrt-llm", "/e/trt", "/m/base", None, 2, 1, 9, "float16")
    assert convert == trt_convert_command("/e/trt", "/m/base", 2, 1, 9, "float16")
    assert shlex.split(build)[:3] == ["trtllm-build", "--checkpoint_dir", "/e/trt-tllm-checkpoint"]
    assert "--tokenizer_dir /m/base" in run and run.endswith(
        ' --medusa_choices="$(cat /e/trt/medusa_choices.txt)"')
    (official,) = serving_commands("medusa-v1", "/e/v1", "/m/base", None, 2, 1, 9, "float16")
    assert official.startswith("model = MedusaModel.from_pretrained('/e/v1'); ")
    assert "medusa_choices=json.load(open('/e/v1/medusa_choices.txt'))" in official
