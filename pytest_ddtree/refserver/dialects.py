"""How each SGLang build the harness ships a profile for turns launch flags and environment into a
speculative configuration: the reference engine's ``--dialect``.

Why: a shipped profile is only worth something if its flags mean, on the engine CI runs it against,
what they mean on the build it names. Each dialect below follows that build's own argument handling
(cited per function), including its refusals (exit 1 with the build's message, before the port
opens) and its silent overrides (a log warning, the value in effect in ``/server_info``). The
reference dialect is the engine's own: every config field has a flag, so the default profile can
run every matrix config.

A dialect turns the parsed flags and the environment into a :class:`Resolved`: the configuration the
engine runs (DDTree budget = non-root nodes, topk = candidates per depth) and the server-arg keys
``/server_info`` reports for it, named and valued as that build reports them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DIALECTS = ("reference", "upstream", "ddtree", "subsir", "subsir-flags", "pr31069", "eagle3", "pr29907", "pr36196", "pr32053")
DIALECT_HELP = {
    "reference": "the engine's own flags: block size, budget (--speculative-num-draft-tokens), topk, window",
    "upstream": "upstream SGLang DFLASH (sgl-project/sglang main): a chain; topk forced to 1, block size = num draft tokens",
    "ddtree": "PR 27509 (Rancy-Wang/sglang ddtree-v2): --speculative-algorithm DDTREE, --speculative-ddtree-block-size/-budget",
    "subsir": "SubSir/sglang fork, v1 worker: DFLASH with tree verify sized by SGLANG_DFLASH_TREE_VERIFY* environment variables",
    "subsir-flags": "SubSir/sglang fork, v2 port: SGLANG_DFLASH_TREE_VERIFY=1 with --speculative-dflash-block-size, "
                    "--speculative-num-draft-tokens (tree nodes, the root included) and --speculative-eagle-topk",
    "pr31069": "sgl-project/sglang PR 31069: --speculative-dflash-tree-verify, topk from --speculative-eagle-topk (4, 8 or 16)",
    "eagle3": "SGLang 0.5.23 EAGLE / EAGLE3: --speculative-num-steps (depth), --speculative-eagle-topk, "
              "--speculative-num-draft-tokens (tree nodes, the root included); the engine's drafter stands in for EAGLE's",
    "pr29907": "sgl-project/sglang PR 29907 (open): --speculative-algorithm DDTREE, --speculative-ddtree-budget, "
               "SGLANG_DDTREE_MAX_TOPK caps the derived width; page size 1 only, overlap scheduling off",
    "pr36196": "sgl-project/sglang PR 36196 (open): DFLASH --speculative-dflash-tree-width W (topk W, 1 + (bs-1)W nodes), "
               "SGLANG_DFLASH_MAX_NUM_NODES; --speculative-eagle-topk refused",
    "pr32053": "sgl-project/sglang PR 32053 (open): DFLASH --speculative-dflash-verify-budget V in [1, block size]: "
               "the target verifies V tokens of the block",
}


#: The reference dialect's config when DFLASH is on and a flag is not given: bs8_b8_k4.
REFERENCE_DEFAULTS = {"speculative_dflash_block_size": 8, "speculative_num_draft_tokens": 8, "speculative_eagle_topk": 4}


class DialectError(ValueError):
    """The build would refuse these arguments (it raises ValueError before the server starts)."""


@dataclass(frozen=True)
class Resolved:
    """What a build runs for the given flags and environment."""

    algorithm: str  # DFLASH (tree or chain) or NONE
    block_size: int
    budget: int
    topk: int
    window: int | None
    server_args: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _window(text: str) -> int | None:
    if text.strip().lower() in ("none", "null", ""):
        return None
    return _positive(text)


def _algorithm(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().upper()
        if value not in choices:
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(choices)})")
        return value

    return parse


def add_speculative_flags(parser: argparse.ArgumentParser, dialect: str) -> None:
    """The speculative flags the dialect's build accepts; anything else is an argparse error (exit 2),
    as an unknown flag is for ``sglang.launch_server``."""
    s = parser.add_argument_group(f"speculative decoding (dialect {dialect})")
    if dialect == "reference":
        s.add_argument("--speculative-algorithm", type=_algorithm(("DFLASH", "NONE")), default=None,
                       help="DFLASH (DDTree verification). Absent: DFLASH when a flag below is given, else no "
                            "speculation, as SGLang serves a launch without speculative flags (NONE: no speculation "
                            "too, kept for older profiles)")
        s.add_argument("--speculative-dflash-block-size", type=_positive, default=None,
                       help=f"drafter block size; the tree depth is block_size - 1 (default: {REFERENCE_DEFAULTS['speculative_dflash_block_size']})")
        s.add_argument("--speculative-num-draft-tokens", type=_positive, default=None,
                       help=f"DDTree budget: non-root tree nodes verified per step (default: {REFERENCE_DEFAULTS['speculative_num_draft_tokens']})")
        s.add_argument("--speculative-eagle-topk", type=_positive, default=None,
                       help=f"candidates per depth (default: {REFERENCE_DEFAULTS['speculative_eagle_topk']})")
        s.add_argument("--speculative-draft-window-size", "--speculative-dflash-draft-window-size",
                       dest="speculative_draft_window_size", type=_window, default=None,
                       help="drafter sees only the last W tokens (compact cache); absent = no window")
        s.add_argument("--speculative-num-steps", type=_positive, default=1, help="accepted for SGLang compatibility (DFLASH uses 1)")
        return
    choices = {"ddtree": ("DFLASH", "DDTREE", "NONE"), "pr29907": ("DFLASH", "DDTREE", "NONE"),
               "eagle3": ("EAGLE", "EAGLE3", "NEXTN", "NONE")}.get(dialect, ("DFLASH", "NONE"))
    s.add_argument("--speculative-algorithm", type=_algorithm(choices), default="NONE",
                   help=f"{', '.join(choices)} (default: no speculation, as SGLang)")
    s.add_argument("--speculative-num-draft-tokens", type=_positive, default=None, help="DFLASH: the block size (verify width)")
    s.add_argument("--speculative-dflash-block-size", type=_positive, default=None, help="DFLASH: alias of --speculative-num-draft-tokens; must match it")
    s.add_argument("--speculative-eagle-topk", type=_positive, default=None, help="forced to 1 under DFLASH (a warning)")
    s.add_argument("--speculative-num-steps", type=_positive, default=None, help="forced to 1 under DFLASH (a warning)")
    if dialect == "subsir":
        # The fork predates the May 2026 rename: only the older flag exists there.
        s.add_argument("--speculative-dflash-draft-window-size", dest="speculative_dflash_draft_window_size", type=_positive,
                       default=None, help="drafter window (compact cache); absent = no window")
    else:
        s.add_argument("--speculative-draft-window-size", dest="speculative_draft_window_size", type=_positive,
                       default=None, help="drafter window (compact cache); absent = no window")
    if dialect == "pr31069":
        s.add_argument("--speculative-dflash-tree-verify", action="store_true",
                       help="DFLASH: verify a top-k draft tree instead of the chain (default off)")
    if dialect == "pr29907":
        s.add_argument("--speculative-ddtree-budget", type=int, default=None,
                       help="DDTREE: non-root tree nodes B, verify width B + 1")
    if dialect == "pr36196":
        s.add_argument("--speculative-dflash-tree-width", type=_positive, default=None,
                       help="DFLASH: candidates kept per draft depth (1: the chain)")
    if dialect == "pr32053":
        s.add_argument("--speculative-dflash-verify-budget", type=_positive, default=None,
                       help="DFLASH: tokens of the block the target verifies (1..block size)")
    if dialect == "ddtree":
        s.add_argument("--speculative-ddtree-block-size", type=_positive, default=None,
                       help="DDTREE: draft block size; wins over --speculative-num-draft-tokens (a warning)")
        s.add_argument("--speculative-ddtree-budget", type=int, default=None,
                       help="DDTREE: non-root tree nodes B, verify width B + 1 (default block_size - 1)")


def resolve(dialect: str, ns: argparse.Namespace, env: Mapping[str, str], *, drafter_block_size: int,
            tp_size: int = 1) -> Resolved:
    """The configuration the dialect's build runs; DialectError where it refuses to start."""
    if dialect == "reference":
        return _reference(ns)
    if ns.speculative_algorithm == "NONE":
        return Resolved("NONE", drafter_block_size, drafter_block_size - 1, 1, None, {"speculative_algorithm": None})
    if dialect == "upstream":
        return _upstream_dflash(ns, drafter_block_size)
    if dialect == "ddtree":
        if ns.speculative_algorithm != "DDTREE":
            return _upstream_dflash(ns, drafter_block_size)
        return _ddtree(ns, drafter_block_size)
    if dialect == "subsir":
        return _subsir(ns, env, drafter_block_size, tp_size)
    if dialect == "subsir-flags":
        if not _env_int(env, "SGLANG_DFLASH_TREE_VERIFY", 0):
            return _upstream_dflash(ns, drafter_block_size)
        return _dflash_tree_from_flags(ns, drafter_block_size, topk_choices=None)
    if dialect == "eagle3":
        return _eagle_family(ns)
    if dialect == "pr29907":
        return _ddtree_pr29907(ns, env, drafter_block_size) if ns.speculative_algorithm == "DDTREE" else _upstream_dflash(ns, drafter_block_size)
    if dialect == "pr36196":
        return _dflash_tree_width(ns, env, drafter_block_size)
    if dialect == "pr32053":
        return _dflash_verify_budget(ns, drafter_block_size)
    if dialect == "pr31069":
        if not ns.speculative_dflash_tree_verify:
            return _upstream_dflash(ns, drafter_block_size)
        return _dflash_tree_from_flags(ns, drafter_block_size, topk_choices=(4, 8, 16))
    raise DialectError(f"unknown dialect {dialect!r} (choose from {', '.join(DIALECTS)})")


