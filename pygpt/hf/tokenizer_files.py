"""Tokenizers between a Hugging Face folder and pygpt, with HF `tokenizers` doing the work.

Reading a folder (`tokenizer.json` first, as fast tokenizers save it, else the slow tokenizers'
files):
- GPT-2's byte-level BPE: tokenizer.json, or vocab.json + merges.txt (with GPT-2's regex
  pre-tokenizer, add_prefix_space from tokenizer_config.json, `<|endoftext|>` special);
- BERT's WordPiece: tokenizer.json, or vocab.txt with BERT's normalizer (do_lower_case,
  strip_accents and tokenize_chinese_chars from tokenizer_config.json, HF's defaults otherwise),
  its pre-tokenizer and the specials [PAD] [UNK] [CLS] [SEP] [MASK], which pygpt's BERT needs;
- pygpt's own char tokenizer as export_files writes it.
Writing: tokenizer.json and a tokenizer_config.json that `transformers`' AutoTokenizer loads as
a fast tokenizer encoding the same ids as pygpt (a BERT's adds [CLS] and [SEP] around a text,
as HF's BERT tokenizers do; pygpt adds them by id itself). The char tokenizer becomes a
WordLevel model over single characters: each character one token, the same id."""
from __future__ import annotations

import json
import reprlib
from pathlib import Path
from typing import Any

from pygpt.hf.folder import read_json, read_text
from pygpt.hf.mapping import setting
from pygpt_runtime.json_file import parse_json
from pygpt_runtime.text import check_ids
from pygpt.tokenizer import (SPECIAL_TOKENS, BPETokenizer, CharTokenizer, Tokenizer,
                             WordPieceTokenizer, require_specials)

HF_TOKENIZER = "tokenizer.json"
HF_TOKENIZER_CONFIG = "tokenizer_config.json"
GPT2_FILES = ("vocab.json", "merges.txt")
BERT_VOCAB = "vocab.txt"
END_OF_TEXT = "<|endoftext|>"
MAX_IDS = 1 << 32  # the ids HF tokenizers can hold (u32)
CHAR_PATTERN = r"[\s\S]"  # the char tokenizer's pre-tokenizer: every character a word
# The tokenizer_config.json names of BERT's special tokens.
BERT_SPECIAL_KEYS = {"[PAD]": "pad_token", "[UNK]": "unk_token", "[CLS]": "cls_token",
                     "[SEP]": "sep_token", "[MASK]": "mask_token"}


def _hf(text: str, source: str):
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tok = HFTokenizer.from_str(text)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # tokenizers reports some damage as a Rust panic
        raise ValueError(f"{source} is not a valid tokenizer file: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    tok.no_truncation()
    tok.no_padding()
    return tok


def _from_tokenizer_json(text: str, source: str) -> Tokenizer:
    spec = parse_json(text, source)
    model = spec.get("model") if isinstance(spec, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    pre = spec.get("pre_tokenizer") if isinstance(spec, dict) else None
    if kind == "WordLevel" and isinstance(pre, dict) and pre.get("type") == "Split" \
            and pre.get("pattern") == {"Regex": CHAR_PATTERN}:
        return _char_tokenizer(_hf(text, source), source)
    if kind == "BPE":
        return BPETokenizer(_hf(text, source))
    if kind == "WordPiece":
        return WordPieceTokenizer(_hf(text, source))
    raise ValueError(f"{source}: a {kind} tokenizer, which pygpt does not convert (BPE, "
                     "WordPiece, or pygpt's characters)")


def _char_tokenizer(tok, source: str) -> CharTokenizer:
    """pygpt's char tokenizer back from the WordLevel tokenizer export_files wrote."""
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    by_id = sorted((i, token) for token, i in tok.get_vocab(with_added_tokens=True).items())
    pieces = [token for _, token in by_id]
    chars = [p for p in pieces if p not in specials]
    if [i for i, _ in by_id] != list(range(len(by_id))) or pieces != chars + pieces[len(chars):]:
        raise ValueError(f"{source}: a character vocabulary whose ids are not the characters "
                         "0.. followed by the special tokens")
    try:
        return CharTokenizer(chars, pieces[len(chars):])
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def _tokenizer_config(folder: Path) -> tuple[dict[str, Any], str]:
    """The folder's tokenizer_config.json ({} when absent), and its path for errors."""
    return read_json(folder, HF_TOKENIZER_CONFIG) or {}, str(folder / HF_TOKENIZER_CONFIG)


def _gpt2_bpe(folder: Path) -> Tokenizer:
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

    vocab_text, merges_text = (read_text(folder, name) for name in GPT2_FILES)
    vocab = parse_json(vocab_text, str(folder / "vocab.json"))
    if not isinstance(vocab, dict) or not all(type(i) is int for i in vocab.values()):
        raise ValueError(f"{folder / 'vocab.json'} must map each token to its id")
    out_of_range = next(((t, i) for t, i in vocab.items() if not 0 <= i < MAX_IDS), None)
    if out_of_range is not None:
        raise ValueError(f"{folder / 'vocab.json'}: the id of {reprlib.repr(out_of_range[0])} is "
                         f"{reprlib.repr(out_of_range[1])}, not one of 0 .. {MAX_IDS - 1}")
    merges = []
    for n, line in enumerate(merges_text.splitlines(), 1):
        if line.startswith("#version") or not line:
            continue
        pair = line.split(" ")
        if len(pair) != 2:
            raise ValueError(f"{folder / 'merges.txt'} line {n} is not two tokens")
        merges.append((pair[0], pair[1]))
    config, config_file = _tokenizer_config(folder)
    try:
        tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    except Exception as e:
        raise ValueError(f"{folder}: vocab.json and merges.txt do not fit: "
                         f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=setting(config, "add_prefix_space", False, bool, config_file))
    tok.decoder = decoders.ByteLevel()
    if END_OF_TEXT in vocab:
        tok.add_special_tokens([AddedToken(END_OF_TEXT, special=True)])
    return BPETokenizer(tok)


def _bert_wordpiece(folder: Path) -> Tokenizer:
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers

    vocab: dict[str, int] = {}
    for n, token in enumerate(read_text(folder, BERT_VOCAB).splitlines()):
        token = token.strip()  # HF's BertTokenizer strips each line's whitespace
        if token in vocab:
            raise ValueError(f"{folder / BERT_VOCAB} line {n + 1} repeats {token!r} (line "
                             f"{vocab[token] + 1})")
        vocab[token] = n
    require_specials(vocab, SPECIAL_TOKENS, f"{folder / BERT_VOCAB}: pygpt's BERT")
    config, config_file = _tokenizer_config(folder)
    for name, key in BERT_SPECIAL_KEYS.items():
        if setting(config, key, name, str, config_file) != name:
            raise ValueError(f"{config_file}: {key} is {reprlib.repr(config[key])}; pygpt's "
                             f"BERT needs BERT's {name}")
    lower = setting(config, "do_lower_case", True, bool, config_file)
    tok = HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                       max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, lowercase=lower,
        handle_chinese_chars=setting(config, "tokenize_chinese_chars", True, bool, config_file),
        strip_accents=setting(config, "strip_accents", None, bool, config_file))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(name, special=True) for name in SPECIAL_TOKENS])
    return WordPieceTokenizer(tok)


