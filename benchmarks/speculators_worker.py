"""Runs inside the speculators venv (never the project's): the speculators package's own EAGLE-3 model
(``speculators.models.eagle3.core.Eagle3DraftModel``) on a ``--format speculators`` export.

``python speculators_worker.py JOB.json OUT_DIR``. JOB: ``{"export": DIR, "inputs": FILE.safetensors,
"ttt_steps": k, "attn_implementation": "eager" | "sdpa"}``; the inputs file holds ``hidden_states
[1, T, 3d]`` (the verifier's features at ``eagle_aux_hidden_state_layer_ids``, concatenated in that ascending
order) and ``input_ids [1, T]`` (the token AFTER each feature position: speculators' training layout, where
the draft layer sees features at t with token t+1 at position t+1). ``Eagle3DraftModel.forward`` runs its k
training-time-test steps over the whole sequence (step j: the input ids shifted left by j, positions + j,
each query attending causally to step 0 and to its own entry of every later step) and returns only argmax
tokens without a verifier's last hidden state, so the draft LM head's outputs are read with a forward hook.

Writes ``OUT_DIR/logits.safetensors`` (``logits [k, T, N]``: step j's row i predicts token i + 2 + j; rows
past ``T - j`` read padding; with a draft vocabulary also ``d2t [N]`` and ``verifier_lm_head [N, d]``, the
verifier LM head rows speculators selected with ``t2d``) and ``OUT_DIR/info.json``. The model is
speculators' own ``Eagle3DraftModel.from_pretrained(export)``, unmodified: nothing is loaded into it here.
``info.json`` says where its embedding table came from: ``embed_tokens_in_checkpoint`` (the export holds
``embed_tokens.weight``), ``embed_tokens_from_checkpoint`` (the loaded table equals that tensor),
``embed_tokens_equal_verifier`` (it equals the verifier's input embeddings, what our drafter reads) and
``embed_tokens_all_zero``. Without the tensor speculators 0.9.0 under transformers 5.x drafts with an
uninitialised table (zeros or stale memory): ``_init_vocab`` marks it NaN for ``load_verifier_weights`` to
fill, but ``from_pretrained`` builds the model on the meta device and materialises missing tensors with
``torch.empty_like``, so the marker is lost. Imports nothing from the project (its venv has no ``medusa``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load_model(export: str, attn: str):
    """speculators' own EAGLE-3 model of ``export`` in eval mode (``from_pretrained``, nothing added)."""
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel

    config = Eagle3SpeculatorConfig.from_pretrained(export)
    # its default, flex attention, wants inputs padded to its block size (training batches)
    config.transformer_layer_config._attn_implementation = attn
    return Eagle3DraftModel.from_pretrained(export, config=config).eval()


def embedding_source(model, export: str) -> dict:
    """Where the loaded embedding table came from: the export's ``embed_tokens.weight``, the verifier's."""
    import torch
    from safetensors import safe_open
    from speculators.utils.loading import load_model_layers

    table = model.embed_tokens.weight.detach()
    with safe_open(str(Path(export) / "model.safetensors"), "pt") as f:
        stored = f.get_tensor("embed_tokens.weight") if "embed_tokens.weight" in f.keys() else None
    verifier = model.config.speculators_config.verifier.name_or_path
    embed = load_model_layers(["embed_tokens.weight"], verifier)["embed_tokens.weight"]
    from_file = stored is not None and bool(torch.equal(table, stored.to(table.dtype)))
    return {"embed_tokens_in_checkpoint": stored is not None, "embed_tokens_from_checkpoint": from_file,
            "embed_tokens_equal_verifier": bool(torch.equal(table, embed.to(table.dtype))),
            "embed_tokens_all_zero": not bool(table.any())}


def draft_logits(model, hidden_states, input_ids, steps: int):
    """The draft LM head's logits of each training-time-test step ``[k, T, N]``."""
    import torch

    captured = []
    hook = model.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()[0]))
    try:
        with torch.no_grad():
            model(hidden_states=hidden_states, input_ids=input_ids,
                  document_ids=torch.zeros_like(input_ids), ttt_steps=steps)
    finally:
        hook.remove()
    return torch.stack(captured)


def main(argv: list[str]) -> int:
    from safetensors.torch import load_file, save_file

    job = json.loads(Path(argv[1]).read_text())
    out = Path(argv[2])
    out.mkdir(parents=True, exist_ok=True)
    model = load_model(job["export"], job.get("attn_implementation", "eager"))
    x = load_file(job["inputs"])
    feats = x["hidden_states"].to(model.fc.weight.dtype)  # [1, T, 3d]
    logits = draft_logits(model, feats, x["input_ids"], job["ttt_steps"])  # [k, T, N]
    tensors = {"logits": logits.contiguous()}
    if model.d2t is not None:
        tensors["d2t"] = model.d2t.detach().clone()
        # the verifier's LM head rows speculators picked with t2d (ascending target ids): row k must be the
        # target of draft id k (d2t's) for its training / evaluation targets to be the right tokens
        tensors["verifier_lm_head"] = model.verifier_lm_head.weight.detach().clone()
    save_file(tensors, str(out / "logits.safetensors"))
    info = {"model_class": type(model).__name__, "layer_class": type(model.layers[0]).__name__,
            "attn_implementation": model._attn_impl, "draft_vocab_size": int(model.draft_vocab_size),
            "target_layer_ids": list(model.target_layer_ids), **embedding_source(model, job["export"])}
    (out / "info.json").write_text(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
