"""A tiny translator for the translation command line and export tests: a char tokenizer with
the translator's specials over "abcdefgh .", and a seq2seq trained for a few dozen steps to
reverse strings of those letters; far from perfect, so its outputs vary with the sentence, stop
at different lengths and repeat little (a random model repeats one letter), and fast to make."""
import torch

from pygpt.config import ModelConfig
from pygpt.families import build
from pygpt.data.parallel import ParallelCorpus
from pygpt.tokenizer import SEQ2SEQ_SPECIALS, CharTokenizer

LETTERS = "abcdefgh"
CFG = ModelConfig(arch="seq2seq", vocab_size=14, block_size=16, n_layer=2, n_head=2, n_embd=32,
                  pos_encoding="sinusoidal")


def tokenizer() -> CharTokenizer:
    tok = CharTokenizer.from_text(LETTERS + " .", specials=SEQ2SEQ_SPECIALS)
    assert tok.vocab_size == CFG.vocab_size
    return tok


def words(n: int, seed: int) -> list[str]:
    """n random strings of 1..10 letters."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 11, (n,), generator=g).tolist()
    return ["".join(LETTERS[i] for i in torch.randint(len(LETTERS), (k,), generator=g).tolist())
            for k in lengths]


def reverser(steps: int = 60, cfg: ModelConfig = CFG):
    """A seq2seq trained `steps` Adam steps to reverse words, in eval mode."""
    tok = tokenizer()
    torch.manual_seed(0)
    model = build(cfg)
    pairs = [(w, w[::-1]) for w in words(512, seed=1)]
    corpus = ParallelCorpus.from_pairs(pairs, tok.encode, tok.special_tokens, max_len=15)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = corpus.batch(torch.randint(len(corpus), (32,), generator=g).tolist())
        loss = model(*batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()