def reference_algorithm(ns: argparse.Namespace) -> str:
    """The reference dialect's algorithm: the flag's, else DFLASH when one of its config flags is
    given (the engine's profiles before the plain launch was spelled as SGLang's: config flags and
    no --speculative-algorithm), else NONE: a launch without speculative flags serves plainly, as
    SGLang's (its speculative_algorithm is None unless the flag names one)."""
    if ns.speculative_algorithm is not None:
        return str(ns.speculative_algorithm)
    given = any(getattr(ns, key) is not None for key in (*REFERENCE_DEFAULTS, "speculative_draft_window_size"))
    return "DFLASH" if given else "NONE"


def _reference(ns: argparse.Namespace) -> Resolved:
    algorithm = reference_algorithm(ns)
    speculative = algorithm != "NONE"
    window = ns.speculative_draft_window_size
    block, budget, topk = (REFERENCE_DEFAULTS[key] if getattr(ns, key) is None else int(getattr(ns, key)) for key in REFERENCE_DEFAULTS)
    return Resolved(
        algorithm, block, budget, topk, window,
        {
            "speculative_algorithm": algorithm if speculative else None,
            "speculative_dflash_block_size": block if speculative else None,
            "speculative_num_draft_tokens": budget if speculative else None,
            "speculative_eagle_topk": topk if speculative else None,
            "speculative_num_steps": 1 if speculative else None,
            "speculative_draft_window_size": window if speculative else None,
            "speculative_dflash_draft_window_size": window if speculative else None,
        },
    )


