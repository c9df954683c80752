"""Translation quality with sacreBLEU, the field's reference implementation (so figures compare
with published ones): corpus BLEU with sacreBLEU's defaults (13a tokenization, exponential
smoothing, case-sensitive), the same BLEU on lowercased text, and chrF (character 6-grams,
beta 2). All are corpus-level scores in 0..100 over detokenized text, one reference per line."""
from __future__ import annotations

from typing import NamedTuple, Sequence


class Scores(NamedTuple):
    bleu: float  # sacreBLEU's default BLEU
    bleu_lowercase: float  # BLEU with lowercase=True
    chrf: float  # sacreBLEU's default chrF

    def describe(self) -> str:
        return (f"BLEU {self.bleu:.2f}, BLEU (lowercased) {self.bleu_lowercase:.2f}, "
                f"chrF {self.chrf:.2f}")


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """The scores of hypotheses against references, line i of one against line i of the other;
    a ValueError when the counts differ or there are none."""
    from sacrebleu.metrics import BLEU, CHRF  # imported here: only scoring needs it

    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} translations but {len(references)} references: "
                         "each line needs one")
    if not hypotheses:
        raise ValueError("nothing to score: no translations")
    refs = [references]
    return Scores(float(BLEU().corpus_score(hypotheses, refs).score),
                  float(BLEU(lowercase=True).corpus_score(hypotheses, refs).score),
                  float(CHRF().corpus_score(hypotheses, refs).score))
