"""Learning the byte-level BPE and WordPiece vocabularies of pygpt.tokenizer with HF `tokenizers`.

Both count the words of the text first (as HF's trainer would: each chunk pre-tokenized on its
own) and hand the trainer those words, spelled out. A word of over MAX_TRAINING_WORD characters
(after pre-tokenization: bytes for the BPE, as it counts them) is handed over as pieces of
MAX_TRAINING_WORD characters (the last one shorter), each counted as a word: HF's trainer takes
time quadratic in the length of a word (a 300 KB one costs half a minute, a 3 MB one most of an
hour), pieces of a bounded length keep it linear in the text. Texts without such words learn
exactly what the trainer would learn from them directly; encoding is unchanged either way.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Iterator, Sequence, Union

TextOrChunks = Union[str, Iterable[str]]  # a text, or its chunks (a file read piece by piece)
MAX_TRAINING_WORD = 256  # characters: a longer word is learned from as pieces of this length


def text_chunks(text: TextOrChunks) -> Iterable[str]:
    """The chunks of a text given whole or in chunks."""
    return [text] if isinstance(text, str) else text


def training_words(words: Counter) -> Counter:
    """The counts of words to train on: those of words, a word longer than MAX_TRAINING_WORD
    replaced by its pieces (each counted as often as the word)."""
    pieces: Counter = Counter()
    for word, n in words.items():
        for lo in range(0, len(word), MAX_TRAINING_WORD):
            pieces[word[lo:lo + MAX_TRAINING_WORD]] += n
    return pieces


def spelled_out(words: Counter) -> Iterator[str]:
    """Each word as often as it was counted, separated by spaces, in texts of about a megabyte."""
    for word, n in words.items():
        per_text = max(1, (1 << 20) // (len(word) + 1))
        for done in range(0, n, per_text):
            yield " ".join([word] * min(n - done, per_text))


def _learn(tok, words: Counter, trainer) -> None:
    """Train tok's model on words (none holds whitespace) by a tokenizer sharing that model."""
    from tokenizers import Tokenizer, pre_tokenizers

    learner = Tokenizer(tok.model)
    learner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    learner.train_from_iterator(spelled_out(words), trainer)


def train_bpe(text: TextOrChunks, vocab_size: int, names: Sequence[str]):
    """A byte-level BPE `tokenizers.Tokenizer` of vocab_size tokens: the special names first,
    then the 256 bytes, then the merges learned from text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    least = 256 + len(names)
    if vocab_size <= least:
        which = f" with the {len(names)} special tokens" if names else ""
        raise ValueError(f"a byte-level BPE{which} needs --vocab-size above {least}, "
                         f"got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # Pre-tokenized words are spelled with the 256 byte characters, none of them whitespace.
    words = Counter(word for chunk in text_chunks(text)
                    for word, _ in tok.pre_tokenizer.pre_tokenize_str(chunk))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  special_tokens=list(names),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    _learn(tok, training_words(words), trainer)
    tok.add_special_tokens(list(names))
    return tok


def train_wordpiece(text: TextOrChunks, vocab_size: int, lowercase: bool,
                    specials: Sequence[str]):
    """BERT's WordPiece `tokenizers.Tokenizer` of vocab_size tokens (see
    pygpt.tokenizer.WordPieceTokenizer.train): specials, the alphabet, the learned pieces."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if vocab_size <= len(specials):
        raise ValueError(f"a WordPiece tokenizer needs --vocab-size above {len(specials)} (its "
                         f"special tokens and at least one character), got {vocab_size}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    words = Counter(word for chunk in text_chunks(text) for word, _ in
                    tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(chunk)))
    alphabet = sorted(set("".join(words))) + sorted({"##" + c for w in words for c in w[1:]})
    if not alphabet:
        raise ValueError("cannot build a tokenizer from a text without words")
    if (got := len(specials) + len(alphabet)) > vocab_size:
        raise ValueError(f"--vocab-size {vocab_size} is too small for this text: the "
                         f"{len(specials)} special tokens and its alphabet (its characters and "
                         f"their ## forms) take {got}; ask for {got} or more")
    # No word holds a space. The alphabet is among the trainer's specials for their ids only.
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, show_progress=False,
                                        special_tokens=list(specials) + alphabet,
                                        continuing_subword_prefix="##")
    _learn(tok, training_words(words), trainer)
    tok.add_special_tokens(list(specials))
    return tok