def _handle_dflash(args: dict[str, Any], drafter_block_size: int, window_key: str, warnings: list[str],
                   check_window: bool = True) -> int:
    """sgl-project/sglang python/sglang/srt/arg_groups/speculative_hook.py ``_handle_dflash``:
    num_steps and topk forced to 1 with a warning; --speculative-dflash-block-size must match
    --speculative-num-draft-tokens (ValueError) and becomes it; absent both, the drafter's
    config gives the block size; the window must be >= the block size (ValueError)."""
    steps = args.get("speculative_num_steps")
    if steps is not None and steps != 1:
        warnings.append(f"DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps={steps} to 1.")
    args["speculative_num_steps"] = 1
    topk = args.get("speculative_eagle_topk")
    if topk is not None and topk != 1:
        warnings.append(f"DFLASH only supports speculative_eagle_topk == 1; overriding speculative_eagle_topk={topk} to 1.")
    args["speculative_eagle_topk"] = 1
    block = args.get("speculative_dflash_block_size")
    draft_tokens = args.get("speculative_num_draft_tokens")
    if block is not None:
        if draft_tokens is not None and draft_tokens != block:
            raise DialectError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                "but they differ. For DFLASH they must match. "
                f"speculative_num_draft_tokens={draft_tokens}, speculative_dflash_block_size={block}."
            )
        args["speculative_num_draft_tokens"] = block
    if args.get("speculative_num_draft_tokens") is None:
        args["speculative_num_draft_tokens"] = drafter_block_size  # parse_dflash_draft_config(...).resolve_block_size
    draft_tokens = int(args["speculative_num_draft_tokens"])
    window = args.get(window_key)
    if check_window and window is not None and window < draft_tokens:
        raise DialectError(
            "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). "
            f"window_size={window}, block_size={draft_tokens}."
        )
    return draft_tokens


