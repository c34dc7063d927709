"""The trace-variant builder: the published recipe on synthetic pod lists (what each recipe keeps,
what it redraws, the shares it reaches), its reproduction of the shipped variants, and the
names `alnair simulate --variant` and `bench/placement.py` take."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from alnair.common.data import DATA_ENV
from alnair.common.errors import InvalidValueError
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.simulator import cli, variants
from alnair.scheduler.simulator.trace import load_pods, pods_file
from alnair.scheduler.simulator.variants import Recipe, SpecTable, build, parse_recipe


def pod(i: int, cpu: int, gpus: int = 0, milli: int = 0, models: str = "") -> PodRequest:
    return PodRequest(
        name=f"openb-pod-{i:04d}",
        cpu_milli=cpu,
        memory_mib=2 * cpu,
        num_gpu=gpus,
        gpu_milli=milli,
        gpu_models=frozenset(m for m in models.split("|") if m),
    )


def synthetic(count: int = 2000) -> list[PodRequest]:
    """A tenth CPU-only, 40% fractional (200-900 milli), the rest whole, 3% of pods multi-GPU."""
    rng = np.random.default_rng(0)
    pods = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.1:
            pods.append(pod(i, 1000 + int(rng.integers(8)) * 1000))
        elif kind < 0.5:
            pods.append(pod(i, 4000, 1, int(rng.choice([200, 450, 700, 900]))))
        elif kind < 0.97:
            pods.append(pod(i, 8000, 1, 1000))
        else:
            pods.append(pod(i, 32000, int(rng.choice([2, 4, 8])), 1000))
    return pods


SPECS = SpecTable.from_pods(
    [
        pod(0, 1, 1, 500, "P100"),
        pod(1, 1, 1, 500, "T4"),
        pod(2, 1, 1, 1000, "G2"),
        pod(3, 1, 1, 1000, "V100M16|V100M32"),
        pod(4, 1, 8, 1000, "G3"),
    ]
)


def share(pods: list[PodRequest], which: str) -> float:
    total = sum(p.total_milli_gpu for p in pods)
    test = {"frac": lambda p: p.is_fractional, "multi": lambda p: p.num_gpu > 1}[which]
    return sum(p.total_milli_gpu for p in pods if test(p)) / total


@pytest.mark.parametrize(
    ("name", "recipe", "canonical"),
    [
        ("gen-gpushare60", Recipe(gpushare=0.6), "gen-gpushare60"),
        ("gpuspec33", Recipe(gpuspec=0.33), "gen-gpuspec33"),
        (
            "gen-gpuspec20+gpushare100+multigpu50",
            Recipe(gpushare=1.0, gpuspec=0.2, multigpu=0.5),
            "gen-gpushare100+multigpu50+gpuspec20",
        ),
    ],
)
def test_names_parse_to_recipes_and_back(name: str, recipe: Recipe, canonical: str) -> None:
    assert parse_recipe(name) == recipe
    assert variants.canonical(name) == canonical
    assert variants.canonical("gpushare40") == "gpushare40"  # shipped stays shipped


@pytest.mark.parametrize(
    "name",
    [
        "gen-gpushare",
        "gen-share60",
        "gen-gpushare160",
        "gen-multigpu100",
        "gen-gpuspec20+gpuspec30",
    ],
)
def test_bad_names_are_named(name: str) -> None:
    with pytest.raises(InvalidValueError) as err:
        parse_recipe(name)
    assert name in str(err.value)


@pytest.mark.parametrize("target", [0.6, 0.8, 1.0])
def test_gpushare_redraws_gpu_pods_to_the_share(target: float) -> None:
    default = synthetic()
    built = build(default, Recipe(gpushare=target), seed=1)
    assert len(built) == len(default)
    assert [p.name for p in built] == [p.name for p in default]
    # CPU-only pods stay where they were, unchanged; GPU pods stay GPU pods.
    for old, new in zip(default, built, strict=True):
        assert (old.num_gpu == 0) == (new.num_gpu == 0)
        if old.num_gpu == 0:
            assert new == old
    shapes = {(p.cpu_milli, p.num_gpu, p.gpu_milli) for p in default}
    assert {(p.cpu_milli, p.num_gpu, p.gpu_milli) for p in built} <= shapes
    assert share(built, "frac") == pytest.approx(target, abs=0.02)
    if target == 1.0:
        assert all(p.is_fractional for p in built if p.num_gpu)


def test_multigpu_appends_until_the_share_is_reached() -> None:
    default = synthetic()
    built = build(default, Recipe(multigpu=0.5), seed=2)
    assert built[: len(default)] == default
    added = built[len(default) :]
    assert added
    assert all(p.num_gpu > 1 for p in added)
    assert len({p.name for p in built}) == len(built)
    assert share(built, "multi") >= 0.5 > share(built[:-1], "multi")


def test_gpuspec_names_models_by_kind_of_pod() -> None:
    default = synthetic()
    built = build(default, Recipe(gpuspec=0.33), seed=3, table=SPECS)
    gpu = [p for p in built if p.num_gpu]
    named = [p for p in gpu if p.gpu_models]
    assert len(named) == round(0.33 * len(gpu))
    for p in named:
        if p.is_fractional:
            assert p.gpu_models in ({"P100"}, {"T4"})
        elif p.num_gpu == 8:
            assert p.gpu_models == {"G3"}
        else:  # 1, 2 and 4 GPUs: 2 and 4 have no spec of their own, the nearest count is 1
            assert p.gpu_models in ({"G2"}, {"V100M16", "V100M32"})
    stripped = [
        PodRequest(p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli) for p in built
    ]
    assert stripped == default


def test_combined_recipes_and_seeds() -> None:
    default = synthetic()
    recipe = parse_recipe("gen-gpushare80+gpuspec20")
    once = build(default, recipe, seed=4, table=SPECS)
    assert once == build(default, recipe, seed=4, table=SPECS)
    assert once != build(default, recipe, seed=5, table=SPECS)
    assert share(once, "frac") == pytest.approx(0.8, abs=0.02)
    gpu = [p for p in once if p.num_gpu]
    assert sum(bool(p.gpu_models) for p in gpu) == round(0.2 * len(gpu))


def test_building_gpushare40_reproduces_the_shipped_file() -> None:
    default = load_pods(pods_file("default"))
    shipped = load_pods(pods_file("gpushare40"))
    report = variants.compare(build(default, Recipe(gpushare=0.4)), shipped)
    built, ours = report["built"], report["shipped"]
    assert isinstance(built, dict) and isinstance(ours, dict)
    assert built["pods"] == ours["pods"] and built["cpu_only"] == ours["cpu_only"]
    for key in ("fractional_milli_share", "fractional_of_gpu_pods"):
        assert abs(built[key] - ours[key]) < 0.01
    assert report["tv_pod_shape"] < 0.05
    assert report["tv_fractional_gpu_milli"] < 0.05


def test_simulate_takes_a_built_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data" / "alibaba-gpu-2023"
    data.mkdir(parents=True)
    (data / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        + "".join(f"node-{i},96000,393216,8,{'G2' if i % 2 else 'T4'}\n" for i in range(4))
    )
    default = synthetic(300)
    variants.write_pods(default, data / "openb_pod_list_default.csv")
    for name in variants.SPEC_SOURCES:
        variants.write_pods(
            [pod(0, 4000, 1, 450, "T4"), pod(1, 8000, 1, 1000, "G2")],
            data / f"openb_pod_list_{name}.csv",
        )
    monkeypatch.setenv(DATA_ENV, str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    code = cli.main(["--variant", "gpushare80+gpuspec20", "--policy", "FGD", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    written = tmp_path / "out" / "variants" / "openb_pod_list_gen-gpushare80+gpuspec20.csv"
    assert out["pods_file"] == str(Path("out/variants") / written.name)
    pods = load_pods(written)
    assert share(pods, "frac") == pytest.approx(0.8, abs=0.05)
    assert {p.gpu_models for p in pods if p.gpu_models} <= {frozenset({"T4"}), frozenset({"G2"})}
    assert cli.main(["--variant", "gen-nope7", "--policy", "FGD"]) == 2
    assert "gen-nope7" in capsys.readouterr().err
