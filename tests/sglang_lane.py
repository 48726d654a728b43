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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.polling import wait_until

REPO_ROOT = Path(__file__).resolve().parent.parent
SGLANG_PYTHON_ENV = "DDTREE_SGLANG_PYTHON"
STANDIN_DIR = Path(__file__).resolve().parent / "sglang_cpu"
REQUIREMENTS = STANDIN_DIR / "requirements.txt"
SGLANG_VERSION = "0.5.23"
CALLS_LOG_ENV = "DDTREE_SGL_KERNEL_CALLS"
#: The hidden size of every lane model.
HIDDEN = 64

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
    vocab = write_tokenizer(folder)
    write_config(folder, llama_config(vocab, layers=2))
    return folder


def write_tokenizer(folder: Path) -> int:
    """The lane's byte-level BPE tokenizer (and its tokenizer_config) in ``folder``: its vocabulary size."""
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
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": 32768,
        "chat_template": (
            "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}"
        ),
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1), encoding="utf-8")
    return int(tokenizer.get_vocab_size())


def llama_config(vocab: int, *, layers: int) -> dict[str, object]:
    """The Llama config every lane model shares (hidden 64, 4 heads of 16, 2 KV heads), ``layers`` deep."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": HIDDEN, "intermediate_size": 2 * HIDDEN, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": HIDDEN // 4, "num_hidden_layers": layers, "vocab_size": vocab, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False, "rope_theta": 10000.0,
    }


def write_config(folder: Path, config: dict[str, object]) -> None:
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")


#: Seconds real SGLang gets to answer /health on this box (measured ~20 s alone, longer under load).
READY_TIMEOUT_S = 240.0


@contextlib.contextmanager
def launch_real_sglang(folder: Path, port: int, *, python: Path | None = None, extra_args: Sequence[str] = (),
                       ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[str]:
    """Real SGLang serving the tiny model of ``folder`` (built there if absent) on 127.0.0.1:``port``."""
    model = folder / "model"
    if not (model / "config.json").exists():
        build_tiny_model(model)
    with serve_sglang(model, port, folder / f"sglang-{port}.log", [*shlex.split(CPU_FLAGS), *extra_args],
                      python=python, ready_timeout_s=ready_timeout_s) as url:
        yield url


@contextlib.contextmanager
def serve_sglang(model: Path, port: int, log_path: Path, args: Sequence[str], *, python: Path | None = None,
                 env: Mapping[str, str] | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[str]:
    """Real SGLang serving ``model`` with ``args`` on 127.0.0.1:``port``, its log in ``log_path``.

    Yields the base URL once ``/health`` answers 200. The server runs in its own process group
    (SGLang forks a scheduler and a detokenizer), which is killed and waited for on exit, also
    when the start fails; a start that dies or passes the deadline raises with the log's tail.
    ``env`` is added to server_env() (the calls log, a PYTHONPATH of its own).
    """
    import requests

    if python is None:
        python, why = sglang_python()
        if python is None:
            raise RuntimeError(why)
    command = [str(python), "-m", "sglang.launch_server", "--model-path", str(model), *args,
               "--enable-metrics", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **server_env(), **(env or {})}, start_new_session=True)
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


# --- Speculation on a CPU: models whose acceptance is known before the server starts -------------

@dataclass(frozen=True)
class SpecModels:
    """The folders of the speculative lane and the tokens that make its acceptance predictable.

    ``target`` answers ``token`` after any input (greedy), so a draft that always proposes
    ``token`` has every draft accepted and one that always proposes ``other`` has none.
    """

    target: Path
    eagle3_agreeing: Path
    eagle3_disagreeing: Path
    dflash: Path
    token: int
    other: int

    def repeating_prompt(self, length: int = 64) -> list[int]:
        """Input ids NGRAM's corpus matches at once: the target's own answer, over and over."""
        return [self.token] * length


#: What each algorithm's tokens per verify (sum of completion_tokens / sum of spec_verify_ct) is on
#: the models of build_spec_models: every draft of a chain or of the tree's best path accepted
#: (EAGLE3 and STANDALONE: 3 steps, 4 tokens a verify; NGRAM: 8; DFLASH: its block of 4), or none.
PREDICTED_TOKENS_PER_VERIFY = {"EAGLE3": 4.0, "EAGLE3-disagreeing": 1.0, "STANDALONE": 4.0, "NGRAM": 8.0, "DFLASH": 4.0}


def build_spec_models(folder: Path, python: Path) -> SpecModels:
    """The constant target, its EAGLE3 drafts and a DFlash draft under ``folder`` (kept if there).

    The configs, tokenizer and every weight's recipe are decided here; ``python`` (the SGLang
    venv's, which has torch) writes the safetensors with tests/sglang_cpu/write_weights.py.
    """
    target = folder / "target"
    vocab = write_tokenizer(target)
    token, other = _answer_tokens(target)
    models = SpecModels(target, folder / "eagle3-agreeing", folder / "eagle3-disagreeing", folder / "dflash",
                        token, other)
    if all((path / "model.safetensors").exists() for path in (target, models.eagle3_agreeing,
                                                             models.eagle3_disagreeing, models.dflash)):
        return models
    write_config(target, llama_config(vocab, layers=TARGET_LAYERS))
    _write_recipe(target, _constant_llama(vocab, TARGET_LAYERS, token))
    for path, proposal in ((models.eagle3_agreeing, token), (models.eagle3_disagreeing, other)):
        _copy_tokenizer(target, path)
        write_config(path, {**llama_config(vocab, layers=1), "architectures": ["LlamaForCausalLMEagle3"],
                            "draft_vocab_size": vocab, "target_hidden_size": HIDDEN,
                            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}})
        _write_recipe(path, _constant_eagle3(vocab, proposal))
    _copy_tokenizer(target, models.dflash)
    write_config(models.dflash, _dflash_config(vocab))
    _write_recipe(models.dflash, _constant_dflash())
    written = subprocess.run(
        [str(python), str(STANDIN_DIR / "write_weights.py"), *(str(p) for p in (target, models.eagle3_agreeing,
                                                                             models.eagle3_disagreeing, models.dflash))],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if written.returncode != 0:
        raise RuntimeError(f"writing the lane's weights failed ({written.returncode}):\n{written.stderr[-3000:]}")
    return models


#: The flags every speculative server of the lane starts with, and its plain twin (the control and
#: the lossless reference) too. The split intel_amx flags are SGLang's CPU speculative path: the
#: tree-masked verify and the multi-step draft (sglang/srt/layers/attention/intel_amx_backend.py),
#: which the draft worker inherits (speculative/draft_utils.py:46-61); the single
#: ``--attention-backend intel_amx`` would be swapped for torch_native on a CPU without AMX
#: (arg_groups/overrides.py:1300-1308), which has no tree mask. bf16 (the backend's kernels and
#: DFlash's draft want it); real weights (the models' safetensors, no --load-format dummy); the
#: overlap scheduler off (0.5.23 turns it off for speculation on a CPU anyway,
#: arg_groups/speculative_hook.py:64-78; said here so the plain twin is alike); a small KV pool;
#: ``--sleep-on-idle`` so the idle scheduler leaves the core alone.
SPEC_CPU_FLAGS = (
    "--device cpu --prefill-attention-backend intel_amx --decode-attention-backend intel_amx --dtype bfloat16 "
    "--disable-cuda-graph --disable-overlap-schedule --max-total-tokens 8192 --mem-fraction-static 0.3 "
    "--sleep-on-idle"
)
#: The test-only sitecustomize that lets DFLASH serve on a CPU (four device checks, each named there).
DFLASH_PATCHES = STANDIN_DIR / "dflash_patches"


def plain_args() -> list[str]:
    """The flags of every launch of the lane after ``--model-path``: alone, the plain launch (the control
    and the lossless reference); a speculative launch adds one of the ``*_args`` below to them."""
    return shlex.split(SPEC_CPU_FLAGS)


def eagle3_args(draft: Path) -> list[str]:
    """EAGLE3 with ``draft``: a tree of topk 2, 3 steps, 6 draft tokens (the root counted)."""
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft), *_tree_args()]


def standalone_args(draft: Path) -> list[str]:
    """STANDALONE with ``draft`` (an ordinary model: the constant target itself), the same tree as EAGLE3."""
    return ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", str(draft), *_tree_args()]


def ngram_args() -> list[str]:
    """NGRAM with 8 draft tokens: proposals from the request's own tokens, no draft model."""
    return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "8"]