def _upstream_dflash(ns: argparse.Namespace, drafter_block_size: int) -> Resolved:
    """Upstream DFLASH verifies a chain: the root plus block_size - 1 drafted tokens, i.e. a DDTree
    budget of block_size - 1 non-root nodes with one candidate per depth."""
    args = _spec_args(ns)
    warnings: list[str] = []
    block = _handle_dflash(args, drafter_block_size, "speculative_draft_window_size", warnings)
    return Resolved("DFLASH", block, block - 1, 1, args["speculative_draft_window_size"], args, tuple(warnings))


def _ddtree(ns: argparse.Namespace, drafter_block_size: int) -> Resolved:
    """Rancy-Wang/sglang (branch ddtree-v2 at 433c58ed7, PR 27509) python/sglang/srt/arg_groups/speculative_hook.py:268-332
    ``_handle_ddtree``: --speculative-ddtree-block-size wins over the other two block-size flags (a
    warning each), then ``_handle_dflash`` runs (topk forced to 1 in the server args), then the budget
    defaults to block_size - 1 and must be >= 1. The tree itself takes topk = min(budget, vocab)
    (python/sglang/srt/speculative/ddtree_worker_v2.py:437, ddtree_utils.py:184): no per-depth cap, so topk = budget here."""
    args = _spec_args(ns)
    args["speculative_ddtree_block_size"] = ns.speculative_ddtree_block_size
    args["speculative_ddtree_budget"] = ns.speculative_ddtree_budget
    warnings: list[str] = []
    ddtree_block = ns.speculative_ddtree_block_size
    if ddtree_block is not None:
        draft_tokens = args.get("speculative_num_draft_tokens")
        if draft_tokens is not None and draft_tokens != ddtree_block:
            warnings.append(f"DDTREE uses --speculative-ddtree-block-size={ddtree_block} instead of --speculative-num-draft-tokens={draft_tokens}.")
        dflash_block = args.get("speculative_dflash_block_size")
        if dflash_block is not None and dflash_block != ddtree_block:
            warnings.append(f"DDTREE ignores conflicting --speculative-dflash-block-size={dflash_block}; using --speculative-ddtree-block-size={ddtree_block}.")
        args["speculative_num_draft_tokens"] = ddtree_block
        args["speculative_dflash_block_size"] = None
    block = _handle_dflash(args, drafter_block_size, "speculative_draft_window_size", warnings)
    budget = args["speculative_ddtree_budget"]
    if budget is None:
        budget = block - 1
    if budget < 1:
        raise DialectError(f"--speculative-ddtree-budget must be >= 1, got {budget}.")
    args["speculative_ddtree_budget"] = budget
    args["speculative_algorithm"] = "DDTREE"
    return Resolved("DFLASH", block, budget, budget, args["speculative_draft_window_size"], args, tuple(warnings))


