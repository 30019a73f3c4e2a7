"""The two Hugging Face accessors decoding uses: the text config of a plain model, a peft wrapper
unwrapped."""

from medusa.decoding.hf import text_config, unwrap

from tiny_models import tiny_model


class _Wrapped:
    def __init__(self, model):
        self.model = model

    def get_base_model(self):
        return self.model


def test_unwrap_and_text_config():
    model = tiny_model("llama")
    assert unwrap(model) is model
    assert unwrap(_Wrapped(model)) is model
    assert text_config(model).hidden_size == 32 and text_config(_Wrapped(model)).vocab_size == 96
