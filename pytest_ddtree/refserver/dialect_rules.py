"""The rules by which SGLang builds turn speculative flags and environment into the configuration
they run: the vocabulary a dialect of ``dialects.yaml`` is written in (refserver/dialects.py reads
the declaration and names a rule per case).

Why rules and not one function per build: builds differ mostly in their flags' names and in which
switch turns a tree on; what a switch then does (upstream's DFLASH handling, a DDTree budget, a
tree sized by flags or by environment variables, EAGLE's knobs) recurs across builds. Each rule
follows one build's own argument handling (cited per function), including its refusals
(:class:`DialectError`: exit 1 with the build's message, before the port opens) and its silent
overrides (a log warning, the value in effect in ``/server_info``). A rule returns a
:class:`Resolved`: the configuration the engine runs (DDTree budget = non-root nodes, topk =
candidates per depth) and the server-arg keys ``/server_info`` reports for it, named and valued as
that build reports them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(frozen=True)
class Launch:
    """What a rule reads: the parsed flags, the environment, the drafter's trained block size (the
    block size a DFLASH build takes from the drafter's config when no flag gives one) and the
    tensor-parallel size."""

    ns: argparse.Namespace
    env: Mapping[str, str]
    drafter_block_size: int
    tp_size: int = 1


#: A case's parameters of its rule (validated against :data:`RULES` where the declaration is read).
Params = Mapping[str, Any]

def reference_algorithm(ns: argparse.Namespace) -> str:
    """The reference dialect's algorithm: the flag's, else DFLASH when one of its config flags is
    given (the engine's profiles before the plain launch was spelled as SGLang's: config flags and
    no --speculative-algorithm), else NONE: a launch without speculative flags serves plainly, as
    SGLang's (its speculative_algorithm is None unless the flag names one)."""
    if ns.speculative_algorithm is not None:
        return str(ns.speculative_algorithm)
    given = any(getattr(ns, key) is not None for key in (*REFERENCE_DEFAULTS, "speculative_draft_window_size"))
    return "DFLASH" if given else "NONE"


def reference(launch: Launch, params: Params) -> Resolved:
    """The engine's own dialect: every config field has a flag (defaults :data:`REFERENCE_DEFAULTS`)."""
    ns = launch.ns
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


def plain(launch: Launch, params: Params) -> Resolved:
    """No speculation: SGLang's speculative_algorithm is None."""
    block = launch.drafter_block_size
    return Resolved("NONE", block, block - 1, 1, None, {"speculative_algorithm": None})


def dflash_chain(launch: Launch, params: Params) -> Resolved:
    """Upstream DFLASH verifies a chain: the root plus block_size - 1 drafted tokens, i.e. a DDTree
    budget of block_size - 1 non-root nodes with one candidate per depth."""
    ns, drafter_block_size = launch.ns, launch.drafter_block_size
    args = _spec_args(ns)
    warnings: list[str] = []
    block = _handle_dflash(args, drafter_block_size, "speculative_draft_window_size", warnings)
    return Resolved("DFLASH", block, block - 1, 1, args["speculative_draft_window_size"], args, tuple(warnings))


def ddtree_pr27509(launch: Launch, params: Params) -> Resolved:
    """Rancy-Wang/sglang (branch ddtree-v2 at 433c58ed7, PR 27509) python/sglang/srt/arg_groups/speculative_hook.py:268-332
    ``_handle_ddtree``: --speculative-ddtree-block-size wins over the other two block-size flags (a
    warning each), then ``_handle_dflash`` runs (topk forced to 1 in the server args), then the budget
    defaults to block_size - 1 and must be >= 1. The tree itself takes topk = min(budget, vocab)
    (python/sglang/srt/speculative/ddtree_worker_v2.py:437, ddtree_utils.py:184): no per-depth cap, so topk = budget here."""
    ns, drafter_block_size = launch.ns, launch.drafter_block_size
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


