"""Real SGLang in the test loop: where its interpreter is, a tiny model for it, how it is started.

SGLang 0.5.23 serves on a CPU box (non-speculative) with a random-weight two-layer Llama and an
import-only `sgl_kernel` stand-in (tests/sglang_cpu/sgl_kernel). It lives in its own virtual
environment (`.venv-sglang`, made by `.ci/run` from tests/sglang_cpu/requirements.txt with
`--no-deps`): it pins torch, transformers and tokenizers to its own versions and its declared
dependencies include CUDA-only kernels that cannot install here, so it cannot be an extra of this
package. Tests find it through DDTREE_SGLANG_PYTHON (the venv's python) or `.venv-sglang/bin/python`
at the checkout's root, and skip with the reason where it is absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.polling import wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
SGLANG_PYTHON_ENV = "DDTREE_SGLANG_PYTHON"
STANDIN_DIR = Path(__file__).resolve().parent / "sglang_cpu"
REQUIREMENTS = STANDIN_DIR / "requirements.txt"
SGLANG_VERSION = "0.5.23"
CALLS_LOG_ENV = "DDTREE_SGL_KERNEL_CALLS"

# The flags that make 0.5.23 serve on a CPU: the torch_native attention backend (no GPU kernels),
# dummy weights (no download), no CUDA graphs, and a small KV pool (without --max-total-tokens it
# sizes a 25.9M-token pool from the host's memory: 140 s and 9 GB).
CPU_FLAGS = (
    "--device cpu --attention-backend torch_native --load-format dummy --disable-cuda-graph "
    "--max-total-tokens 16384 --mem-fraction-static 0.3"
)


def sglang_python() -> tuple[Path | None, str]:
    """The interpreter of the real-SGLang venv, or None and why it is not usable."""
    named = os.environ.get(SGLANG_PYTHON_ENV)
    candidate = Path(named) if named else REPO_ROOT / ".venv-sglang" / "bin" / "python"
    where = f"{SGLANG_PYTHON_ENV}={named}" if named else str(candidate)
    if not candidate.exists():
        return None, (
            f"real SGLang is not installed ({where} does not exist): make it with "
            f"`python3 -m venv .venv-sglang && .venv-sglang/bin/pip install --no-deps -r {REQUIREMENTS.relative_to(REPO_ROOT)}` "
            "(.ci/run does)"
        )
    probe = subprocess.run(
        [str(candidate), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    version = probe.stdout.strip()
    if probe.returncode != 0 or version != SGLANG_VERSION:
        return None, f"{where} has no sglang {SGLANG_VERSION} (found {version or probe.stderr.strip()[-200:]!r})"
    return candidate, ""


def server_env(calls_log: Path | None = None) -> dict[str, str]:
    """The environment real SGLang serves under here: the CPU engine and the sgl_kernel stand-in."""
    env = {
        "SGLANG_USE_CPU_ENGINE": "1",
        "PYTHONPATH": str(STANDIN_DIR),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    if calls_log is not None:
        env[CALLS_LOG_ENV] = str(calls_log)
    return env


def build_tiny_model(folder: Path) -> Path:
    """A random-weight two-layer Llama (hidden 64) with a byte-level BPE tokenizer, in ``folder``.

    The tokenizer is trained on the engine's bundled corpus so `/tokenize` of the throughput
    prompts gives ordinary token counts; the chat template is a plain role: content one, so
    `/v1/chat/completions` works. `--load-format dummy` makes the weights: no file of them.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    corpus = REPO_ROOT / "pytest_ddtree" / "refserver" / "corpus"
    texts = [path.read_text(encoding="utf-8") for path in sorted(corpus.iterdir()) if path.is_file()]
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "vocab_size": tokenizer.get_vocab_size(), "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "rope_theta": 10000.0,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 32768,
        "chat_template": (
            "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}"
        ),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1), encoding="utf-8")
    return folder


#: Seconds real SGLang gets to answer /health on this box (measured ~20 s alone, longer under load).
READY_TIMEOUT_S = 240.0


@contextlib.contextmanager
def launch_real_sglang(folder: Path, port: int, *, python: Path | None = None, extra_args: Sequence[str] = (),
                       ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[str]:
    """Real SGLang serving the tiny model of ``folder`` (built there if absent) on 127.0.0.1:``port``.

    Yields the base URL once ``/health`` answers 200. The server runs in its own process group
    (SGLang forks a scheduler and a detokenizer), which is killed and waited for on exit, also
    when the start fails; a start that dies or passes the deadline raises with the log's tail.
    """
    import requests

    if python is None:
        python, why = sglang_python()
        if python is None:
            raise RuntimeError(why)
    model = folder / "model"
    if not (model / "config.json").exists():
        build_tiny_model(model)
    log_path = folder / f"sglang-{port}.log"
    command = [str(python), "-m", "sglang.launch_server", "--model-path", str(model), *shlex.split(CPU_FLAGS),
               "--enable-metrics", "--host", "127.0.0.1", "--port", str(port), *extra_args]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **server_env()}, start_new_session=True)
    try:
        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"real SGLang exited with {proc.returncode} while starting:\n{_tail(log_path)}")
            try:
                return requests.get(url + "/health", timeout=5).status_code == 200
            except requests.RequestException:
                return False

        try:
            wait_until(healthy, ready_timeout_s, "real SGLang's /health", interval=0.2)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}:\n{_tail(log_path)}") from None
        yield url
    finally:
        _stop_group(proc)


def _tail(path: Path, limit: int = 4000) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-limit:]


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL after a grace, then reap it."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    # the group may outlive its leader (the scheduler child): make sure none of it is left
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