def dflash_args(draft: Path) -> list[str]:
    """DFLASH with ``draft``, a block of DFLASH_BLOCK (the verify width); serve it under dflash_env()."""
    return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(draft),
            "--speculative-num-draft-tokens", str(DFLASH_BLOCK)]


def dflash_env() -> dict[str, str]:
    """The DFLASH server's environment beyond server_env(): the device-check patches on its path."""
    return {"PYTHONPATH": os.pathsep.join([str(DFLASH_PATCHES), str(STANDIN_DIR)])}


def _tree_args() -> list[str]:
    return ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]


#: The target's depth (EAGLE3's drafts read the hidden states after its layers 0, 1 and 2: without
#: ``eagle_aux_hidden_state_layer_ids`` 0.5.23 captures layers 2, 2 and 1 of 4, two features, not three).
TARGET_LAYERS = 4
#: DFLASH's block (tokens a verify, the verified one included) on the lane.
DFLASH_BLOCK = 4

Recipe = dict[str, dict[str, object]]


def _answer_tokens(target: Path) -> tuple[int, int]:
    """Two ordinary words of the tokenizer (a space and 3+ letters): what the target and the disagreeing draft say."""
    vocab: dict[str, int] = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    words = sorted(i for text, i in vocab.items() if text.startswith("\u0120") and text[1:].isascii() and text[1:].isalpha() and len(text) > 3)
    return words[0], words[1]


