"""Workload variants of the Alibaba trace, built from the default pod list by the published recipe.

The trace ships eight variants beside `default`; the FGD paper evaluated more (more fractional
pods, more pods that name a GPU model, more multi-GPU pods). This module rebuilds that family
from `default`, purely and with a seeded generator, so any share can be replayed. The recipe was
read off the shipped files (docs/notes/issue-18.md, "Placement on trace variants", has the
comparison):

- `gpushareX`: fractional pods (one GPU, less than 1000 milli) request X% of the trace's GPU
  milli. CPU-only pods stay as they are; the GPU pods keep their number and positions and are
  redrawn: n_f from the default's fractional pods and the rest from its other GPU pods, each
  with replacement only where the draw is larger than the pool (as the shipped `gpushare40`
  does: every row of it is a row of `default`), n_f chosen so that the expected share is X.
- `gpuspecX`: X% of the GPU pods, picked uniformly, name acceptable GPU models. The model list
  depends on the kind of pod (in the shipped files only whole-GPU pods ask for G2 or G3 and
  fractional ones for P100), so it is drawn from the lists the shipped `gpuspec` files give
  pods with the same GPU count and fractional-or-not (`SpecTable`).
- `multigpuX`: every default pod is kept and pods drawn with replacement from the default's
  multi-GPU pods are appended until multi-GPU pods request X% of the GPU milli.

A name joins recipes with `+` (`gen-gpushare60+gpuspec20`); they apply in the order gpushare,
multigpu, gpuspec, whatever the order written. Built variants are named `gen-...`, so a table
never confuses one with a shipped file; a name the trace does not ship (`gpushare60`) means the
built one. `materialize` writes a built variant as a pod CSV (the replay engine and its worker
processes read files), always the same bytes for the same name and seed.

    python -m alnair.scheduler.simulator.variants build gen-gpushare60 [--out DIR] [--seed N]
    python -m alnair.scheduler.simulator.variants compare gpushare40 [--seed N]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from alnair.common.errors import AlnairError, InvalidValueError
from alnair.common.resources import MILLI_PER_GPU
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.simulator.trace import VARIANTS, load_pods, pods_file

BUILT_PREFIX = "gen-"
DEFAULT_BUILD_SEED = 2023
"""The generator seed a variant is built with unless told otherwise (one fixed file per name,
as the shipped variants are one file replayed under every replay seed)."""

SPEC_SOURCES = ("gpuspec10", "gpuspec25")
"""Shipped files whose `gpu_spec` lists the spec table is drawn from."""

DEFAULT_FOLDER = Path("out") / "variants"

_PART = re.compile(r"^(gpushare|gpuspec|multigpu)(\d{1,3})$")

PodKind = tuple[int, bool]
"""(GPU count, fractional): what the GPU models a pod may name depend on."""


@dataclass(frozen=True)
class Recipe:
    """Target shares (0-1) of one variant; None leaves that aspect as in `default`."""

    gpushare: float | None = None
    gpuspec: float | None = None
    multigpu: float | None = None

    @property
    def name(self) -> str:
        parts = [
            f"{field}{round(100 * value)}"
            for field, value in (
                ("gpushare", self.gpushare),
                ("multigpu", self.multigpu),
                ("gpuspec", self.gpuspec),
            )
            if value is not None
        ]
        return BUILT_PREFIX + ("+".join(parts) or "default")


def parse_recipe(name: str) -> Recipe:
    """`gen-gpushare60+gpuspec20` (or without `gen-`) -> its recipe."""
    body = name.removeprefix(BUILT_PREFIX)
    shares: dict[str, float] = {}
    for part in body.split("+"):
        match = _PART.match(part)
        if match is None:
            raise InvalidValueError(
                "variant",
                name,
                f"{part!r} is not gpushareN, gpuspecN or multigpuN (N a percent); "
                "join several with '+'",
            )
        field, percent = match.group(1), int(match.group(2))
        if field in shares:
            raise InvalidValueError("variant", name, f"{field} given twice")
        if field == "multigpu" and not 0 < percent < 100:
            raise InvalidValueError("variant", name, "multigpuN needs 0 < N < 100")
        if not 0 <= percent <= 100:
            raise InvalidValueError("variant", name, f"{part}: N must be a percent 0-100")
        shares[field] = percent / 100.0
    return Recipe(**shares)


def is_built(name: str) -> bool:
    """Whether `name` is a variant this module builds (not one of the shipped files)."""
    return name.startswith(BUILT_PREFIX) or name not in VARIANTS


def canonical(name: str) -> str:
    """The name a variant is reported under: shipped names as they are, built ones `gen-...`."""
    return name if not is_built(name) else parse_recipe(name).name


def _kind(pod: PodRequest) -> PodKind:
    return (pod.num_gpu, pod.is_fractional)


@dataclass(frozen=True)
class SpecTable:
    """For each kind of GPU pod, the GPU model lists pods of that kind name, with counts."""

    by_kind: dict[PodKind, tuple[tuple[frozenset[str], ...], tuple[int, ...]]]

    @classmethod
    def from_pods(cls, pods: Sequence[PodRequest]) -> SpecTable:
        counts: dict[PodKind, Counter[frozenset[str]]] = {}
        for pod in pods:
            if pod.num_gpu and pod.gpu_models:
                counts.setdefault(_kind(pod), Counter())[pod.gpu_models] += 1
        if not counts:
            raise InvalidValueError("gpu_spec", 0, "the spec source has no pod naming a GPU model")
        table = {
            kind: (
                tuple(spec for spec, _ in sorted(c.items(), key=_spec_order)),
                tuple(n for _, n in sorted(c.items(), key=_spec_order)),
            )
            for kind, c in counts.items()
        }
        return cls(table)

    @classmethod
    def shipped(cls) -> SpecTable:
        pods: list[PodRequest] = []
        for variant in SPEC_SOURCES:
            pods.extend(load_pods(pods_file(variant)))
        return cls.from_pods(pods)

    def draw(self, pod: PodRequest, rng: np.random.Generator) -> frozenset[str]:
        """A model list for `pod`: from its own kind, else from the nearest GPU count of its
        fractional-or-not class (a kind the source never gave a spec to)."""
        options = self.by_kind.get(_kind(pod))
        if options is None:
            same = [k for k in self.by_kind if k[1] == pod.is_fractional] or list(self.by_kind)
            nearest = min(same, key=lambda k: (abs(k[0] - pod.num_gpu), k[0]))
            options = self.by_kind[nearest]
        specs, weights = options
        p = np.array(weights, dtype=np.float64)
        return specs[int(rng.choice(len(specs), p=p / p.sum()))]


def _spec_order(item: tuple[frozenset[str], int]) -> tuple[int, list[str]]:
    return (-item[1], sorted(item[0]))


def _draw(pool: Sequence[PodRequest], count: int, rng: np.random.Generator) -> list[PodRequest]:
    if count and not pool:
        raise InvalidValueError("pods", 0, "the recipe needs pods of a kind the trace lacks")
    if not count:
        return []
    picked = rng.choice(len(pool), size=count, replace=count > len(pool))
    return [pool[int(i)] for i in picked]


def _milli(pod: PodRequest) -> int:
    return pod.total_milli_gpu


def apply_gpushare(
    pods: Sequence[PodRequest], share: float, rng: np.random.Generator
) -> list[PodRequest]:
    """Redraw the GPU pods so fractional pods request `share` of the GPU milli (expected)."""
    gpu_at = [i for i, p in enumerate(pods) if p.num_gpu]
    fractional = [pods[i] for i in gpu_at if pods[i].is_fractional]
    whole = [pods[i] for i in gpu_at if not pods[i].is_fractional]
    if not fractional:
        raise InvalidValueError("pods", 0, "gpushare needs fractional pods in the trace")
    m_f = float(np.mean([_milli(p) for p in fractional]))
    m_w = float(np.mean([_milli(p) for p in whole])) if whole else float(MILLI_PER_GPU)
    n = len(gpu_at)
    # share = n_f m_f / (n_f m_f + (n - n_f) m_w), solved for n_f.
    n_f = n if share >= 1.0 else round(share * m_w * n / ((1.0 - share) * m_f + share * m_w))
    drawn = _draw(fractional, n_f, rng) + _draw(whole, n - n_f, rng)
    order = rng.permutation(n)
    out = list(pods)
    for slot, k in zip(gpu_at, order, strict=True):
        out[slot] = replace(drawn[int(k)], name=pods[slot].name)
    return out


def apply_multigpu(
    pods: Sequence[PodRequest], share: float, rng: np.random.Generator
) -> list[PodRequest]:
    """Append multi-GPU pods (drawn from the trace's) until they request `share` of GPU milli."""
    multi = [p for p in pods if p.num_gpu > 1]
    if not multi:
        raise InvalidValueError("pods", 0, "multigpu needs multi-GPU pods in the trace")
    out = list(pods)
    total = sum(_milli(p) for p in pods)
    ours = sum(_milli(p) for p in multi)
    while ours < share * total:
        pod = multi[int(rng.integers(len(multi)))]
        out.append(replace(pod, name=f"openb-pod-{len(out):04d}"))
        ours += _milli(pod)
        total += _milli(pod)
    return out


def apply_gpuspec(
    pods: Sequence[PodRequest], share: float, rng: np.random.Generator, table: SpecTable
) -> list[PodRequest]:
    """Give `share` of the GPU pods (picked uniformly) a GPU model list drawn from `table`.

    Pods that already name models are left alone and count towards the share.
    """
    gpu_at = [i for i, p in enumerate(pods) if p.num_gpu]
    have = [i for i in gpu_at if pods[i].gpu_models]
    free = [i for i in gpu_at if not pods[i].gpu_models]
    want = max(round(share * len(gpu_at)) - len(have), 0)
    out = list(pods)
    for i in sorted(int(k) for k in rng.choice(free, size=min(want, len(free)), replace=False)):
        out[i] = replace(pods[i], gpu_models=table.draw(pods[i], rng))
    return out


def build(
    default: Sequence[PodRequest],
    recipe: Recipe,
    seed: int = DEFAULT_BUILD_SEED,
    table: SpecTable | None = None,
) -> list[PodRequest]:
    """The variant `recipe` of the `default` pod list, drawn with `seed`."""
    rng = np.random.default_rng(seed)
    pods = list(default)
    if recipe.gpushare is not None:
        pods = apply_gpushare(pods, recipe.gpushare, rng)
    if recipe.multigpu is not None:
        pods = apply_multigpu(pods, recipe.multigpu, rng)
    if recipe.gpuspec is not None:
        pods = apply_gpuspec(pods, recipe.gpuspec, rng, table or SpecTable.shipped())
    return pods


def write_pods(pods: Sequence[PodRequest], path: Path) -> Path:
    """Write a pod list in the trace's layout (atomically: workers may read it meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", newline="", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as handle:
        writer = csv.writer(handle)
        writer.writerow(("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"))
        for p in pods:
            spec = "|".join(sorted(p.gpu_models))
            writer.writerow((p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, spec))
    os.replace(handle.name, path)
    return path


def materialize(name: str, folder: Path = DEFAULT_FOLDER, seed: int = DEFAULT_BUILD_SEED) -> Path:
    """The pod CSV of variant `name`: the shipped file, or the built one written into `folder`.

    A built variant's file is `openb_pod_list_<canonical name>.csv` (so reports read its name
    off the path); a seed other than the default is part of the name (`...@7`).
    """
    if not is_built(name):
        return pods_file(name)
    recipe = parse_recipe(name)
    label = recipe.name + ("" if seed == DEFAULT_BUILD_SEED else f"@{seed}")
    pods = build(load_pods(pods_file("default")), recipe, seed)
    return write_pods(pods, folder / f"openb_pod_list_{label}.csv")


def summary(pods: Sequence[PodRequest]) -> dict[str, object]:
    """The distributions the recipe controls, to compare a built variant with a shipped one."""
    gpu = [p for p in pods if p.num_gpu]
    fractional = [p for p in gpu if p.is_fractional]
    total = sum(_milli(p) for p in pods) or 1
    spec = [p for p in gpu if p.gpu_models]
    return {
        "pods": len(pods),
        "cpu_only": len(pods) - len(gpu),
        "gpu_pods": len(gpu),
        "fractional_of_gpu_pods": round(len(fractional) / max(len(gpu), 1), 4),
        "fractional_milli_share": round(sum(_milli(p) for p in fractional) / total, 4),
        "multigpu_milli_share": round(sum(_milli(p) for p in gpu if p.num_gpu > 1) / total, 4),
        "gpuspec_of_gpu_pods": round(len(spec) / max(len(gpu), 1), 4),
        "total_milli_gpu": total,
        "num_gpu": {str(k): v for k, v in sorted(Counter(p.num_gpu for p in gpu).items())},
        "fractional_gpu_milli_mean": round(float(np.mean([p.gpu_milli for p in fractional])), 1)
        if fractional
        else None,
    }


def total_variation(a: Sequence[object], b: Sequence[object]) -> float:
    """Total variation distance between the empirical distributions of `a` and `b` (0-1)."""
    ca, cb = Counter(a), Counter(b)
    na, nb = max(len(a), 1), max(len(b), 1)
    return round(0.5 * sum(abs(ca[k] / na - cb[k] / nb) for k in set(ca) | set(cb)), 4)


def compare(built: Sequence[PodRequest], shipped: Sequence[PodRequest]) -> dict[str, object]:
    """Summaries side by side and the distance between the distributions the recipe draws."""

    def shapes(pods: Sequence[PodRequest]) -> list[tuple[int, int, int, int]]:
        return [(p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli) for p in pods]

    def specs(pods: Sequence[PodRequest]) -> list[tuple[int, bool, str]]:
        return [(*_kind(p), "|".join(sorted(p.gpu_models))) for p in pods if p.gpu_models]

    return {
        "built": summary(built),
        "shipped": summary(shipped),
        "tv_pod_shape": total_variation(shapes(built), shapes(shipped)),
        "tv_fractional_gpu_milli": total_variation(
            [p.gpu_milli for p in built if p.is_fractional],
            [p.gpu_milli for p in shipped if p.is_fractional],
        ),
        "tv_spec_by_kind": total_variation(specs(built), specs(shipped)),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m alnair.scheduler.simulator.variants",
        description="Build Alibaba trace variants from the default pod list.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("build", help="write a built variant's pod CSV and print its path")
    make.add_argument("variant", nargs="+", help="e.g. gen-gpushare60 gen-gpushare60+gpuspec20")
    make.add_argument("--out", type=Path, default=DEFAULT_FOLDER)
    make.add_argument("--seed", type=int, default=DEFAULT_BUILD_SEED)
    check = sub.add_parser("compare", help="build a shipped variant by the recipe; compare (JSON)")
    check.add_argument("variant", nargs="+", choices=[v for v in VARIANTS if v[0] in "gm"])
    check.add_argument("--seed", type=int, default=DEFAULT_BUILD_SEED)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            for name in args.variant:
                print(materialize(name, args.out, args.seed))
            return 0
        default = load_pods(pods_file("default"))
        report = {
            name: compare(build(default, parse_recipe(name), args.seed), load_pods(pods_file(name)))
            for name in args.variant
        }
        print(json.dumps(report, indent=2))
        return 0
    except AlnairError as err:
        print(f"variants: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