def read_tokenizer(folder: Path, model_type: str, vocab_size: int) -> Tokenizer:
    """The tokenizer of the HF folder, as pygpt's, checked to have the model's vocab_size."""
    text = read_text(folder, HF_TOKENIZER)
    if text is not None:
        source = folder / HF_TOKENIZER
        tokenizer = _from_tokenizer_json(text, str(source))
    elif model_type == "gpt2" and all(read_text(folder, n) is not None for n in GPT2_FILES):
        source, tokenizer = folder / GPT2_FILES[0], _gpt2_bpe(folder)
    elif model_type == "bert" and read_text(folder, BERT_VOCAB) is not None:
        source, tokenizer = folder / BERT_VOCAB, _bert_wordpiece(folder)
    else:
        needs = " + ".join(GPT2_FILES) if model_type == "gpt2" else BERT_VOCAB
        raise ValueError(f"{folder} has no tokenizer: {HF_TOKENIZER}, or {needs}")
    if model_type == "bert":
        require_specials(tokenizer.special_tokens, SPECIAL_TOKENS, "pygpt's BERT")
    if tokenizer.vocab_size != vocab_size:
        raise ValueError(f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but "
                         f"config.json's vocab_size is {vocab_size}")
    check_ids(tokenizer, vocab_size, source)
    return tokenizer


def _char_json(tokenizer: CharTokenizer) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models
    from tokenizers import pre_tokenizers

    vocab = {c: i for i, c in enumerate(tokenizer.chars)}
    unk = "[UNK]" if "[UNK]" in tokenizer.special_tokens else None
    tok = HFTokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(CHAR_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True) for s in tokenizer.specials])
    return tok.to_str()


def export_files(tokenizer: Tokenizer, arch: str, block_size: int) -> dict[str, str]:
    """tokenizer.json and tokenizer_config.json (name -> text) of tokenizer for `transformers`."""
    from tokenizers import Tokenizer as HFTokenizer, processors

    if isinstance(tokenizer, CharTokenizer):
        text = _char_json(tokenizer)
    else:
        text = tokenizer.to_json()
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "model_max_length": block_size,
                              "clean_up_tokenization_spaces": False}
    specials = tokenizer.special_tokens
    if arch == "bert":
        require_specials(specials, SPECIAL_TOKENS, "BERT's Hugging Face tokenizer")
        config.update({key: name for name, key in BERT_SPECIAL_KEYS.items() if name in specials})
        tok = HFTokenizer.from_str(text)
        tok.post_processor = processors.BertProcessing(("[SEP]", specials["[SEP]"]),
                                                       ("[CLS]", specials["[CLS]"]))
        text = tok.to_str()
    elif END_OF_TEXT in specials:
        config.update(bos_token=END_OF_TEXT, eos_token=END_OF_TEXT, unk_token=END_OF_TEXT)
    return {HF_TOKENIZER: text, HF_TOKENIZER_CONFIG: json.dumps(config, indent=2)}
