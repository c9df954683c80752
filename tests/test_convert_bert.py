"""python -m pygpt.convert with BERT: tiny random BertModel (with and without the `bert.`
prefix), BertForMaskedLM, BertForPreTraining, BertForSequenceClassification and
BertForTokenClassification folders made by transformers become pygpt runs giving transformers'
outputs on padded batches (both kernel sets), which fill_mask, classify, tag, train --init-from
and the ONNX runner take; pygpt's BERTs go back to the class that holds them, bit for bit."""
import dataclasses
import json

import numpy as np
import pytest
import torch

import pygpt
import pygpt.answer
import pygpt.classify
import pygpt.fill_mask
import pygpt.tag
from hf_helpers import WORDS, bert_folder, convert, import_variants, load_hf, tensors
from helpers import train_cli
from pygpt.storage import checkpoint
from pygpt.config import ModelConfig
from pygpt_runtime.tagging import entities
from pygpt.data.labelled import Encoded, Example
from pygpt.export import export
from pygpt.families import build
from pygpt.tasks.qa import SPAN_LABELS
from pygpt.tokenizer import WordPieceTokenizer
from pygpt_runtime.text import word_spans
from pygpt_runtime.onnx_bert import OnnxBERT
from test_classify import run

transformers = pytest.importorskip("transformers")

VARIANTS = {  # name -> (transformers class, config)
    "encoder": ("BertModel", {}),
    "mlm": ("BertForMaskedLM", dict(layer_norm_eps=1e-7)),
    "pretraining": ("BertForPreTraining", dict(hidden_act="gelu_new", type_vocab_size=3)),
    "classifier": ("BertForSequenceClassification", {}),
    "tagger": ("BertForTokenClassification", dict(id2label={0: "O", 1: "B-PER", 2: "I-PER"})),
    "answerer": ("BertForQuestionAnswering", dict(id2label={0: "LABEL_0", 1: "LABEL_1"})),
    "mlm-untied": ("BertForMaskedLM", dict(tie_word_embeddings=False)),
    "mlm-narrow": ("BertForMaskedLM", dict(intermediate_size=100)),  # not 4 x hidden_size
}
TEXTS = ["to be or not to be , that is the question", "the end", "question ##s !"]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> (HF folder, its model, the pygpt run converted from it)."""
    return import_variants(tmp_path_factory, VARIANTS, bert_folder)


def padded(tokenizer, segments=True):
    """A right-padded batch of [CLS] text [SEP] (pair) rows: ids, HF's mask, segments, lengths."""
    cls, sep = tokenizer.special_tokens["[CLS]"], tokenizer.special_tokens["[SEP]"]
    rows, segs = [], []
    for i, text in enumerate(TEXTS):
        a = [cls, *tokenizer.encode(text), sep]
        b = [*tokenizer.encode(TEXTS[-1 - i]), sep] if segments and i else []
        rows.append(a + b)
        segs.append([0] * len(a) + [1] * len(b))
    lengths = torch.tensor([len(r) for r in rows])
    T = int(lengths.max())
    ids = torch.tensor([r + [0] * (T - len(r)) for r in rows])
    seg = torch.tensor([s + [0] * (T - len(s)) for s in segs])
    return ids, (torch.arange(T)[None] < lengths[:, None]).long(), seg, lengths


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_outputs_equal_transformers_on_padded_batches(imported, name, kernels):
    _, hf_model, run_dir = imported[name]
    model, tokenizer = pygpt.load(run_dir, kernels=kernels)
    ids, mask, seg, lengths = padded(tokenizer)
    real = mask.bool()
    with torch.no_grad():
        out = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=seg)
        hidden = model.encode(ids, seg, lengths)
        ours = model(ids, seg, lengths)
        if name == "encoder":
            pairs = [(hidden[real], out.last_hidden_state[real]),
                     (torch.tanh(model.pooler(hidden[:, 0])), out.pooler_output)]
        elif name == "classifier":
            pairs = [(ours.logits, out.logits)]
        elif name == "tagger":
            pairs = [(ours.logits[real], out.logits[real])]
        elif name == "answerer":
            pairs = [(ours.logits[..., 0][real], out.start_logits[real]),
                     (ours.logits[..., 1][real], out.end_logits[real])]
        elif name == "pretraining":
            pairs = [(model.mlm(hidden)[real], out.prediction_logits[real]),
                     (ours.nsp_logits, out.seq_relationship_logits)]
        else:
            pairs = [(model.mlm(hidden)[real], out.logits[real])]
    for got, expected in pairs:
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_encoder_weights_without_the_bert_prefix_and_with_it(imported, tmp_path):
    folder, hf_model, run_dir = imported["encoder"]
    assert not any(n.startswith("bert.") for n in tensors(folder))  # BertModel's own names
    prefixed = tmp_path / "prefixed"
    transformers.BertForMaskedLM(hf_model.config).save_pretrained(prefixed)  # bert.* names
    (prefixed / "vocab.txt").write_bytes((folder / "vocab.txt").read_bytes())
    assert convert("--from-hf", prefixed, "--out", tmp_path / "run") == (0, None)
    model, _ = pygpt.load(tmp_path / "run")
    saved = tensors(prefixed)
    assert torch.equal(model.state_dict()["embed.tok.weight"],
                       saved["bert.embeddings.word_embeddings.weight"])