def subsir_env_tree(launch: Launch, params: Params) -> Resolved:
    """SubSir/sglang python/sglang/srt/speculative/dflash_worker.py (commit 0433712a5d69) ``DFlashWorker.__init__``:
    the block size is speculative_num_draft_tokens (upstream's DFLASH handling first); tree verify
    is SGLANG_DFLASH_TREE_VERIFY=1 and needs SGLANG_DFLASH_BLOCK_VERIFY=1 (its default) and
    tp_size 1 (else ValueError); SGLANG_DFLASH_TREE_VERIFY_TOPK (default 1) candidates per depth;
    SGLANG_DFLASH_TREE_VERIFY_NUM_TOKENS (default block_size) tree nodes including the root
    (dflash_utils.build_tree_verify_tokens), so the DDTree budget is NUM_TOKENS - 1. Without tree
    verify it is upstream's chain. The variables are not server args: /server_info cannot show them."""
    ns, env, drafter_block_size, tp_size = launch.ns, launch.env, launch.drafter_block_size, launch.tp_size
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


def dflash_tree_from_flags(launch: Launch, params: Params) -> Resolved:
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
    ns, drafter_block_size, topk_choices = launch.ns, launch.drafter_block_size, params.get("topk_choices")
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
    return Resolved("DFLASH", block, budget, topk, window, args,
                    (f"DFLASH tree verify: block_size={block}, num_draft_tokens={nodes}, topk={topk}",))


def eagle_family(launch: Launch, params: Params) -> Resolved:
    """SGLang 0.5.23 (the PyPI wheel) sglang/srt/arg_groups/speculative_hook.py ``_handle_eagle_family``:
    with no --speculative-num-steps the three EAGLE knobs must all be unset and are chosen by
    ``_auto_choose_speculative_params`` (:1430-1462; (3, 1, 4) for an architecture it does not list),
    else given (:1159-1171); with topk 1, num_draft_tokens becomes num_steps + 1 with a warning
    (:1255-1266); NEXTN is an alias of EAGLE (``_resolve_speculative_algorithm_alias``, :109-116); trtllm_mha refuses topk > 1 (:1176-1180, not modelled: the engine has one attention path).
    EAGLE drafts ``num_steps`` tokens deep with ``topk`` candidates per step and verifies
    ``num_draft_tokens`` tree nodes, the root included: on the engine's DDTree that is depth
    num_steps (block size num_steps + 1), budget num_draft_tokens - 1 and that topk. The engine's
    block drafter stands in for the EAGLE head (its acceptance is not EAGLE's; the knobs' meaning is)."""
    ns = launch.ns
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


