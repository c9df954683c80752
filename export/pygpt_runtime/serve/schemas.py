"""The server's request bodies as pydantic models: FastAPI checks every request against them
(a wrong type, a value out of range, an unknown field: a 400 naming the field) and publishes them
in its OpenAPI schema. Types are strict (a string is no number, a number no string) and numbers
finite. The completion fields are OpenAI's (its `openai` client sends them unchanged)."""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from pygpt_runtime.cli_checks import MAX_SEED
from pygpt_runtime.onnx_search import MAX_LENGTH_PENALTY
from pygpt_runtime.serve.logprobs import MAX_LOGPROBS

Text = Annotated[str, Field(min_length=1)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
STOPS = 4  # the most stop sequences a request may give (OpenAI's limit)
MAX_BEAM = 32  # beams cost memory per sentence


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(Body):
    include_usage: bool = False  # a last chunk with the usage counts, before [DONE]


class CompletionRequest(Body):
    model: Optional[str] = Field(None, description="the served model's id (GET /v1/models)")
    prompt: Union[Text, Annotated[list[Text], Field(min_length=1)]] = Field(
        description="the text to continue, or a list of texts (one choice each)")
    max_tokens: int = Field(16, ge=0, description="tokens to generate per prompt")
    temperature: Finite = Field(1.0, ge=0, description="0: greedy (argmax)")
    top_p: Finite = Field(1.0, gt=0, le=1, description="nucleus sampling threshold")
    top_k: Optional[int] = Field(None, ge=1, description="sample among the k most likely")
    seed: Optional[int] = Field(None, ge=0, le=MAX_SEED,
                                description="reproducible sampling: the tokens pygpt-run "
                                            "--seed gives")
    stop: Union[None, Text, Annotated[list[Text], Field(max_length=STOPS)]] = Field(
        None, description="text that ends a choice (not included)")
    stream: bool = Field(False, description="server-sent events, ending in data: [DONE]")
    stream_options: Optional[StreamOptions] = None
    n: int = Field(1, ge=1, description="choices per prompt (with a seed, choice i draws with "
                                        "seed + i); prompts x n may not pass the server's "
                                        "--max-batch")
    echo: bool = Field(False, description="the prompt's text (and its tokens' log-probabilities) "
                                          "before the completion's")
    logprobs: Optional[int] = Field(None, ge=0, le=MAX_LOGPROBS,
                                    description="each token's log-probability, with this many "
                                                "most likely alternatives")
    user: Optional[str] = None

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def stops(self) -> list[str]:
        return [] if self.stop is None else [self.stop] if isinstance(self.stop, str) \
            else list(self.stop)

    def sampling(self) -> dict:
        """run_onnx.next_token's settings (top_p 1 and temperature 0 as pygpt-run's defaults
        and --greedy)."""
        return {"greedy": self.temperature == 0, "temperature": self.temperature or 1.0,
                "top_k": self.top_k, "top_p": None if self.top_p == 1 else self.top_p}


class FillMaskRequest(Body):
    text: Text = Field(description="a text with one or more [MASK]s")
    top_k: int = Field(5, ge=1, description="fills per mask")


class ClassifyRequest(Body):
    text: Text
    text_pair: Optional[Text] = Field(None, description="the second text of a pair classifier")


class TagRequest(Body):
    text: Text = Field(description="the text whose named entities to find")


class AnswerRequest(Body):
    question: Text
    context: Text = Field(description="the text that holds the answer (read in overlapping "
                                      "windows when longer than the model's)")
    no_answer: bool = Field(False, description="the question may go unanswered (SQuAD v2.0): "
                                               "when the [CLS] score beats the best span's by "
                                               "more than null_threshold")
    null_threshold: Finite = Field(0.0, description="how far the [CLS] score must beat the "
                                                    "best span's for no answer")


class TranslateRequest(Body):
    text: Union[Text, Annotated[list[str], Field(min_length=1)]] = Field(
        description="a sentence, or a list of sentences")
    beam: int = Field(4, ge=1, le=MAX_BEAM, description="beam size (1: greedy)")
    length_penalty: Finite = Field(0.6, ge=0, le=MAX_LENGTH_PENALTY, description="GNMT's alpha")
    max_len_extra: int = Field(50, ge=0, description="a translation holds at most the source's "
                                                     "tokens + this many")


class AttentionRequest(Body):
    text: Text = Field(description="the text whose attention maps to compute (a translator's "
                                   "source; a BERT's pair as 'A [SEP] B', segment B after the "
                                   "[SEP])")
    layer: Optional[int] = Field(None, ge=0, description="one layer's maps (default: every "
                                                         "layer's)")
    part: Optional[Literal["self", "encoder", "decoder", "cross"]] = Field(
        None, description="one part's maps: a GPT's or BERT's self, a translator's encoder, "
                          "decoder or cross (default: every part's)")
    target: Optional[Text] = Field(None, description="a translator: the translation whose "
                                                     "maps to compute (default: the model's "
                                                     "greedy translation)")
