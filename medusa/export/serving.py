"""The commands that load an export in its engine, filled in from the checkpoint, and what each engine needs.

- vLLM reads the head count from ``n_predict`` (``num_speculative_tokens`` defaults to it); the commands
  pass it anyway (``--speculative-config`` JSON, and the offline ``LLM(...)`` equivalent); the target model
  is the backbone (a packaged base's local directory, its hub id as a comment). vLLM 0.32 runs float32
  models as bfloat16 on CPU unless told ``dtype="float32"``, which greedy text identical to the base's needs.
- TensorRT-LLM's ``examples/medusa/convert_checkpoint.py`` writes ``num_medusa_heads`` / ``num_medusa_layers``
  / ``max_draft_len`` into the engine config from its own flags (defaults 4 / 1 / 63) BEFORE it reads the
  Medusa directory: every one must be given, or a 2-layer export builds 1 layer and a 3-head one 4 heads.
  ``--dtype`` (default float16) is the checkpoint's where the converter accepts it.
- TGI reads everything from the export's ``config.json``.
- Official MEDUSA (FasterDecoding/Medusa ``medusa_model.py``) builds :data:`OFFICIAL_NUM_HEADS` heads whatever
  ``medusa_num_heads`` says and loads ours non-strictly, so ``medusa_choices`` must not reach deeper than the
  heads it really loaded (its default trees reach depth 4).
"""

from __future__ import annotations

import json
import shlex

OFFICIAL_NUM_HEADS = 5  # medusa_model.py: ``base_model_config.medusa_num_heads = 5`` (its "TODO: fix")
OFFICIAL_MODEL_TYPES = ("llama", "mistral")  # medusa_model.py: "Only support llama and mistral for now!!"
TRT_DTYPES = ("float32", "bfloat16", "float16")  # convert_checkpoint.py --dtype choices


def official_depth(num_heads: int) -> int:
    """The deepest tree official MEDUSA can run on our heads: it loads at most its 5 heads."""
    return min(num_heads, OFFICIAL_NUM_HEADS)


def official_note(num_heads: int, depth: int) -> str:
    loaded = official_depth(num_heads)
    if num_heads < OFFICIAL_NUM_HEADS:
        what = (f"{num_heads} are ours, heads {num_heads + 1}..{OFFICIAL_NUM_HEADS} stay randomly "
                f"initialised")
    elif num_heads > OFFICIAL_NUM_HEADS:
        what = f"it loads our first {loaded} and ignores heads {loaded + 1}..{num_heads}"
    else:
        what = "all 5 are ours"
    return (f"official MEDUSA (medusa_model.py) builds {OFFICIAL_NUM_HEADS} heads: {what}; pass "
            f"medusa_choices from medusa_choices.txt (depth {depth} <= {loaded}), never its default trees "
            f"(depth 4), to medusa_generate")


def trt_convert_command(out: str, backbone: str, num_heads: int, num_layers: int, max_draft_len: int,
                        dtype: str) -> str:
    args = ["python", "examples/medusa/convert_checkpoint.py", "--model_dir", backbone,
            "--medusa_model_dir", out, "--output_dir", f"{out}-tllm-checkpoint"]
    if dtype in TRT_DTYPES:
        args += ["--dtype", dtype]
    args += ["--num_medusa_heads", str(num_heads), "--num_medusa_layers", str(num_layers),
             "--max_medusa_token_len", str(max_draft_len)]
    return shlex.join(args)


def vllm_commands(out: str, backbone: str, tokenizer: str, num_heads: int, hub_id: str | None) -> list[str]:
    """``vllm serve`` with ``--speculative-config``, and the offline ``LLM(...)`` (Python) equivalent."""
    spec = {"method": "medusa", "model": out, "num_speculative_tokens": num_heads}
    extra = [] if tokenizer == backbone else ["--tokenizer", tokenizer]
    comment = f"  # {hub_id}" if hub_id and hub_id != backbone else ""
    serve = shlex.join(["vllm", "serve", backbone, "--speculative-config", json.dumps(spec), *extra])
    tok = "" if tokenizer == backbone else f", tokenizer={tokenizer!r}"
    offline = f"LLM(model={backbone!r}{tok}, speculative_config={spec!r})"
    return [serve + comment, offline + comment]


def serving_commands(format: str, out: str, backbone: str, tokenizer: str | None, num_heads: int,
                     num_layers: int, num_choices: int | None, dtype: str,
                     hub_id: str | None = None) -> list[str]:
    """Shell commands (or, for official MEDUSA and vLLM's offline engine, Python) that load the export at
    ``out``; ``hub_id``: the hub model a local backbone was converted from (shown as a comment)."""
    tok = tokenizer or backbone
    if format == "vllm":
        return vllm_commands(out, backbone, tok, num_heads, hub_id)
    if format == "tgi":
        return [shlex.join(["text-generation-launcher", "--model-id", out])]
    if format == "tensorrt-llm":
        assert num_choices is not None
        engine = f"{out}-tllm-engine"
        return [trt_convert_command(out, backbone, num_heads, num_layers, num_choices, dtype),
                shlex.join(["trtllm-build", "--checkpoint_dir", f"{out}-tllm-checkpoint", "--output_dir",
                            engine, "--max_batch_size", "8"]),
                shlex.join(["python", "examples/run.py", "--engine_dir", engine, "--tokenizer_dir", tok,
                            "--use_py_session", "--temperature", "0.0", "--max_output_len", "100",
                            "--input_text", "Once upon"])
                + f' --medusa_choices="$(cat {shlex.quote(out + "/medusa_choices.txt")})"']
    choices = f"json.load(open({out + '/medusa_choices.txt'!r}))"
    return [f"model = MedusaModel.from_pretrained({out!r}); "
            f"model.medusa_generate(input_ids, medusa_choices={choices})"]