def _subsir(ns: argparse.Namespace, env: Mapping[str, str], drafter_block_size: int, tp_size: int) -> Resolved:
    """SubSir/sglang python/sglang/srt/speculative/dflash_worker.py (commit 0433712a5d69) ``DFlashWorker.__init__``:
    the block size is speculative_num_draft_tokens (upstream's DFLASH handling first); tree verify
    is SGLANG_DFLASH_TREE_VERIFY=1 and needs SGLANG_DFLASH_BLOCK_VERIFY=1 (its default) and
    tp_size 1 (else ValueError); SGLANG_DFLASH_TREE_VERIFY_TOPK (default 1) candidates per depth;
    SGLANG_DFLASH_TREE_VERIFY_NUM_TOKENS (default block_size) tree nodes including the root
    (dflash_utils.build_tree_verify_tokens), so the DDTree budget is NUM_TOKENS - 1. Without tree
    verify it is upstream's chain. The variables are not server args: /server_info cannot show them."""
    args = _spec_args(ns)
    args["speculative_dflash_draft_window_size"] = ns.speculative_dflash_draft_window_size
    warnings: list[str] = []
    block = _handle_dflash(args, drafter_block_size, "speculative_dflash_draft_window_size", warnings, check_window=False)

    tree = bool(_env_int(env, "SGLANG_DFLASH_TREE_VERIFY", 0))
    block_verify = bool(_env_int(env, "SGLANG_DFLASH_BLOCK_VERIFY", 1))
    topk = _env_int(env, "SGLANG_DFLASH_TREE_VERIFY_TOPK", 1)
    num_tokens = _env_int(env, "SGLANG_DFLASH_TREE_VERIFY_NUM_TOKENS", block)
    if tree and not block_verify:
        raise DialectError("Invalid DFlash config: SGLANG_DFLASH_TREE_VERIFY=1 requires block verify (set SGLANG_DFLASH_BLOCK_VERIFY=1).")
    if tree and tp_size > 1:
        raise DialectError(f"DFLASH tree-verify mode currently requires tp_size==1; disabling tree-verify for tp_size={tp_size}.")
    # The flag is accepted and echoed in /server_info, but this worker has no window code (its
    # DFlashWorker.__init__ never reads it): the drafter sees the whole context whatever it says.
    window = None
    warnings.append(f"DFLASH verify mode: block_verify={block_verify}, tree_verify={tree}")
    if not tree or block <= 1:
        return Resolved("DFLASH", block, block - 1, 1, window, args, tuple(warnings))
    if topk < 1 or num_tokens < 2:
        raise DialectError(f"DFLASH tree verify needs SGLANG_DFLASH_TREE_VERIFY_TOPK >= 1 and _NUM_TOKENS >= 2, got {topk} and {num_tokens}")
    return Resolved("DFLASH", block, num_tokens - 1, topk, window, args, tuple(warnings))


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise DialectError(f"invalid literal for int() with base 10: {text!r} (environment variable {name})") from None


def _dflash_tree_from_flags(ns: argparse.Namespace, drafter_block_size: int, topk_choices: tuple[int, ...] | None) -> Resolved:
    """DFLASH tree verify sized by server args: SubSir/sglang's v2 port (its DFLASH_TREE_FINDINGS.md,
    "Per-model server recipe (v2)": SGLANG_DFLASH_TREE_VERIFY=1, --speculative-eagle-topk 4,
    --speculative-num-draft-tokens <budget>, --speculative-dflash-block-size 16, which "decouple[s] draft
    block_size ... from the verify budget") and its upstreaming, PR 31069 (--speculative-dflash-tree-verify;
    the fused expand-top-k kernel takes topk 4, 8 or 16, and a stored version raises ValueError for
    others). The block size is --speculative-dflash-block-size (else the drafter's);
    --speculative-num-draft-tokens is the tree's node count WITH the root, as the fork's
    dflash_utils.py ``build_tree_verify_tokens`` documents it ("num_draft_tokens: Total number of
    tokens in the pruned tree (including root)", every stored version), so the DDTree budget is
    num_draft_tokens - 1 (default: the block size, i.e. the chain's block_size - 1 drafts); topk is
    --speculative-eagle-topk, not forced to 1 in tree mode. That the builds' workers pass the flag
    straight in, and how they report topk in /server_info, is not confirmed in their source."""
    args = _spec_args(ns)
    if args.get("speculative_num_steps") not in (None, 1):
        raise DialectError(f"DFLASH only supports speculative_num_steps == 1, got {args['speculative_num_steps']}.")
    args["speculative_num_steps"] = 1
    block = args.get("speculative_dflash_block_size") or drafter_block_size
    nodes = args.get("speculative_num_draft_tokens") or block  # the root included
    budget = nodes - 1
    topk = args.get("speculative_eagle_topk") or 1
    if block < 2 or nodes < 2:
        raise DialectError(f"DFLASH tree verify needs a block size >= 2 and --speculative-num-draft-tokens >= 2 "
                           f"(tree nodes, the root included), got {block} and {nodes}.")
    if topk_choices is not None and topk not in topk_choices:
        raise DialectError(f"DFLASH tree verify supports --speculative-eagle-topk in "
                           f"{{{', '.join(map(str, topk_choices))}}}, got {topk}.")
    window = args.get("speculative_draft_window_size")
    if window is not None and window < block:
        raise DialectError(
            "--speculative-draft-window-size must be >= the DFLASH block size. "
            f"window_size={window}, block_size={block}."
        )
    args.update(speculative_dflash_block_size=block, speculative_num_draft_tokens=nodes, speculative_eagle_topk=topk)
    if topk_choices is not None:
        args["speculative_dflash_tree_verify"] = True
    return Resolved("DFLASH", block, budget, topk, window, args,
                    (f"DFLASH tree verify: block_size={block}, num_draft_tokens={nodes}, topk={topk}",))