def test_tokenizer_is_berts(imported):
    folder, _, run_dir = imported["mlm"]
    ours = checkpoint.read_tokenizer(run_dir)
    assert isinstance(ours, WordPieceTokenizer)
    assert ours.special_tokens == {name: WORDS.index(name) for name in
                                   ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")}
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    for text in [*TEXTS, "To BE, Or NOT: questions!", "tè bé zzz 日本"]:
        assert [ours.special_tokens["[CLS]"], *ours.encode(text),
                ours.special_tokens["[SEP]"]] == theirs(text)["input_ids"], text


def test_fill_mask_and_runner_on_an_imported_bert(imported, tmp_path):
    folder, hf_model, run_dir = imported["pretraining"]
    model, tokenizer = pygpt.load(run_dir)
    text = "to [MASK] or not to be , that is the [MASK]"
    ids = [tokenizer.special_tokens["[CLS]"], *tokenizer.encode(text, parse_specials=True),
           tokenizer.special_tokens["[SEP]"]]
    at = [i for i, t in enumerate(ids) if t == tokenizer.special_tokens["[MASK]"]]
    with torch.no_grad():
        hf_best = hf_model(torch.tensor([ids])).prediction_logits[0, at].topk(3).indices
    fills = pygpt.fill_mask.fill_mask(model, tokenizer, text, top_k=3)
    assert [[t for t, _ in row] for row in fills] == [[tokenizer.decode([int(i)]) for i in row]
                                                     for row in hf_best]
    export(run_dir, tmp_path / "onnx")
    got = OnnxBERT(str(tmp_path / "onnx")).fill_mask(text, top_k=3)
    assert [[t for t, _ in row] for row in got] == [[t for t, _ in row] for row in fills]
    assert "[MASK] 1:" in run(pygpt.fill_mask.main, ["--ckpt", str(run_dir), "--text", text])


def test_classify_and_runner_on_an_imported_classifier(imported, tmp_path):
    folder, hf_model, run_dir = imported["classifier"]
    model, tokenizer, labels = pygpt.classify.load_classifier(str(run_dir))
    assert labels == ["neg", "pos", "mixed"]
    examples = [Example(t, None, labels[0], 1) for t in TEXTS]
    probs = pygpt.classify.predict(model, Encoded(examples, labels, tokenizer, 32))
    ids, mask, seg, _ = padded(tokenizer, segments=False)
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask).logits.softmax(-1)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=1e-5)
    export(run_dir, tmp_path / "onnx")
    np.testing.assert_allclose(OnnxBERT(str(tmp_path / "onnx")).classify(TEXTS),
                               expected.numpy(), atol=1e-5)
    assert run(pygpt.classify.main, ["--ckpt", str(run_dir), "--text", TEXTS[0]]).strip()


