"""The engine's tokenizer as a Hugging Face tokenizer directory (``tokenizer.json`` + config).

Why: SGLang's ``/model_info`` names the served model's ``tokenizer_path`` (http_server.py
``model_info``), and SGLang's own clients load it: ``bench_serving`` (python/sglang/benchmark/
serving.py ``run_benchmark``) reads ``tokenizer_path`` from ``/model_info`` and opens it with
``AutoTokenizer.from_pretrained`` (benchmark/utils.py ``get_tokenizer``) to size and count its
prompts. So the engine writes its own tokenizer in that format and reports the directory.

The file is generated, not committed: it is a pure function of the corpus vocabulary (about 5 MB
with the reserved padding), written once per vocabulary into a cache directory
(``$XDG_CACHE_HOME/pytest-ddtree`` or ``~/.cache/pytest-ddtree``; the system temp directory when
that is not writable) under a name that carries the corpus digest, atomically (a finished
directory is renamed into place), so concurrent engines share one copy and never see half a file.

The ``tokenizer.json`` is the algorithm of :mod:`.tokenizer`, component for component: the
specials are added tokens (matched in text, skipped when decoding with ``skip_special_tokens``);
a ``Split`` pre-tokenizer with :data:`~.tokenizer.PIECE_PATTERN` (``Isolated``); a ``BPE`` model
with no merges, ``ignore_merges`` (a whole piece in the vocabulary is one token) and
``byte_fallback`` (an unknown character becomes its ``<0xXX>`` byte tokens); the ``ByteFallback``
and ``Fuse`` decoders; no normalizer and no post-processor (no BOS/EOS is added, as the engine
adds none). ``tests/test_refserver_tokenizer.py`` checks it id for id with the ``tokenizers``
library.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from pytest_ddtree.refserver.tokenizer import (
    ASSISTANT,
    END_OF_TURN,
    EOS,
    PIECE_PATTERN,
    SPECIAL_TOKENS,
    SYSTEM,
    USER,
    Tokenizer,
)

#: Bumped whenever the files' content changes for the same vocabulary.
EXPORT_FORMAT = 2  # 2: the chat template has the enable_thinking switch

#: The engine's chat template (Tokenizer.render_chat) in Jinja, for clients that apply it themselves.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] in ['system', 'developer'] -%}" + SYSTEM
    + "{%- elif message['role'] == 'assistant' -%}" + ASSISTANT
    + "{%- else -%}" + USER + "{%- endif -%}"
    "{{ '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}{{ part['text'] }}{%- endfor -%}{%- endif -%}"
    + END_OF_TURN + "{%- endfor -%}"
    "{%- if add_generation_prompt -%}" + ASSISTANT + "{{ '\\n' }}"
    # Qwen3's switch, as the engine's chat endpoint renders it (openai_endpoints.THINK_OFF_SUFFIX)
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)


def tokenizer_json(tok: Tokenizer) -> dict[str, Any]:
    """The ``tokenizers`` serialization of ``tok`` (see the module docstring)."""
    added = [
        {"id": tok.special_to_id[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for s in SPECIAL_TOKENS
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": PIECE_PATTERN},
            "behavior": "Isolated",
            "invert": False,
        },
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": True,
            "ignore_merges": True,
            "vocab": {piece: i for i, piece in enumerate(tok.vocabulary())},
            "merges": [],
        },
    }


def tokenizer_config(tok: Tokenizer, model_max_length: int) -> dict[str, Any]:
    """``tokenizer_config.json``: a fast tokenizer class, so ``AutoTokenizer`` needs no ``config.json``."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "bos_token": None,
        "unk_token": None,
        "pad_token": EOS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(tok.special_to_id[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                        "single_word": False, "special": True}
            for s in SPECIAL_TOKENS
        },
        "refserver_tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
    }


def cache_root() -> Path:
    """Where exported tokenizers live (see the module docstring)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pytest-ddtree"


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-", delete=True)
        probe.close()
        return True
    except OSError:
        return False


def export_dir(tok: Tokenizer, corpus_digest: str, model_max_length: int = 1 << 20,
               root: Path | None = None) -> Path:
    """The directory holding ``tok`` in Hugging Face format, written if missing; returns its path.

    ``model_max_length`` is fixed (not the server's context length) so that every engine of one
    corpus shares one directory.
    """
    name = f"refserver-tokenizer-{corpus_digest}-v{tok.vocab_size}-f{EXPORT_FORMAT}"
    roots = [root] if root is not None else [cache_root(), Path(tempfile.gettempdir()) / "pytest-ddtree"]
    last_error: OSError | None = None
    for base in roots:
        final = base / name
        if (final / "tokenizer.json").is_file() and (final / "tokenizer_config.json").is_file():
            return final
        if not _writable(base):
            continue
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base))
        try:
            (tmp / "tokenizer.json").write_text(json.dumps(tokenizer_json(tok), ensure_ascii=False), encoding="utf-8")
            (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok, model_max_length), indent=1),
                                                       encoding="utf-8")
            special_map = {"eos_token": EOS, "pad_token": EOS}
            (tmp / "special_tokens_map.json").write_text(json.dumps(special_map, indent=1), encoding="utf-8")
            try:
                os.rename(tmp, final)
            except OSError:  # another engine finished first: use its copy
                if not (final / "tokenizer.json").is_file():
                    raise
            return final
        except OSError as exc:
            last_error = exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    raise OSError(f"cannot write the tokenizer directory under {', '.join(map(str, roots))}: {last_error}")
