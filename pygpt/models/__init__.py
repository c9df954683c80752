"""The model classes of the families, assembled from pygpt.nn (pygpt.families owns which class a
config's `arch` builds)."""
from __future__ import annotations

from pygpt.models.bert import BERT, BertOutput
from pygpt.models.gpt import GPT, GPTOutput
from pygpt.models.seq2seq import Seq2Seq, Seq2SeqOutput

__all__ = ["BERT", "BertOutput", "GPT", "GPTOutput", "Seq2Seq", "Seq2SeqOutput"]