def test_tag_on_an_imported_tagger(imported):
    """pygpt.tag's entities on an imported BertForTokenClassification are those of
    transformers' logits at each word's first piece."""
    _, hf_model, run_dir = imported["tagger"]
    model, tokenizer, labels = pygpt.tag.load_tagger(str(run_dir))
    assert labels == ["O", "B-PER", "I-PER"]
    text = "to be or not to be, that is the questions!"
    spans = word_spans(text)
    pieces = [tokenizer.encode(text[s:e]) for s, e in spans]
    specials = tokenizer.special_tokens
    ids = torch.tensor([[specials["[CLS]"], *sum(pieces, []), specials["[SEP]"]]])
    firsts = [1 + sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
    with torch.no_grad():
        best = hf_model(input_ids=ids).logits[0].argmax(-1)
    tags = [labels[int(best[at])] for at in firsts]
    expected = [(e.type, spans[e.start][0], spans[e.end - 1][1]) for e in entities(tags)]
    assert expected and pygpt.tag.tag_text(model, tokenizer, labels, text) == expected
    assert any(len(p) > 1 for p in pieces)  # "questions": a word of two pieces


def test_fine_tune_an_imported_encoder_to_classify(imported, tmp_path):
    _, _, run_dir = imported["encoder"]
    data = tmp_path / "train.tsv"
    data.write_text("label\ttext\n" + "".join(f"{'ab'[i % 2]}\t{TEXTS[i % 3]}\n"
                                              for i in range(40)))
    code, message = train_cli(["--task", "classify", "--init-from", str(run_dir), "--data",
                               str(data), "--out", str(tmp_path / "cls"), "--max-iters", "2",
                               "--batch-size", "4", "--eval-interval", "2", "--eval-iters", "1",
                               "--threads", "1"])
    assert (code, message) == (0, None)
    assert checkpoint.load_labels(tmp_path / "cls") == ["a", "b"]


def test_fine_tune_an_imported_encoder_to_tag(imported, tmp_path):
    """--task tag --init-from an imported BertModel: its encoder (unchanged at --lr 0), a
    per-token head."""
    _, _, run_dir = imported["encoder"]
    data = tmp_path / "train.conll"
    data.write_text("".join(f"the\tO\nquestion\t{'BI'[i % 2]}-X\nend\tO\n\n" for i in range(20)))
    code, message = train_cli(["--task", "tag", "--init-from", str(run_dir), "--data", str(data),
                               "--out", str(tmp_path / "ner"), "--max-iters", "2", "--lr", "0",
                               "--batch-size", "4", "--eval-interval", "2", "--eval-iters", "1",
                               "--threads", "1"])
    assert (code, message) == (0, None)
    assert checkpoint.load_labels(tmp_path / "ner") == ["O", "B-X", "I-X"]
    tuned = encoder_kept(tmp_path / "ner", run_dir)
    assert tuned.config.pooling == "token" and tuned.classifier[1].weight.shape == (3, 32)


def encoder_kept(tuned_dir, source_dir):
    """The run in tuned_dir, after asserting that its embeddings and blocks are source_dir's
    bit for bit; a fine-tuning at --lr 0 keeps them."""
    tuned, _ = pygpt.load(tuned_dir)
    source, _ = pygpt.load(source_dir)
    for name, t in source.state_dict().items():
        if name.startswith(("embed.", "blocks.")):
            assert torch.equal(tuned.state_dict()[name], t), name
    return tuned


def test_answer_on_an_imported_answerer(imported):
    """pygpt.answer's span on an imported BertForQuestionAnswering is the best of transformers'
    start + end logits over the context's pieces (start <= end), as whole words' characters."""
    _, hf_model, run_dir = imported["answerer"]
    model, tokenizer = pygpt.answer.load_answerer(str(run_dir))
    question, context = "what is the question ?", "to be or not to be, that is the questions!"
    spans = word_spans(context)
    pieces = [tokenizer.encode(context[s:e]) for s, e in spans]
    specials = tokenizer.special_tokens
    head = [specials["[CLS]"], *tokenizer.encode(question), specials["[SEP]"]]
    ids = torch.tensor([[*head, *sum(pieces, []), specials["[SEP]"]]])
    segments = torch.tensor([[0] * len(head) + [1] * (ids.shape[1] - len(head))])
    with torch.no_grad():
        out = hf_model(input_ids=ids, token_type_ids=segments)
    word_of = [w for w, p in enumerate(pieces) for _ in p]
    start, end = out.start_logits[0, len(head):-1], out.end_logits[0, len(head):-1]
    score, i, j = max((float(start[i] + end[j]), i, j) for i in range(len(word_of))
                      for j in range(i, len(word_of)))
    found = pygpt.answer.answer(model, tokenizer, question, context)
    first, last = spans[word_of[i]][0], spans[word_of[j]][1]
    assert (found.start, found.end, found.text) == (first, last, context[first:last])
    assert found.score == pytest.approx(score, abs=1e-4)
    assert any(len(p) > 1 for p in pieces)  # "questions": a word of two pieces


def test_fine_tune_an_imported_encoder_to_answer(imported, tmp_path):
    """--task qa --init-from an imported BertModel: its encoder (unchanged at --lr 0), a span
    head."""
    _, _, run_dir = imported["encoder"]
    context = "to be or not to be , that is the question"
    data = tmp_path / "train.json"
    data.write_text(json.dumps({"data": [{"paragraphs": [
        {"context": context, "qas": [{"id": f"q{k}", "question": "what is it ?", "answers": [
            {"text": "the question", "answer_start": context.index("the question")}]}]}
        for k in range(4)]}]}))
    code, message = train_cli(["--task", "qa", "--init-from", str(run_dir), "--data", str(data),
                               "--out", str(tmp_path / "qa"), "--max-iters", "2", "--lr", "0",
                               "--batch-size", "4", "--eval-interval", "2", "--eval-iters", "1",
                               "--threads", "1"])
    assert (code, message) == (0, None)
    assert checkpoint.load_labels(tmp_path / "qa") == SPAN_LABELS
    tuned = encoder_kept(tmp_path / "qa", run_dir)
    assert tuned.config.pooling == "span" and tuned.classifier[1].weight.shape == (2, 32)


@pytest.mark.parametrize("name, auto", [("pretraining", "AutoModelForPreTraining"),
                                        ("mlm", "AutoModelForMaskedLM"),
                                        ("mlm-untied", "AutoModelForMaskedLM"),
                                        ("classifier", "AutoModelForSequenceClassification"),
                                        ("tagger", "AutoModelForTokenClassification"),
                                        ("answerer", "AutoModelForQuestionAnswering")])
def test_round_trip_hf_pygpt_hf_is_bit_identical(imported, tmp_path, name, auto):
    folder, hf_model, run_dir = imported[name]
    assert convert("--to-hf", run_dir, "--out", tmp_path / "hf") == (0, None)
    original, exported = tensors(folder), tensors(tmp_path / "hf")
    assert sorted(original) == sorted(exported)
    for key, t in original.items():
        # Untied, transformers' decoder has its own bias; the head's `bias` goes unused and is
        # written as the decoder's (pygpt's head has one bias).
        if name == "mlm-untied" and key == "cls.predictions.bias":
            t = original["cls.predictions.decoder.bias"]
        assert torch.equal(exported[key], t), key
    reloaded = load_hf(tmp_path / "hf", auto)
    if name in ("classifier", "tagger"):
        assert reloaded.config.id2label == hf_model.config.id2label
    ids = torch.tensor([[2, 7, 8, 9, 3]])
    with torch.no_grad():
        for a, b in zip(reloaded(ids).to_tuple(), hf_model(ids).to_tuple()):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def random_bert(folder, **config):
    """A pygpt run of a random post-norm BERT with a WordPiece of WORDS, weights spread."""
    tokenizer = WordPieceTokenizer.train(" ".join(TEXTS) * 3, 60)
    settings = dict(arch="bert", vocab_size=tokenizer.vocab_size, block_size=24, n_layer=2,
                    n_head=2, n_embd=32, norm="post", embed_norm=True, final_norm=False)
    cfg = ModelConfig(**{**settings, **config})
    torch.manual_seed(0)
    model = build(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    labels = (SPAN_LABELS if cfg.pooling == "span"
              else [f"class {i}" for i in range(cfg.num_labels)] or None)
    checkpoint.save(folder, model, tokenizer, labels=labels)
    return model, tokenizer


@pytest.mark.parametrize("config, kept", [
    ({}, ()),  # next-sentence head on: BertForPreTraining holds every tensor
    ({"nsp": False, "norm_eps": 1e-12}, ("pooler.",)),  # BertForMaskedLM: no pooler
    ({"num_labels": 2, "pooling": "cls", "activation": "gelu_tanh"}, ("mlm.", "nsp.")),
    # BertForTokenClassification: an entity tagger, without pooler or masked-LM head
    ({"num_labels": 3, "pooling": "token", "nsp": False}, ("mlm.", "pooler.")),
    # BertForQuestionAnswering: a question answerer, without pooler or masked-LM head
    ({"num_labels": 2, "pooling": "span", "nsp": False}, ("mlm.", "pooler.")),
])
def test_pygpt_bert_round_trip(tmp_path, config, kept):
    """pygpt -> HF -> pygpt: every tensor the HF class holds comes back bit for bit (those it
    lacks, `kept`, come back fresh); transformers gives pygpt's logits."""
    model, tokenizer = random_bert(tmp_path / "run", **config)
    assert convert("--to-hf", tmp_path / "run", "--out", tmp_path / "hf") == (0, None)
    architecture = json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"][0]
    hf_model = load_hf(tmp_path / "hf", "AutoModelFor" + {
        "BertForPreTraining": "PreTraining", "BertForMaskedLM": "MaskedLM",
        "BertForSequenceClassification": "SequenceClassification",
        "BertForTokenClassification": "TokenClassification",
        "BertForQuestionAnswering": "QuestionAnswering"}[architecture])
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    specials = tokenizer.special_tokens
    for text in TEXTS:
        assert hf_tokenizer(text)["input_ids"] == [specials["[CLS]"], *tokenizer.encode(text),
                                                   specials["[SEP]"]]
    ids, mask, seg, lengths = padded(tokenizer)
    with torch.no_grad():
        out = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=seg)
        ours = model.eval()(ids, seg, lengths)
        real = mask.bool()  # per token: the real ones (padding is not read)
        if model.config.pooling == "token":
            torch.testing.assert_close(out.logits[real], ours.logits[real], atol=1e-5, rtol=1e-5)
        elif model.config.pooling == "span":
            for theirs, k in ((out.start_logits, 0), (out.end_logits, 1)):
                torch.testing.assert_close(theirs[real], ours.logits[..., k][real], atol=1e-5,
                                           rtol=1e-5)
        elif model.config.num_labels:
            torch.testing.assert_close(out.logits, ours.logits, atol=1e-5, rtol=1e-5)
        else:
            mlm = out.prediction_logits if model.config.nsp else out.logits
            real = mask.bool()
            torch.testing.assert_close(mlm[real], model.mlm(model.encode(ids, seg, lengths))[real],
                                       atol=1e-5, rtol=1e-5)
    assert convert("--from-hf", tmp_path / "hf", "--out", tmp_path / "back") == (0, None)
    back, _ = pygpt.load(tmp_path / "back")
    # BertForSequenceClassification has no next-sentence head: the classifier comes back without.
    assert back.config == dataclasses.replace(model.config, nsp=model.config.nsp
                                              and "nsp." not in kept)
    for key, t in model.state_dict().items():
        if not key.startswith(kept):
            assert torch.equal(back.state_dict()[key], t), key
        elif key != "mlm.decoder.weight" and key in back.state_dict():  # fresh (not tied)
            assert not torch.equal(back.state_dict()[key], t), key


@pytest.mark.parametrize("setting, named", [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ({"is_decoder": True}, "is_decoder"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"intermediate_size": -1}, "intermediate_size"),
    ({"architectures": ["BertForMultipleChoice"]}, "BertForMultipleChoice"),
    # a classifier's weights under the question answerer's class
    ({"architectures": ["BertForQuestionAnswering"]}, "hold no qa_outputs"),
    ({"problem_type": "regression"}, "problem_type"),
    ({"id2label": {"0": "a", "2": "b", "1": "c", "5": "d"}}, "id2label"),
    # labels classify would refuse in labels.json are refused before any is written
    ({"id2label": {"0": "neg", "1": "pos", "2": "neg"}}, "id2label names 'neg' more than once"),
    ({"id2label": {"0": "neg", "1": "p\x00s", "2": "mixed"}}, "id2label: the label 'p\\x00s'"),
    ({"id2label": {"0": "neg", "1": "pos\nx", "2": "mixed"}}, "control character"),
    ({"vocab_size": 50}, "vocab_size"),
])
def test_unsupported_bert_configs_are_named(imported, tmp_path, setting, named):
    folder, _, _ = imported["classifier"]
    copy = tmp_path / "hf"
    copy.mkdir()
    for path in folder.iterdir():
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config.update(setting)
    (copy / "config.json").write_text(json.dumps(config))
    code, message = convert("--from-hf", copy, "--out", tmp_path / "run")
    assert code == 1 and message.startswith("error: ") and "\n" not in message, message
    assert named in message
    assert not (tmp_path / "run").exists()