def ddtree_derived_width(launch: Launch, params: Params) -> Resolved:
    """sgl-project/sglang PR 29907 (open, read through its description and review threads, not its
    final diff): DDTREE on the DFlashWorkerV2 draft path; ``--speculative-ddtree-budget`` B non-root
    nodes (target verify ``draft_token_num = ddtree_budget + 1``); ``page_size != 1`` is a ValueError
    and ``disable_overlap_schedule`` is forced on (arg_groups/speculative_hook.py, the review thread
    at :298); the tree's width is derived, ``min(max(B // L + 1, 2), V, SGLANG_DDTREE_MAX_TOPK)``
    (default 6; ddtree_utils.py, a stored version), L the drafted positions (block_size - 1 here:
    unverified), and B == L is the chain. The block size follows upstream's DFLASH handling
    (unverified for DDTREE); the budget's default block_size - 1 is PR 27509's (unverified)."""
    ns, env, drafter_block_size = launch.ns, launch.env, launch.drafter_block_size
    args = _spec_args(ns)
    warnings: list[str] = []
    block = _handle_dflash(args, drafter_block_size, "speculative_draft_window_size", warnings)
    if int(getattr(ns, "page_size", None) or 1) != 1:
        raise DialectError(f"DDTREE currently supports only page_size == 1. Got page_size={ns.page_size}.")
    budget = ns.speculative_ddtree_budget if ns.speculative_ddtree_budget is not None else block - 1
    if budget < 1:
        raise DialectError(f"--speculative-ddtree-budget must be >= 1, got {budget}.")
    depth = max(block - 1, 1)
    max_topk = _env_int(env, params["max_topk_env"], params["max_topk"]) if "max_topk_env" in params else params.get("max_topk", 6)
    topk = 1 if budget == depth else max(1, min(max(budget // depth + 1, 2), max_topk))
    args.update(speculative_algorithm="DDTREE", speculative_ddtree_budget=budget, disable_overlap_schedule=True)
    return Resolved("DFLASH", block, budget, topk, args["speculative_draft_window_size"], args, tuple(warnings))


def dflash_tree_width(launch: Launch, params: Params) -> Resolved:
    """sgl-project/sglang PR 36196 (open; a stored version of its hook, arg_groups/speculative_hook.py
    ``_resolve_dflash_tree_width``): under DFLASH ``--speculative-eagle-topk`` is a ValueError ("EAGLE-only
    ... Use --speculative-dflash-tree-width"), the width W defaults to 1 (the chain, exactly upstream's
    DFLASH) and must be >= 1; a tree keeps W candidates per depth of the block, 1 + (bs - 1)W nodes
    (the issue's reading of the stored hook: num_draft_tokens = 1 + (bs - 1)W, topk = W); a stored
    tree path rejects trtllm_mha; ``SGLANG_DFLASH_MAX_NUM_NODES`` caps the nodes (its exact meaning,
    root counted or not, unverified: here the cap includes the root)."""
    ns, env, drafter_block_size = launch.ns, launch.env, launch.drafter_block_size
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
    cap = _env_int(env, params["max_nodes_env"], nodes) if "max_nodes_env" in params else nodes
    nodes = max(2, min(nodes, cap))
    args.update(speculative_dflash_tree_width=width, speculative_eagle_topk=width, speculative_num_draft_tokens=nodes,
                speculative_dflash_block_size=block)
    return Resolved("DFLASH", block, nodes - 1, width, args["speculative_draft_window_size"], args, tuple(warnings))


def dflash_verify_budget(launch: Launch, params: Params) -> Resolved:
    """sgl-project/sglang PR 32053 (open; its stored tests, ``_resolve_dflash_verify_budget``): the target
    verifies ``--speculative-dflash-verify-budget`` V tokens of the block, V in [1, num_draft_tokens]
    (else ValueError "... to be in ..."), independent of the draft width; absent, the whole block.
    Read here as a chain of V - 1 drafts after the root (whether V counts the root: unverified)."""
    ns, drafter_block_size = launch.ns, launch.drafter_block_size
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


@dataclass(frozen=True)
class Rule:
    """A rule and the parameters a case may give it (name -> what it takes, for the declaration's
    validation and its error messages)."""

    run: Callable[[Launch, Params], Resolved]
    params: Mapping[str, str]
    doc: str


#: The rules a dialect's ``resolve:`` cases name, by the name they are written with.
RULES: dict[str, Rule] = {
    "reference": Rule(reference, {}, "the engine's own flags: every config field has one"),
    "plain": Rule(plain, {}, "no speculation"),
    "dflash-chain": Rule(dflash_chain, {}, "upstream DFLASH: a chain of block_size - 1 drafts, topk forced to 1"),
    "ddtree-pr27509": Rule(ddtree_pr27509, {}, "PR 27509's DDTREE: --speculative-ddtree-block-size and -budget, topk = budget"),
    "subsir-env-tree": Rule(subsir_env_tree, {}, "the SubSir fork's v1 worker: a tree sized by SGLANG_DFLASH_TREE_VERIFY* variables"),
    "dflash-tree-from-flags": Rule(dflash_tree_from_flags, {"topk_choices": "a list of the topk values the build takes"},
                                   "a DFLASH tree sized by flags: --speculative-num-draft-tokens counts the root, "
                                   "topk from --speculative-eagle-topk"),
    "eagle-family": Rule(eagle_family, {}, "SGLang's EAGLE / EAGLE3 / NEXTN knobs"),
    "ddtree-derived-width": Rule(ddtree_derived_width, {"max_topk_env": "the environment variable that caps the width",
                                                        "max_topk": "the cap's default (an int)"},
                                 "PR 29907's DDTREE: --speculative-ddtree-budget, the width derived and capped"),
    "dflash-tree-width": Rule(dflash_tree_width, {"max_nodes_env": "the environment variable that caps the tree's nodes"},
                              "PR 36196's DFLASH tree: --speculative-dflash-tree-width"),
    "dflash-verify-budget": Rule(dflash_verify_budget, {}, "PR 32053's --speculative-dflash-verify-budget: verify V tokens of the block"),
}
