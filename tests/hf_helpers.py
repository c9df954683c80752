"""Tiny Hugging Face folders made locally with `transformers` (random weights, no network) for
the conversion tests, and the conversion's command line."""
import json
from pathlib import Path

import torch

import pygpt.convert

WORDS = ("[PAD] [UNK] [CLS] [SEP] [MASK] the to be or not that is question end "
         "##s ##ing ##e , . !").split() + [chr(c) for c in range(ord("a"), ord("z") + 1)]
TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind\n"


def bpe_files(folder, vocab_size=300):
    """GPT-2's tokenizer files (vocab.json, merges.txt) of a small byte-level BPE learned from
    a bit of Shakespeare, <|endoftext|> its last id; its vocabulary size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    text = (Path(pygpt.__file__).parent / "corpus" / "tinyshakespeare.txt").read_text()[:20000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([text], trainers.BpeTrainer(
        vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tok.model.save(str(folder))
    vocab = json.loads((Path(folder) / "vocab.json").read_text())
    vocab["<|endoftext|>"] = len(vocab)
    (Path(folder) / "vocab.json").write_text(json.dumps(vocab))
    return len(vocab)


def gpt2_folder(folder, cls_name="GPT2LMHeadModel", seed=0, **config):
    """A tiny random GPT-2 of transformers' class cls_name saved into folder with a BPE."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = bpe_files(folder)
    settings = dict(n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=vocab,
                    bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    return save_random(folder, cls_name, transformers.GPT2Config(**{**settings, **config}), seed)


def bert_folder(folder, cls_name="BertForMaskedLM", seed=0, **config):
    """A tiny random BERT of transformers' class cls_name saved into folder with a vocab.txt."""
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    settings = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, vocab_size=len(WORDS), max_position_embeddings=32,
                    id2label={0: "neg", 1: "pos", 2: "mixed"})
    return save_random(folder, cls_name, transformers.BertConfig(**{**settings, **config}), seed)


def save_random(folder, cls_name, config, seed):
    """transformers' model class cls_name with config, random weights from seed spread far from
    their initial values, saved into folder."""
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, cls_name)(config).eval()
    spread(model)
    model.save_pretrained(folder)
    return model


def import_variants(tmp_path_factory, variants, make_folder):
    """name -> (HF folder, its model, the pygpt run converted from it) for each name ->
    (transformers class, config) of variants, the folder made by make_folder (gpt2_folder or
    bert_folder)."""
    out = {}
    for name, (cls_name, config) in variants.items():
        root = tmp_path_factory.mktemp(name)
        model = make_folder(root / "hf", cls_name, **config)
        assert convert("--from-hf", root / "hf", "--out", root / "run") == (0, None)
        out[name] = (root / "hf", model, root / "run")
    return out


def spread(model, std=0.2):
    """Random weights far from their initial values (layer norms, biases, embeddings too), so
    that a tensor mapped to the wrong place changes the logits."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * std)


def convert(*args):
    """pygpt.convert.main(args): (exit status, the SystemExit message or None)."""
    try:
        pygpt.convert.main([str(a) for a in args])
    except SystemExit as e:
        return (e.code if isinstance(e.code, int) else 1), (e.code if isinstance(e.code, str)
                                                           else None)
    return 0, None


def load_hf(folder, auto="AutoModelForCausalLM"):
    """transformers' model of an exported folder, asserting it loads with no missing,
    unexpected or mismatched weights."""
    import transformers

    model, info = getattr(transformers, auto).from_pretrained(folder, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def tensors(folder):
    """The tensors of a folder's model.safetensors."""
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "model.safetensors"))
