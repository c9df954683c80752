"""Every token id a tokenizer can give is below its model's vocab_size, checked wherever a
tokenizer meets a model: a checkpoint's load, an export's (the runner's load_tokenizer) and
convert --from-hf. A tokenizer.json of as many tokens as the model whose ids skip some would
otherwise load and then fail at the first text that uses the far id (an IndexError in the
embedding, an ONNX Gather out of range)."""
import json

import pytest

from pygpt.config import ModelConfig
from pygpt.models import GPT
from pygpt.storage import checkpoint
from pygpt.tokenizer import BPETokenizer
from pygpt_runtime.text import load_tokenizer as load_export_tokenizer

TEXT = "the cat sat on the mat. the dog ate the bone.\n" * 20


def skip_an_id(path, past):
    """Moves the last token of the HF tokenizer.json at path to the id `past` (its count stays)."""
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    vocab[last] = past
    path.write_text(json.dumps(spec))


@pytest.fixture
def saved(tmp_path):
    tokenizer = BPETokenizer.train(TEXT, 280)
    model = GPT(ModelConfig(n_layer=1, n_embd=16, n_head=2, block_size=8,
                            vocab_size=tokenizer.vocab_size), kernels="torch")
    checkpoint.save(tmp_path / "ckpt", model, tokenizer)
    return tmp_path / "ckpt", tokenizer.vocab_size


def test_a_checkpoint_whose_tokenizer_gives_an_id_past_the_model_is_refused(saved):
    folder, vocab_size = saved
    skip_an_id(folder / "tokenizer.json", vocab_size + 1000)
    with pytest.raises(ValueError, match=rf"tokenizer.json maps a token to the id "
                                         rf"{vocab_size + 1000}, past the model's {vocab_size}"):
        checkpoint.load(folder, kernels="torch")


def test_the_runner_refuses_a_tokenizer_id_past_the_model(saved):
    folder, vocab_size = saved
    path = folder / "tokenizer.json"
    assert len(load_export_tokenizer(path, "bpe", vocab_size)) == vocab_size
    skip_an_id(path, 2 ** 31)
    with pytest.raises(ValueError, match=rf"^{path} maps a token to the id {2 ** 31}, past"):
        load_export_tokenizer(path, "bpe", vocab_size)
