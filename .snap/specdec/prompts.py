"""Prompt files (`{"turns": [...]}` JSON lines) and chat-template encoding."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import PromptFileError


def load_prompts(path, limit: int | None = None) -> list[str]:
    """The first turn of each line of a JSONL prompt file."""
    path = Path(path)
    if not path.is_file():
        raise PromptFileError(f"no prompt file at {path}")
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            turns = json.loads(line)["turns"]
            out.append(str(turns[0]))
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as e:
            raise PromptFileError(f"{path}:{n}: expected {{\"turns\": [\"...\", ...]}}, found {line[:60]!r}") from e
        if limit is not None and len(out) >= limit:
            break
    return out


def chat_ids(tokenizer, text: str) -> list[int]:
    """Token ids of one user turn under the tokenizer's chat template, ready for generation."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