def test_a_question_answerer_of_other_than_two_outputs_is_refused(tmp_path):
    """transformers builds qa_outputs with num_labels outputs; pygpt's span head has two."""
    bert_folder(tmp_path / "hf", "BertForQuestionAnswering")  # id2label: three labels
    code, message = convert("--from-hf", tmp_path / "hf", "--out", tmp_path / "run")
    assert code == 1 and "\n" not in message
    assert message.endswith("id2label has 3 labels (a question answerer's qa_outputs gives two "
                            "a token: start and end)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("config, named", [
    (dict(norm="pre", final_norm=True), "norm is 'pre'"),
    (dict(pos_encoding="rotary"), "pos_encoding is 'rotary'"),
    (dict(pos_encoding="alibi"), "pos_encoding is 'alibi'"),
    (dict(pos_encoding="relative"), "pos_encoding is 'relative'"),
    (dict(num_labels=2, pooling="mean"), "pooling is 'mean'"),
    (dict(activation="relu"), "activation is 'relu'"),
])
def test_berts_hf_cannot_hold_are_refused(tmp_path, config, named):
    random_bert(tmp_path / "run", **config)
    code, message = convert("--to-hf", tmp_path / "run", "--out", tmp_path / "hf")
    assert code == 1 and "\n" not in message and named in message, message
    assert not (tmp_path / "hf").exists()
