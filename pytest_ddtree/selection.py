"""Which configs a session runs on the profile's build: the build's own matrix, its default, and
what ``--ddtree-config`` selects within them, with every matrix config left out and why.

Why a module of its own: configs.yaml's matrix is written once for the whole project, but each
SGLang build expresses a different part of it (upstream DFLASH is a chain: topk is always 1 and the
budget is block_size - 1; PR 27509 takes topk = budget; PR 31069 accepts topk 4, 8 or 16 only). A
selection that ignored the build would either refuse to run at all on those builds or record one
launch under names it never ran. The rule, also in docs/profiles.md:

- The build's matrix is the profile's ``matrix:`` when it has one; otherwise the *projection* of
  configs.yaml's matrix: each config with its fixed fields set to what the build uses
  (``bs8_b8_k4`` -> ``bs8_b7_k1`` on upstream DFLASH), configs whose values the build does not accept
  dropped, and one config per distinct launch (the first in matrix order; a window flag the build
  ignores therefore gives no ``_wnone`` twins).
- The build's default is the profile's ``default:``, else configs.yaml's default projected, else
  the first config of the build's matrix. With no ``--ddtree-config``, configs.yaml's default is
  listed as left out only where the build's default stands in for it (not under a profile's own
  ``default:``, such as ``--ddtree-url``'s running config: the user asked for no other).
- ``all`` is the build's matrix; a glob matches names of the build's matrix (and of configs.yaml's,
  to report what it left out); a glob that selects nothing the build can run is a usage error.
- A name given explicitly must be listed: in the build's matrix or in configs.yaml's (a typo such
  as ``bs8_b8_k5`` would otherwise launch a config nobody meant, find no baseline and pass as
  ``missing``). It is a usage error naming the closest listed names, unless the user asks for an
  unlisted config on purpose with ``--ddtree-allow-unlisted`` (a one-off probe).
- A listed name is taken as written: a build that cannot run it refuses it with the field and the
  values it accepts (``ServiceProfile.check_selection``).

Every configs.yaml config not in the build's matrix under its own name is listed, with the field and
the reason, in the session's header, summary and results.json.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Sequence

from pytest_ddtree.configs import ConfigError, DDTreeConfig, parse_config_name
from pytest_ddtree.measure.matrix import Matrix
from pytest_ddtree.service.plain import is_plain
from pytest_ddtree.service.profile import ServiceProfile
from pytest_ddtree.suggest import did_you_mean


@dataclass(frozen=True)
class LeftOut:
    """A configs.yaml config the build does not run under its name, and why."""

    config: str
    fields: tuple[str, ...]
    reason: str
    runs_as: str | None = None  # the build's config that stands for it, where one does

    def line(self) -> str:
        tail = f" (this build runs {self.runs_as} instead)" if self.runs_as else ""
        return f"{self.config}: {self.reason}{tail}"

    def as_dict(self) -> dict[str, Any]:
        return {"config": self.config, "fields": list(self.fields), "reason": self.reason, "runs_as": self.runs_as}


@dataclass(frozen=True)
class BuildMatrix:
    """The part of the sweep one build expresses."""

    configs: tuple[DDTreeConfig, ...]
    default: DDTreeConfig
    left_out: tuple[LeftOut, ...]
    origin: str  # where the configs come from, for the header

    def names(self) -> list[str]:
        return [c.name for c in self.configs]


@dataclass(frozen=True)
class Selection:
    """The configs a session runs, and the matrix configs its selection left out."""

    configs: tuple[DDTreeConfig, ...]
    left_out: tuple[LeftOut, ...]
    build: BuildMatrix

    def summary_lines(self) -> list[str]:
        return [lo.line() for lo in self.left_out]

    def as_dict(self) -> dict[str, Any]:
        return {
            "configs": [c.name for c in self.configs],
            "build_matrix": self.build.names(),
            "build_default": self.build.default.name,
            "build_matrix_origin": self.build.origin,
            "left_out": [lo.as_dict() for lo in self.left_out],
        }


def _same_launch(profile: ServiceProfile, config: DDTreeConfig, kept: DDTreeConfig) -> LeftOut:
    a, b = config.field_values(profile.default_window), kept.field_values(profile.default_window)
    fields = tuple(f for f in a if a[f] != b[f]) or ("window",)
    how = profile.how_fields_reach_the_service()
    reasons = []
    for name in fields:
        because = profile.fixed_because.get(name)
        reasons.append(f"{name}: {because}" if because else f"{name}: {how[name].split(';')[0]}")
    return LeftOut(config.name, fields, f"same launch as {kept.name} on this build ({'; '.join(reasons)})", kept.name)


def build_matrix(profile: ServiceProfile, matrix: Matrix) -> BuildMatrix:
    """The build's matrix and default (see the module docstring for the rule)."""
    launches: dict[Any, DDTreeConfig] = {}
    configs: list[DDTreeConfig] = []
    left_out: list[LeftOut] = []

    def keep(config: DDTreeConfig) -> DDTreeConfig | None:
        """Add ``config`` unless its launch is there already; the config that runs it."""
        identity = profile.launch_identity(config)
        if identity in launches:
            return launches[identity]
        launches[identity] = config
        configs.append(config)
        return None

    if profile.own_matrix is not None:
        origin = f"the profile's matrix ({profile.source or profile.name})"
        for config in profile.own_matrix:
            problems = profile.why_not(config)
            if problems:
                raise ConfigError(f"{profile.source or profile.name}: matrix: {config.name} asks "
                                  + "; ".join(reason for _, reason in problems))
            if keep(config) is not None:
                raise ConfigError(f"{profile.source or profile.name}: matrix: {config.name} runs the same launch as "
                                  f"{launches[profile.launch_identity(config)].name}; list one of them")
        for config in matrix.configs:
            if config in configs:
                continue
            problems = profile.why_not(config)
            if problems:
                left_out.append(LeftOut(config.name, tuple(f for f, _ in problems), "; ".join(r for _, r in problems)))
            else:
                left_out.append(LeftOut(config.name, (), "not in the profile's matrix"))
    else:
        origin = f"{matrix.path.name}'s matrix as this build runs it"
        for config in matrix.configs:
            problems = profile.why_not(config)
            projected = profile.projection(config) if problems else config
            if projected is None:
                left_out.append(LeftOut(config.name, tuple(f for f, _ in problems), "; ".join(r for _, r in problems)))
                continue
            if projected in configs:  # its projection is already in (another config's or its own)
                if problems:
                    left_out.append(LeftOut(config.name, tuple(f for f, _ in problems),
                                            "; ".join(r for _, r in problems), projected.name))
                continue
            runs = keep(projected)
            if runs is not None:
                left_out.append(_same_launch(profile, config, runs) if not problems else
                                LeftOut(config.name, tuple(f for f, _ in problems), "; ".join(r for _, r in problems), runs.name))
            elif problems:
                left_out.append(LeftOut(config.name, tuple(f for f, _ in problems),
                                        "; ".join(r for _, r in problems), projected.name))
    if not configs:
        raise ConfigError(
            f"service profile {profile.source or profile.name} can run none of {matrix.path}'s configs:\n  - "
            + "\n  - ".join(lo.line() for lo in left_out)
            + "\ngive the build its own sweep with 'matrix:' (and 'default:') in the profile")
    default = _default(profile, matrix, configs, launches)
    return BuildMatrix(tuple(configs), default, tuple(left_out), origin)


