"""A checkpoint ready to decode (medusa/modeling/loading.py): the model in eval mode with its base's
tokenizer, one prompt's ids, and prompts past the base's positions refused."""

import pytest
import torch

from medusa import MedusaModel
from medusa.errors import MedusaError
from medusa.modeling.loading import check_positions, encode_prompt, load_for_generation

from tiny_models import STORIES, require_shared, stories_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    require_shared(STORIES)
    path = tmp_path_factory.mktemp("loading") / "ck"
    MedusaModel.from_base(stories_model(), num_heads=2).save_pretrained(path)
    return path


def test_load_for_generation_gives_an_eval_model_and_the_base_tokenizer(checkpoint):
    model, tok = load_for_generation(checkpoint, base=str(STORIES))
    assert not model.training and model.num_heads == 2
    ids = encode_prompt(tok, "Once upon a time")
    assert ids.dim() == 2 and ids.shape[0] == 1 and ids.dtype == torch.long
    assert tok.decode(ids[0], skip_special_tokens=True).strip() == "Once upon a time"
    with pytest.raises(MedusaError, match="--chat: the tokenizer of .* has no chat template"):
        encode_prompt(tok, "hi", chat=True)


def test_a_half_precision_dtype_loads_the_heads_in_it_too(checkpoint):
    heads_dtypes = lambda m: {p.dtype for p in m.heads.parameters()}
    model, _ = load_for_generation(checkpoint, base=str(STORIES), dtype="bfloat16", cpu_pack=False)
    assert heads_dtypes(model) == {torch.bfloat16} and model.base_model.dtype == torch.bfloat16
    model, _ = load_for_generation(checkpoint, base=str(STORIES), dtype="float32", cpu_pack=False)
    assert heads_dtypes(model) == {torch.float32}


def test_check_positions_names_the_prompt_and_the_allowed_tokens(checkpoint):
    model, tok = load_for_generation(checkpoint, base=str(STORIES))
    n = int(encode_prompt(tok, "Once upon a time").shape[1])
    check_positions(model, tok, ["Once upon a time"], 512 - n)
    with pytest.raises(MedusaError, match=rf"prompt 2: {n} tokens \+ --max-new-tokens {513 - n} exceed .* "
                                          rf"allowed --max-new-tokens for this prompt: 1\.\.{512 - n}"):
        check_positions(model, tok, ["hi", "Once upon a time"], 513 - n)
