"""Write the safetensors of a model folder from its recipe, in the real-SGLang venv (it has torch).

The tests' own venv has no torch, so tests/sglang_lane.py decides every weight (which tensor,
its shape, what it holds) and writes that as ``recipe.json`` beside the model's ``config.json``;
this script only carries the recipe out: ``python write_weights.py FOLDER...``. A tensor's recipe:
``shape``; ``base`` ("zeros", "normal" times ``scale``, or a number everywhere); ``column``
[index, value] sets that index of the last dimension everywhere; ``entries`` [[i, (j,) value], ...]
sets single elements. Everything is written as bfloat16 to ``model.safetensors``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def tensor(recipe: dict[str, Any], generator: torch.Generator) -> torch.Tensor:
    shape = [int(n) for n in recipe["shape"]]
    base = recipe.get("base", "zeros")
    if base == "zeros":
        value = torch.zeros(shape, dtype=torch.float32)
    elif base == "normal":
        value = torch.randn(shape, generator=generator, dtype=torch.float32) * float(recipe.get("scale", 1.0))
    else:
        value = torch.full(shape, float(base), dtype=torch.float32)
    if "column" in recipe:
        index, number = recipe["column"]
        value[..., int(index)] = float(number)
    for *where, number in recipe.get("entries", []):
        value[tuple(int(i) for i in where)] = float(number)
    return value.to(torch.bfloat16).contiguous()


def write(folder: Path) -> None:
    recipe = json.loads((folder / "recipe.json").read_text(encoding="utf-8"))
    generator = torch.Generator().manual_seed(int(recipe.get("seed", 0)))
    tensors = {name: tensor(spec, generator) for name, spec in sorted(recipe["tensors"].items())}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    for argument in sys.argv[1:]:
        write(Path(argument))