def _default(profile: ServiceProfile, matrix: Matrix, configs: list[DDTreeConfig], launches: dict[Any, DDTreeConfig]) -> DDTreeConfig:
    if profile.own_default is not None:
        problems = profile.why_not(profile.own_default)
        if problems:
            raise ConfigError(f"{profile.source or profile.name}: default: {profile.own_default.name} asks "
                              + "; ".join(reason for _, reason in problems))
        return profile.own_default
    candidate = matrix.default if not profile.why_not(matrix.default) else profile.projection(matrix.default)
    if candidate is not None:
        return launches.get(profile.launch_identity(candidate), candidate)
    return configs[0]


def select(requested: Sequence[str] | None, matrix: Matrix, profile: ServiceProfile, allow_unlisted: bool = False) -> Selection:
    """Resolve ``--ddtree-config`` within the build's matrix (module docstring); ConfigError on a
    malformed or unlisted name or a pattern that selects nothing the build can run."""
    build = build_matrix(profile, matrix)
    if not requested:
        # configs.yaml's default is said to be left out only where the build's default stands in for it;
        # a profile that names its own default (--ddtree-url: the running config) ran what it names, and
        # a user who named no config asked for nothing else
        left = [lo for lo in build.left_out if lo.config == matrix.default.name] if profile.own_default is None else []
        return Selection((build.default,), tuple(left), build)
    tokens = [t.strip() for value in requested for t in value.split(",") if t.strip()]
    if not tokens:
        raise ConfigError("--ddtree-config was given but empty; " + _hint(build))
    selected: list[DDTreeConfig] = []
    left_out: list[LeftOut] = []

    def add(configs: Sequence[DDTreeConfig], left: Sequence[LeftOut] = ()) -> None:
        selected.extend(c for c in configs if c not in selected)
        left_out.extend(lo for lo in left if lo not in left_out)

    for token in tokens:
        if token == "all":
            add(build.configs, build.left_out)
        elif any(ch in token for ch in "*?["):
            runs = [c for c in build.configs if fnmatch.fnmatchcase(c.name, token)]
            left = [lo for lo in build.left_out if fnmatch.fnmatchcase(lo.config, token)]
            if not runs:
                if left:
                    raise ConfigError(
                        f"--ddtree-config pattern {token!r} selects no config this build can run:\n  - "
                        + "\n  - ".join(lo.line() for lo in left) + "\n" + _hint(build))
                raise ConfigError(f"--ddtree-config pattern {token!r} matches no config of {matrix.path}; " + _hint(build))
            add(runs, left)
        else:
            try:
                config = parse_config_name(token)
            except ConfigError as exc:
                raise ConfigError(f"--ddtree-config: {exc}; " + did_you_mean(token, _listed(build, matrix)) + _hint(build)) from None
            if is_plain(config) and config.name not in _listed(build, matrix):
                raise ConfigError(f"--ddtree-config: {config.name} is a plain server's row, which this profile does not "
                                  "launch: start the server without its speculative flags and measure it with --ddtree-url "
                                  "URL --ddtree-measure-only")
            if not allow_unlisted and config.name not in _listed(build, matrix):
                raise ConfigError(
                    f"--ddtree-config: {config.name} is not in the matrix ({matrix.path}, or the profile's matrix:); "
                    + did_you_mean(config.name, _listed(build, matrix))
                    + "to run it on purpose add --ddtree-allow-unlisted, or list it in the matrix; " + _hint(build))
            add([config])
    return Selection(tuple(selected), tuple(left_out), build)


def _listed(build: BuildMatrix, matrix: Matrix) -> list[str]:
    """Every name the matrices list: the build's first (its order ranks the suggestions), then
    configs.yaml's (a listed config the build cannot run is refused with its reason, not as a typo)."""
    return [*build.names(), build.default.name, *matrix.names(), matrix.default.name]


def _hint(build: BuildMatrix) -> str:
    return "valid names: all, " + ", ".join(build.names()) + f" (this build's configs: {build.origin})"


def in_selection_order(configs: Sequence[DDTreeConfig | None], selected: Sequence[DDTreeConfig]) -> list[int]:
    """The order in which to run collected tests, given each one's config (None: a test without one):
    those without a config first, then each selected config's tests together, in the selection's
    order (stable inside a config), so each config is started once per process."""
    rank = {config.name: index for index, config in enumerate(selected)}

    def key(index: int) -> int:
        config = configs[index]
        return -1 if config is None else rank.get(config.name, len(rank))

    return sorted(range(len(configs)), key=key)
