"""python -m pygpt.translate (in-process main calls) on a tiny seq2seq saved with
pygpt.storage.checkpoint.save: the translation of --text and of a --file (batched longest first, any
batch size) must be what translation_search.translate gives each sentence alone; --ref prints
sacreBLEU's figures; bad requests end in a one-line error. And pygpt.tasks.bleu against sacreBLEU."""
import pytest
import sacrebleu
import torch

from seq2seq_helpers import CFG, reverser, tokenizer
from pygpt.storage import checkpoint
from pygpt.tasks.bleu import score
from pygpt.config import ModelConfig
from pygpt.families import build
from pygpt.translate import main
from pygpt.decoding.beam_search import Search, translate

LINES = ["abc de", "", "h", "  gg fa bc.  ", "ab", "   ", "hgfedcba abcdefgh", "c.c", "dd e"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """(checkpoint folder, the model in memory, tokenizer)."""
    tok, model = tokenizer(), reverser()
    folder = tmp_path_factory.mktemp("mt") / "ckpt"
    checkpoint.save(folder, model, tok)
    return folder, model, tok


def alone(model, tok, text, search):
    """The reference: one sentence, unbatched, through translation_search directly (cut to the
    encoder's positions, as the command line cuts it)."""
    if not text.strip():
        return ""
    sp = tok.special_tokens
    ids = torch.tensor([tok.encode(text.strip())[:CFG.block_size]])
    out = translate(model, ids, None, bos=sp["[BOS]"], eos=sp["[EOS]"], search=search,
                    banned=(sp["[PAD]"], sp["[BOS]"]))
    return tok.decode(out[0])


def test_text_is_translated_from_a_saved_checkpoint(ckpt, capsys):
    folder, model, tok = ckpt
    main(["--ckpt", str(folder), "--text", "abc de", "--beam", "3", "--length-penalty", "1.0"])
    assert capsys.readouterr().out == alone(model, tok, "abc de", Search(beam=3,
                                                                         length_penalty=1.0)) + "\n"


@pytest.mark.parametrize("flags, search", [
    (["--greedy", "--batch-size", "3"], Search(beam=1)),
    (["--batch-size", "2", "--max-len-extra", "3"], Search(beam=4, max_extra=3)),
])
def test_a_file_translates_in_input_order_as_each_line_alone(ckpt, tmp_path, capsys, flags,
                                                             search):
    folder, model, tok = ckpt
    src = tmp_path / "src.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    expected = [alone(model, tok, line, search) for line in LINES]
    assert any(expected) and expected[1] == expected[5] == ""
    main(["--ckpt", str(folder), "--file", str(src), *flags])
    assert capsys.readouterr().out.split("\n") == expected + [""]
    out = tmp_path / "out.txt"
    main(["--ckpt", str(folder), "--file", str(src), "--out", str(out), *flags])
    captured = capsys.readouterr()  # LINES[6] has 17 tokens
    assert captured.out == "" and captured.err == ("warning: 1 source line(s) longer than the "
                                                   "model's 16 positions were cut to them\n")
    assert out.read_text(encoding="utf-8").split("\n") == expected + [""]


def test_a_reference_prints_the_scores(ckpt, tmp_path, capsys):
    folder, model, tok = ckpt
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(LINES[:5]), encoding="utf-8")
    hyps = [alone(model, tok, line, Search(beam=1)) for line in LINES[:5]]
    refs = ["ab cd", "", "h h", "gg fa", "b a"]
    ref.write_text("\n".join(refs), encoding="utf-8")
    main(["--ckpt", str(folder), "--file", str(src), "--ref", str(ref), "--greedy"])
    captured = capsys.readouterr()
    assert captured.out.split("\n")[:-1] == hyps
    assert captured.err == score(hyps, refs).describe() + "\n"


def test_scores_are_sacrebleus():
    hyps = ["The cat sat on the mat.", "A dog runs in the Park", "Hello there"]
    refs = ["The cat sat on the mat.", "a dog is running in the park", "hello, there!"]
    got = score(hyps, refs)
    assert got.bleu == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert got.bleu_lowercase == sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
    assert got.chrf == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert got.bleu < got.bleu_lowercase < 100 and all(isinstance(x, float) for x in got)
    assert score(refs, refs) == pytest.approx((100.0, 100.0, 100.0))
    with pytest.raises(ValueError, match="3 translations but 2 references"):
        score(hyps, refs[:2])
    with pytest.raises(ValueError, match="nothing to score"):
        score([], [])


def test_bad_requests_end_in_one_line_errors(ckpt, tmp_path, capsys):
    folder, _, tok = ckpt
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("ab\ncd\n", encoding="utf-8")
    ref.write_text("ab\n", encoding="utf-8")
    gpt = tmp_path / "gpt"
    checkpoint.save(gpt, build(ModelConfig(vocab_size=14, block_size=8, n_layer=1, n_head=2,
                                           n_embd=16)), tok)
    cases = [
        (["--ckpt", str(tmp_path / "nope"), "--text", "ab"], "error: no checkpoint folder at"),
        (["--ckpt", str(gpt), "--text", "ab"], "holds a gpt model, which does not translate"),
        (["--ckpt", str(folder), "--file", str(src), "--ref", str(ref)],
         f"error: {src} has 2 lines but {ref} has 1"),
        (["--ckpt", str(folder), "--file", str(tmp_path / "missing.txt")], "no data file at"),
        (["--ckpt", str(folder), "--text", "ab", "--ref", str(ref)], "go with --file"),
        (["--ckpt", str(folder), "--text", "ab", "--beam", "0"], "beam must be at least 1"),
        (["--ckpt", str(folder), "--text", "ab", "--length-penalty", "1e10"],
         "length_penalty must be from 0 to 10, got 10000000000.0"),
        (["--ckpt", str(folder), "--text", "ab", "--length-penalty", "-1"], "length_penalty"),
        (["--ckpt", str(folder), "--text", "ab", "--max-len-extra", "-1"],
         "max_extra must not be negative"),
        (["--ckpt", str(folder), "--file", str(src), "--batch-size", "0"],
         "--batch-size must be at least 1"),
        (["--ckpt", str(folder), "--text", "xyz"], "not in the"),  # a char tokenizer's limit
        (["--ckpt", str(folder), "--file", str(src), "--out", str(tmp_path / "no" / "o.txt")],
         "error: "),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert isinstance(e.value.code, str) and message in e.value.code, (argv, e.value.code)
        assert "\n" not in e.value.code
    with pytest.raises(SystemExit) as e:
        main(["--ckpt", str(folder)])  # neither --text nor --file: argparse's usage error
    assert e.value.code == 2
    capsys.readouterr()
