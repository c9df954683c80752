"""Long inputs cost time and memory in proportion to what is used of them: a tokenizer learns
from a text with one huge word in linear time (pygpt.tokenizer.training), a translator reads
of a huge line only what its encoder's positions can hold (pygpt.decoding.translate_texts,
pygpt_runtime.onnx_seq2seq), and streaming decode of a byte-level BPE that emits bytes that are
not UTF-8 stays linear and gives its text as it comes (pygpt_runtime.text.decode_stream)."""
import random
import subprocess
import sys
import time
from collections import Counter

import pytest

from pygpt.tokenizer import training as tokenizer_training
from pygpt.data.text import SHIPPED_TEXT
from pygpt.tokenizer import BPETokenizer, WordPieceTokenizer
from pygpt_runtime.text import decode_stream
from pygpt.tokenizer.training import MAX_TRAINING_WORD


def huge_word(n: int) -> str:
    rng = random.Random(0)
    return "".join(rng.choice("abcdefgh") for _ in range(n))


@pytest.mark.parametrize("train", [lambda t: BPETokenizer.train(t, 1024),
                                   lambda t: WordPieceTokenizer.train(t, 1024)],
                         ids=["bpe", "wordpiece"])
def test_a_huge_word_trains_in_linear_time(train, monkeypatch):
    """A 300 KB word without spaces took half a minute (the trainer is quadratic in a word's
    length); the trainer now sees it as pieces of at most MAX_TRAINING_WORD characters."""
    handed: list[str] = []
    spelled_out = tokenizer_training.spelled_out

    def recorded(words):
        for text in spelled_out(words):
            handed.append(text)
            yield text

    monkeypatch.setattr(tokenizer_training, "spelled_out", recorded)
    start = time.perf_counter()
    train("a few words first " + huge_word(300_000))
    assert time.perf_counter() - start < 5
    assert handed and max(len(w) for t in handed for w in t.split()) <= MAX_TRAINING_WORD


def test_pieces_keep_the_counts_of_their_word():
    words = tokenizer_training.training_words(
        Counter({"ab": 3, "x" * (2 * MAX_TRAINING_WORD + 1): 2}))
    assert words == {"ab": 3, "x" * MAX_TRAINING_WORD: 4, "x": 2}


def test_bpe_learns_what_the_trainer_learns_from_the_text_itself():
    """Without over-long words, counting the words first changes nothing: the same tokenizer.json
    as HF's trainer given the text (in the same chunks) directly."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = SHIPPED_TEXT.read_text(encoding="utf-8")[:50_000] + " Zürich 世界 😀\t\r\n x"
    chunks = [text[:20_000], text[20_000:]]
    direct = Tokenizer(models.BPE())
    direct.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    direct.decoder = decoders.ByteLevel()
    direct.train_from_iterator(chunks, trainers.BpeTrainer(
        vocab_size=600, show_progress=False, special_tokens=["[PAD]", "[BOS]"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ours = BPETokenizer.train(chunks, 600, specials=["[PAD]", "[BOS]"])
    assert ours.to_json() == BPETokenizer(direct).to_json()


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return BPETokenizer.train(SHIPPED_TEXT.read_text(encoding="utf-8")[:20_000], 300,
                              specials=["[PAD]", "[BOS]"])


def byte_ids(bpe: BPETokenizer, data: bytes) -> list[int]:
    """The ids of the single-byte tokens spelling data (valid UTF-8 or not)."""
    from pygpt_runtime.text import _byte_of_char

    char_of = {b: c for c, b in _byte_of_char().items()}
    return [bpe._tok.token_to_id(char_of[b]) for b in data]


def test_invalid_bytes_stream_as_they_come(bpe):
    """Bytes that never become UTF-8 used to hold back everything after them, decoding it all
    again at each token (quadratic, and nothing printed until the end): now each piece comes as
    soon as it is known, and 20000 such tokens take a fraction of a second."""
    ids = byte_ids(bpe, b"\xff\x80" * 10_000) + bpe.encode(" thou art")
    stream = decode_stream(bpe, iter(ids))
    assert next(stream) == "\ufffd"  # the first byte is invalid: given at once
    start = time.perf_counter()
    rest = list(stream)
    assert time.perf_counter() - start < 2
    assert "".join(["\ufffd", *rest]) == bpe.decode(ids)


@pytest.mark.parametrize("seed", range(20))
def test_stream_of_random_bytes_and_specials_joins_to_decode(bpe, seed):
    """Random bytes (valid, invalid, cut characters) and special ids: the pieces join to decode,
    which reads them as HF's byte-level decoder does; at most 3 bytes are ever held back."""
    rng = random.Random(seed)
    data = bytes(rng.choice([rng.randrange(256), *"é😀世".encode()]) for _ in range(200))
    ids = byte_ids(bpe, data)
    for at in sorted(rng.sample(range(len(ids)), 5), reverse=True):
        ids.insert(at, rng.choice([0, 1, *bpe.encode("thou")]))
    given: list[str] = []

    def fed():  # before each id: all of the text so far given, but for an unfinished character
        for n, i in enumerate(ids):
            whole, got = bpe.decode(ids[:n]), "".join(given)
            assert got == whole or (whole.endswith("\ufffd") and got == whole[:-1])
            yield i

    for piece in decode_stream(bpe, fed()):
        given.append(piece)
    assert "".join(given) == bpe.decode(ids)


