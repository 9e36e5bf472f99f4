"""The LLM backend: any OpenAI-compatible chat endpoint (often the agent's own model).

For deployments that already run a chat model, or want one's terms and context: segments
go as JSON data in the user message under the service's own fixed system prompt, so the
thinking text can never instruct the model, and every answer is checked (ids, numbers,
code, URLs, protected spans) before it is used, a bad one asked again once. Its modules
are built bottom up (docs/ARCHITECTURE.md); docs/backends.md tells how to configure it.
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
