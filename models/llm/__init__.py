"""The LLM backend: any OpenAI-compatible chat endpoint (often the agent's own model).

Several segments go in one request, as a numbered JSON list in the user message; the
model answers a JSON object with the same ids. The system prompt is the service's own
fixed text: the thinking text travels only in the user message, framed as data, and the
target is named from this module's own table of language names, never by the client's raw tag.

With ``LLMConfig.context`` on, a segment's item may carry a ``context`` field: the text
before it in its stream (its last 2,000 characters), for consistent terms, never to be
translated or returned. Items of one stream that follow each other in a request share
it: only the first carries it, since the list already shows the rest (``context_fields``).
A request may name a model; ``catalog`` lists the endpoint's ``GET /models``.

A segment with protected spans (``Job.protected``, ``models.spans``) names them in its
item: ``keep``, the strings it must copy exactly, and ``terms``, the glossary terms of its
text with their renderings (``span_fields``); they are data in the user message like the
text, and the system prompt of a request with them (``SPANS_PROMPT``) says only what the
fields mean.

An answer is checked before it is used: same count, same ids, non-empty texts, each
protected span kept (always), and (unless ``LLMConfig.check_items`` is off) each text must
keep its source's numbers, inline code and URLs (the spans decide the last two where a
text has them) and have a length plausible for a translation of it: cheap checks that an
answer which obeys or answers the text, or swaps items, rarely passes. A
malformed answer is retried once as a whole; a well-formed answer with a few bad items
has only those items retried once. Whatever is still bad after that fails the batch
with BadOutput (the batch contract is all-or-nothing; the pipeline then returns the
originals with status ``error``, or the next backend in the chain serves them).

The package, bottom-up: ``prompt`` (the system prompt, language names, the user message),
``answers`` (parsing and judging an answer), ``endpoint`` (the HTTP client, usage, the
model list, error mapping), ``translator`` (``LLMTranslator``).
"""

from __future__ import annotations

from models.llm.answers import (
    SPAN_PROBLEM,
    MalformedAnswer,
    code_spans,
    context_problem,
    item_problem,
    number_forms,
    parse_answer,
    span_problem,
    text_weight,
    urls,
)
from models.llm.endpoint import listed_models, model_missing, usage_count
from models.llm.llm_translator import LLMConfig, LLMTranslator
from models.llm.prompt import (
    LANGUAGE_NAMES,
    MAX_CONTEXT_CHARS,
    PROMPT_ID,
    SPANS_PROMPT,
    SYSTEM_PROMPT,
    context_fields,
    language_name,
    span_fields,
)

__all__ = [
    "LANGUAGE_NAMES",
    "MAX_CONTEXT_CHARS",
    "PROMPT_ID",
    "SPANS_PROMPT",
    "SPAN_PROBLEM",
    "SYSTEM_PROMPT",
    "LLMConfig",
    "LLMTranslator",
    "MalformedAnswer",
    "code_spans",
    "context_fields",
    "context_problem",
    "item_problem",
    "language_name",
    "listed_models",
    "model_missing",
    "number_forms",
    "parse_answer",
    "span_fields",
    "span_problem",
    "text_weight",
    "urls",
    "usage_count",
]
