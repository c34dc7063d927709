"""The simulator replays pods whose GPUs are asked through ResourceClaims: each trace pod is
written as Alnair's DeviceClass claims (or as `alnair.io/gpu-memory`/`gpu-compute` resources),
read back by the scheduler's own parsers, and a replay of either form places every pod on the
same node and GPUs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from alnair.common import dra
from alnair.common import resources as r
from alnair.common.data import data_file
from alnair.common.errors import InvalidValueError
from alnair.scheduler.cluster.pods import parse_pod
from alnair.scheduler.cluster.requests import PodRequest
from alnair.scheduler.simulator import cli
from alnair.scheduler.simulator.claims import (
    claim_object,
    pod_object,
    through_claims,
    through_resources,
    written_as,
)
from alnair.scheduler.simulator.engine import simulate
from alnair.scheduler.simulator.trace import NODE_FILE, TRACE_DIR, load_pods

TABLE = {"T4": 15360, "V100M32": 32510}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A slice of the shipped trace: every 60th node (P100, T4, G2, G3, V100, A10) and the first
    400 pods of the `gpuspec25` variant (whole, fractional and model-restricted)."""
    folder = tmp_path_factory.mktemp("trace")
    for source, target, keep in (
        (data_file(TRACE_DIR, NODE_FILE), folder / "nodes.csv", lambda i: i % 60 == 0),
        (
            data_file(TRACE_DIR, "openb_pod_list_gpuspec25.csv"),
            folder / "openb_pod_list_gpuspec25.csv",
            lambda i: i < 400,
        ),
    ):
        with source.open(newline="") as handle:
            rows = list(csv.reader(handle))
        target.write_text(
            "\n".join(",".join(row) for i, row in enumerate(rows[1:]) if keep(i)).join(
                [",".join(rows[0]) + "\n", "\n"]
            )
        )
    return folder / "nodes.csv", folder / "openb_pod_list_gpuspec25.csv"


@pytest.mark.parametrize("policy", ["FGD", "alnair"])
def test_claim_backed_pods_are_placed_like_gpu_memory_pods(
    trace: tuple[Path, Path], policy: str
) -> None:
    by_claims = simulate(policy, *trace, seed=7, requests="claims")
    by_resources = simulate(policy, *trace, seed=7, requests="resources")
    assert by_claims.placements == by_resources.placements
    assert by_claims.alloc_pct_by_demand == by_resources.alloc_pct_by_demand
    # the trace's own milli-GPU gives the same replay: the forms lose nothing
    assert simulate(policy, *trace, seed=7).placements == by_claims.placements
    pods = {p.name: p for p in load_pods(trace[1])}
    placed = [pods[name.split("-tuned-")[0]] for name in by_claims.placements]
    assert any(p.is_fractional for p in placed)
    assert any(p.is_fractional and p.gpu_models for p in placed)
    assert any(p.num_gpu and not p.is_fractional for p in placed)
    assert 0 < by_claims.placed < by_claims.pods  # tuned past capacity: some wait
    assert by_claims.to_json()["requests"] == "claims"


def test_a_fraction_becomes_a_shared_claim_and_whole_gpus_a_count() -> None:
    share = PodRequest("share", 2000, 4096, num_gpu=1, gpu_milli=250, gpu_models=frozenset({"T4"}))
    claim = claim_object(share, TABLE)
    assert claim is not None
    [request] = claim["spec"]["devices"]["requests"]
    assert request["exactly"] == {
        "deviceClassName": dra.CLASS_SHARED,
        "capacity": {"requests": {"memory": "3840Mi", "compute": "25"}},
    }
    whole = claim_object(PodRequest("whole", 8000, 16384, num_gpu=2, gpu_milli=1000), TABLE)
    assert whole is not None
    assert whole["spec"]["devices"]["requests"][0]["exactly"] == {
        "deviceClassName": dra.CLASS_WHOLE,
        "count": 2,
    }
    assert claim_object(PodRequest("cpu", 1000, 1024), TABLE) is None
    limits = pod_object(share, TABLE)["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {r.GPU_MEMORY: "3840", r.GPU_COMPUTE: "25"}


def test_both_forms_read_back_as_the_trace_request() -> None:
    pods = [
        PodRequest("a", 2000, 4096, num_gpu=1, gpu_milli=460),
        PodRequest("b", 2000, 4096, num_gpu=1, gpu_milli=50, gpu_models=frozenset({"V100M32"})),
        PodRequest("c", 8000, 16384, num_gpu=4, gpu_milli=1000, gpu_models=frozenset({"T4"})),
        PodRequest("d", 1000, 2048),
    ]
    assert through_claims(pods, TABLE) == pods
    assert through_resources(pods, TABLE) == pods
    # a fraction that is no whole percent rounds up the same way in both forms
    odd = [PodRequest("e", 1000, 1024, num_gpu=1, gpu_milli=255)]
    assert through_claims(odd, TABLE) == through_resources(odd, TABLE)
    assert through_claims(odd, TABLE)[0].gpu_milli == 260
    # and the resources form is what the live binder parses
    assert parse_pod(pod_object(pods[1], TABLE), TABLE) == pods[1]


def test_bad_forms_and_models_are_named() -> None:
    with pytest.raises(InvalidValueError, match="'tokens'"):
        written_as("tokens", [])
    alien = PodRequest("x", 1000, 1024, num_gpu=1, gpu_milli=500, gpu_models=frozenset({"Z9"}))
    with pytest.raises(InvalidValueError, match="Z9"):
        through_claims([alien], TABLE)


def test_cli_replays_claims(trace: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = trace
    argv = ["--nodes", str(nodes), "--pods", str(pods), "--policy", "FGD", "--seed", "3"]
    assert cli.main([*argv, "--requests", "claims", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["requests"] == "claims"
    assert out["placed"] > 0
    assert "placements" not in out