def _eagle_family(ns: argparse.Namespace) -> Resolved:
    """SGLang 0.5.23 (the PyPI wheel) sglang/srt/arg_groups/speculative_hook.py ``_handle_eagle_family``:
    with no --speculative-num-steps the three EAGLE knobs must all be unset and are chosen by
    ``_auto_choose_speculative_params`` (:1430-1462; (3, 1, 4) for an architecture it does not list),
    else given (:1159-1171); with topk 1, num_draft_tokens becomes num_steps + 1 with a warning
    (:1255-1266); NEXTN is an alias of EAGLE (``_resolve_speculative_algorithm_alias``, :109-116); trtllm_mha refuses topk > 1 (:1176-1180, not modelled: the engine has one attention path).
    EAGLE drafts ``num_steps`` tokens deep with ``topk`` candidates per step and verifies
    ``num_draft_tokens`` tree nodes, the root included: on the engine's DDTree that is depth
    num_steps (block size num_steps + 1), budget num_draft_tokens - 1 and that topk. The engine's
    block drafter stands in for the EAGLE head (its acceptance is not EAGLE's; the knobs' meaning is)."""
    args = _spec_args(ns)
    algorithm = "EAGLE" if ns.speculative_algorithm == "NEXTN" else ns.speculative_algorithm
    steps, topk, tokens = ns.speculative_num_steps, ns.speculative_eagle_topk, ns.speculative_num_draft_tokens
    warnings: list[str] = []
    if steps is None:
        if topk is not None or tokens is not None:
            raise DialectError("AssertionError: --speculative-eagle-topk and --speculative-num-draft-tokens need "
                               "--speculative-num-steps (without it all three are chosen automatically)")
        steps, topk, tokens = 3, 1, 4
    topk = 1 if topk is None else topk
    if tokens is None or (topk == 1 and tokens != steps + 1):
        if tokens is not None:
            warnings.append("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1")
        tokens = steps + 1
    if tokens < 2:
        raise DialectError(f"speculative_num_draft_tokens must be >= 2 (the root and one draft), got {tokens}")
    args.update(speculative_algorithm=algorithm, speculative_num_steps=steps, speculative_eagle_topk=topk,
                speculative_num_draft_tokens=tokens, speculative_dflash_block_size=None, speculative_draft_window_size=None)
    return Resolved("DFLASH", steps + 1, tokens - 1, topk, None, args, tuple(warnings))