def test_a_huge_line_is_cut_before_it_is_tokenized(monkeypatch):
    """A 20 MB line took gigabytes to tokenize though the encoder keeps block_size tokens: the
    tokenizer now gets at most CHARS_PER_POSITION characters a position, the cut is counted and
    the translation is that of the line's first block_size tokens."""
    from seq2seq_helpers import CFG, reverser, tokenizer
    from pygpt.decoding.beam_search import Search
    from pygpt.decoding.translate_texts import translate_texts
    from pygpt_runtime.text import CHARS_PER_POSITION

    tok, model = tokenizer(), reverser(steps=5)
    handed: list[int] = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text: handed.append(len(text)) or encode(text))
    line = "  " + "abc de" * 200_000
    head = line.strip()[:CFG.block_size]
    search = Search(beam=1)
    done, cut = translate_texts(model, tok, [line, head, "ab"], search)
    assert max(handed) <= CHARS_PER_POSITION * CFG.block_size
    assert cut == 1 and done[0] == done[1]


def test_the_runner_cuts_a_huge_line_before_it_is_tokenized():
    from pygpt_runtime.onnx_seq2seq import OnnxSeq2Seq
    from pygpt_runtime.text import CHARS_PER_POSITION

    class Recording:
        handed: list[int] = []

        def encode(self, text):
            self.handed.append(len(text))
            return [1] * len(text)

        def decode(self, ids):
            return ""

    runner = object.__new__(OnnxSeq2Seq)  # the tokenizer's part alone, without graphs
    runner.block_size, runner.tokenizer = 16, Recording()
    runner.translate_ids = lambda sources, search, batch_size: [[] for _ in sources]
    runner.translate([" " + "x" * 1_000_000, "short "], None)
    assert Recording.handed == [CHARS_PER_POSITION * 16, len("short")]


# The peak RSS (KiB) of the command in argv, measured in a fresh parent process, which has no
# other children: a 20 MB line took 2.75 GB in either translator before lines were cut.
PEAK_RSS = ("import resource, subprocess, sys; "
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def peak_rss_mib(*argv: str) -> float:
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, "-m", *argv],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return int(done.stdout) / 1024


def test_a_20_mb_line_is_translated_in_bounded_memory(tmp_path):
    from seq2seq_helpers import reverser, tokenizer
    from pygpt.storage import checkpoint
    import pygpt.export

    ckpt, export = tmp_path / "mt", tmp_path / "onnx"
    checkpoint.save(ckpt, reverser(steps=0), tokenizer())
    pygpt.export.main(["--ckpt", str(ckpt), "--out", str(export)])
    huge, short = tmp_path / "huge.txt", tmp_path / "short.txt"
    huge.write_text("abc de " * 3_000_000 + "\n", encoding="utf-8")  # 21 MB, one line
    short.write_text("abc de\n", encoding="utf-8")
    for command in (["pygpt.translate", "--ckpt", str(ckpt), "--greedy"],
                    ["pygpt_runtime", "--model", str(export), "--greedy"]):
        grown = (peak_rss_mib(*command, "--file", str(huge))
                 - peak_rss_mib(*command, "--file", str(short)))
        print(command[0], f"{grown:.0f} MiB more for the 21 MB line")
        assert grown < 200, (command[0], grown)  # the line itself, read and cut
