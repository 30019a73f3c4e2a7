"""The fitted-heads fixture really produces heads that predict the model's own continuation."""

import torch

from fit_heads import fitted_stories_heads, stories_prompts
from tiny_models import stories_tokenizer


def test_fitted_heads_predict_own_outputs():
    model = fitted_stories_heads(num_heads=4)
    tok = stories_tokenizer()
    prompt = stories_prompts(1)[0]
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        seq = model.base_model.generate(ids, max_new_tokens=48, do_sample=False, min_new_tokens=48)
        out = model(input_ids=seq)
    cont = seq[0]
    start = ids.shape[1]
    hits = []
    for k in range(4):
        pred = out.head_logits[k, 0].argmax(-1)  # [T]
        t = torch.arange(start, seq.shape[1] - k - 2)
        hits.append((pred[t] == cont[t + k + 2]).float().mean().item())
    # head 1 must beat chance by far; deeper heads are less accurate
    assert hits[0] > 0.5, hits
    print(hits)