def _ddtree_pr29907(ns: argparse.Namespace, env: Mapping[str, str], drafter_block_size: int) -> Resolved:
    """sgl-project/sglang PR 29907 (open, read through its description and review threads, not its
    final diff): DDTREE on the DFlashWorkerV2 draft path; ``--speculative-ddtree-budget`` B non-root
    nodes (target verify ``draft_token_num = ddtree_budget + 1``); ``page_size != 1`` is a ValueError
    and ``disable_overlap_schedule`` is forced on (arg_groups/speculative_hook.py, the review thread
    at :298); the tree's width is derived, ``min(max(B // L + 1, 2), V, SGLANG_DDTREE_MAX_TOPK)``
    (default 6; ddtree_utils.py, a stored version), L the drafted positions (block_size - 1 here:
    unverified), and B == L is the chain. The block size follows upstream's DFLASH handling
    (unverified for DDTREE); the budget's default block_size - 1 is PR 27509's (unverified)."""
    args = _spec_args(ns)
    warnings: list[str] = []
    block = _handle_dflash(args, drafter_block_size, "speculative_draft_window_size", warnings)
    if int(getattr(ns, "page_size", None) or 1) != 1:
        raise DialectError(f"DDTREE currently supports only page_size == 1. Got page_size={ns.page_size}.")
    budget = ns.speculative_ddtree_budget if ns.speculative_ddtree_budget is not None else block - 1
    if budget < 1:
        raise DialectError(f"--speculative-ddtree-budget must be >= 1, got {budget}.")
    depth = max(block - 1, 1)
    max_topk = _env_int(env, "SGLANG_DDTREE_MAX_TOPK", 6)
    topk = 1 if budget == depth else max(1, min(max(budget // depth + 1, 2), max_topk))
    args.update(speculative_algorithm="DDTREE", speculative_ddtree_budget=budget, disable_overlap_schedule=True)
    return Resolved("DFLASH", block, budget, topk, args["speculative_draft_window_size"], args, tuple(warnings))


def _dflash_tree_width(ns: argparse.Namespace, env: Mapping[str, str], drafter_block_size: int) -> Resolved:
    """sgl-project/sglang PR 36196 (open; a stored version of its hook, arg_groups/speculative_hook.py
    ``_resolve_dflash_tree_width``): under DFLASH ``--speculative-eagle-topk`` is a ValueError ("EAGLE-only
    ... Use --speculative-dflash-tree-width"), the width W defaults to 1 (the chain, exactly upstream's
    DFLASH) and must be >= 1; a tree keeps W candidates per depth of the block, 1 + (bs - 1)W nodes
    (the issue's reading of the stored hook: num_draft_tokens = 1 + (bs - 1)W, topk = W); a stored
    tree path rejects trtllm_mha; ``SGLANG_DFLASH_MAX_NUM_NODES`` caps the nodes (its exact meaning,
    root counted or not, unverified: here the cap includes the root)."""
    if ns.speculative_eagle_topk is not None:
        raise DialectError("--speculative-eagle-topk is EAGLE-only and has no meaning for DFLASH, which drafts a whole "
                           "block in parallel rather than expanding one token at a time. Use --speculative-dflash-tree-width "
                           f"to widen the DFLASH draft tree instead. Got --speculative-eagle-topk={ns.speculative_eagle_topk}.")
    width = ns.speculative_dflash_tree_width or 1
    if width > 1 and getattr(ns, "attention_backend", None) == "trtllm_mha":
        raise DialectError("--speculative-dflash-tree-width > 1 needs a backend that takes a tree mask; trtllm_mha "
                           "verifies a causal chain")
    args = _spec_args(ns)
    warnings: list[str] = []
    block = _handle_dflash(args, drafter_block_size, "speculative_draft_window_size", warnings)
    nodes = 1 + (block - 1) * width
    cap = _env_int(env, "SGLANG_DFLASH_MAX_NUM_NODES", nodes)
    nodes = max(2, min(nodes, cap))
    args.update(speculative_dflash_tree_width=width, speculative_eagle_topk=width, speculative_num_draft_tokens=nodes,
                speculative_dflash_block_size=block)
    return Resolved("DFLASH", block, nodes - 1, width, args["speculative_draft_window_size"], args, tuple(warnings))


def _dflash_verify_budget(ns: argparse.Namespace, drafter_block_size: int) -> Resolved:
    """sgl-project/sglang PR 32053 (open; its stored tests, ``_resolve_dflash_verify_budget``): the target
    verifies ``--speculative-dflash-verify-budget`` V tokens of the block, V in [1, num_draft_tokens]
    (else ValueError "... to be in ..."), independent of the draft width; absent, the whole block.
    Read here as a chain of V - 1 drafts after the root (whether V counts the root: unverified)."""
    args = _spec_args(ns)
    warnings: list[str] = []
    block = _handle_dflash(args, drafter_block_size, "speculative_draft_window_size", warnings)
    verify = ns.speculative_dflash_verify_budget or block
    if not 1 <= verify <= block:
        raise DialectError(f"--speculative-dflash-verify-budget expects the verify budget to be in [1, {block}], got {verify}.")
    args["speculative_dflash_verify_budget"] = ns.speculative_dflash_verify_budget
    return Resolved("DFLASH", block, max(verify - 1, 1), 1, args["speculative_draft_window_size"], args, tuple(warnings))


def _spec_args(ns: argparse.Namespace) -> dict[str, Any]:
    """The speculative server args as given (SGLang reports every server arg in /server_info)."""
    return {
        "speculative_algorithm": ns.speculative_algorithm,
        "speculative_num_draft_tokens": ns.speculative_num_draft_tokens,
        "speculative_dflash_block_size": ns.speculative_dflash_block_size,
        "speculative_eagle_topk": ns.speculative_eagle_topk,
        "speculative_num_steps": ns.speculative_num_steps,
        "speculative_draft_window_size": getattr(ns, "speculative_draft_window_size", None),
    }