def _copy_tokenizer(source: Path, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((source / name).read_bytes())


def _write_recipe(folder: Path, tensors: Recipe) -> None:
    (folder / "recipe.json").write_text(json.dumps({"seed": 0, "tensors": tensors}), encoding="utf-8")


def _e0(size: int) -> dict[str, object]:
    """A vector that keeps dimension 0 alone (a final norm's weight): 1 there, 0 elsewhere."""
    return {"shape": [size], "entries": [[0, 1.0]]}


def _layer(prefix: str, attention_in: int, *, gemma: bool = False) -> Recipe:
    """One decoder layer that adds nothing to the residual stream: random q/k/v (the attention
    kernels compute something real) and MLP input, zero o_proj and down_proj."""
    unit = 0.0 if gemma else 1.0  # a Gemma norm scales by 1 + weight
    heads, kv, head = 4, 2, HIDDEN // 4
    return {
        f"{prefix}.input_layernorm.weight": {"shape": [HIDDEN], "base": unit},
        f"{prefix}.post_attention_layernorm.weight": {"shape": [HIDDEN], "base": unit},
        f"{prefix}.self_attn.q_proj.weight": {"shape": [heads * head, attention_in], "base": "normal", "scale": 0.2},
        f"{prefix}.self_attn.k_proj.weight": {"shape": [kv * head, attention_in], "base": "normal", "scale": 0.2},
        f"{prefix}.self_attn.v_proj.weight": {"shape": [kv * head, attention_in], "base": "normal", "scale": 0.2},
        f"{prefix}.self_attn.o_proj.weight": {"shape": [HIDDEN, heads * head]},
        f"{prefix}.mlp.gate_proj.weight": {"shape": [2 * HIDDEN, HIDDEN], "base": "normal", "scale": 0.2},
        f"{prefix}.mlp.up_proj.weight": {"shape": [2 * HIDDEN, HIDDEN], "base": "normal", "scale": 0.2},
        f"{prefix}.mlp.down_proj.weight": {"shape": [HIDDEN, 2 * HIDDEN]},
    }


def _lm_head(vocab: int, token: int) -> dict[str, object]:
    """Logits that are 0 for every token but ``token``, which gets 10 times the final hidden's dimension 0."""
    return {"shape": [vocab, HIDDEN], "entries": [[token, 0, 10.0]]}


def _constant_llama(vocab: int, layers: int, token: int) -> Recipe:
    """A Llama whose greedy answer is ``token`` after any input.

    Every embedding has dimension 0 at 1; no layer writes to the residual stream (o_proj and
    down_proj are zero), so the final hidden is the input's embedding; the final norm keeps its
    dimension 0 (positive) and the lm_head turns that into a logit for ``token`` alone.
    """
    recipe: Recipe = {"model.embed_tokens.weight": {"shape": [vocab, HIDDEN], "base": "normal", "scale": 0.3,
                                                    "column": [0, 1.0]},
                      "model.norm.weight": _e0(HIDDEN), "lm_head.weight": _lm_head(vocab, token)}
    for index in range(layers):
        recipe.update(_layer(f"model.layers.{index}", HIDDEN))
    return recipe


def _constant_eagle3(vocab: int, token: int) -> Recipe:
    """An EAGLE3 draft that proposes ``token`` at every step.

    Its fc keeps dimension 0 of the first captured target hidden (the embedding's, 1) and nothing
    else, so the draft's residual stream is e0 at its first step and stays so (its layer adds
    nothing, and later steps feed its own pre-norm hidden back); its norm and lm_head read that
    as the target's do. Its own lm_head (``draft_vocab_size`` set) makes the disagreeing draft possible.
    """
    recipe: Recipe = {
        "model.embed_tokens.weight": {"shape": [vocab, HIDDEN], "base": "normal", "scale": 0.3, "column": [0, 1.0]},
        "model.fc.weight": {"shape": [HIDDEN, 3 * HIDDEN], "entries": [[0, 0, 1.0]]},
        "model.layers.0.hidden_norm.weight": {"shape": [HIDDEN], "base": 1.0},
        "model.norm.weight": _e0(HIDDEN), "lm_head.weight": _lm_head(vocab, token),
    }
    recipe.update(_layer("model.layers.0", 2 * HIDDEN))
    return recipe


def _dflash_config(vocab: int) -> dict[str, object]:
    """A one-layer DFlash draft of block 4 over target layers 1 and 2.

    ``use_gemma_norm``: without it the attention's q/k norm is a Triton kernel
    (sglang/srt/models/dflash.py:283-289, 383-397), which does not run on a CPU.
    ``mask_token_id`` names a token the tokenizer has (the default ``<|MASK|>`` it has not).
    """
    return {**llama_config(vocab, layers=1), "architectures": ["DFlashDraftModel"],
            "use_gemma_norm": True, "block_size": DFLASH_BLOCK,
            "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 0}}


def _constant_dflash() -> Recipe:
    """A DFlash draft whose every block position reads as the target's answer.

    Its input is the target's embeddings of the block (dimension 0 at 1); its layer adds nothing
    to the residual stream and its final (Gemma, 1 + weight) norm keeps dimension 0 alone, so the
    target's lm_head, which DFLASH borrows, answers the target's token at every position.
    """
    recipe: Recipe = {"fc.weight": {"shape": [HIDDEN, 2 * HIDDEN], "base": "normal", "scale": 0.2},
                      "hidden_norm.weight": {"shape": [HIDDEN]},
                      "norm.weight": {"shape": [HIDDEN], "base": -1.0, "entries": [[0, 0.0]]},
                      "layers.0.self_attn.q_norm.weight": {"shape": [HIDDEN // 4]},
                      "layers.0.self_attn.k_norm.weight": {"shape": [HIDDEN // 4]}}
    recipe.update(_layer("layers.0", HIDDEN, gemma=True))
    return recipe


def implemented_kernels(python: Path) -> set[str]:
    """The kernel names the CPU sgl_kernel library implements (its exported functions and its
    torch.ops.sgl_kernel ops), asked of ``python`` (the SGLang venv's: it has torch)."""
    probe = subprocess.run(
        [str(python), "-c",
         "import json, sgl_kernel, torch; "
         "ops = [n.split('::', 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith('sgl_kernel::')]; "
         "print(json.dumps(sorted({*sgl_kernel.__all__, *ops})))"],
        capture_output=True, text=True, timeout=120, check=False, env={"PYTHONPATH": str(STANDIN_DIR)},
    )
    if probe.returncode != 0:
        raise RuntimeError(f"asking {python} for sgl_kernel's names failed:\n{probe.stderr[-2000:]}")
    return set(json.loads(probe.stdout))
