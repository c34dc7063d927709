"""The local stack's bookkeeping: which services run, their ports, the state file, processes.

The whole `make up` / `make status` / `make down` cycle runs in tests/e2e/test_walkthrough.py;
these check the parts that need no servers.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from alnair.common.errors import ConfigError
from alnair.common.settings import DEFAULT_HTTP_PORTS
from alnair.dev import devstack, stack_services


def test_every_service_has_its_own_port() -> None:
    ports = list(DEFAULT_HTTP_PORTS.values())
    assert len(set(ports)) == len(ports)
    assert set(stack_services.SERVICE_NAMES) <= set(DEFAULT_HTTP_PORTS)
    assert DEFAULT_HTTP_PORTS["scheduler"] == 8081
    assert DEFAULT_HTTP_PORTS["deviceplugin"] == 8085


def test_services_default_to_their_table_port(monkeypatch: pytest.MonkeyPatch) -> None:
    from alnair.deviceplugin.settings import DevicePluginSettings
    from alnair.predictor.settings import PredictorSettings
    from alnair.profiler.settings import ProfilerSettings
    from alnair.scheduler.settings import SchedulerSettings

    assert SchedulerSettings().http_port == 8081
    assert PredictorSettings().http_port == 8082
    assert DevicePluginSettings().http_port == 8085
    # one settings class, two processes: each role has its own port unless one is configured
    assert ProfilerSettings().http_port == 8083
    assert ProfilerSettings(role="aggregator").http_port == 8084
    assert ProfilerSettings(role="aggregator", http_port=0).http_port == 0
    monkeypatch.setenv("ALNAIR_SCHEDULER_HTTP_PORT", "9999")
    assert SchedulerSettings().http_port == 9999


def test_default_services_skip_optional_and_missing_modules() -> None:
    run, skipped = devstack.wanted(devstack.UpOptions())
    names = [s.name for s in run]
    assert names[:4] == ["profiler-agent", "aggregator", "predictor", "scheduler"]
    assert "deviceplugin" not in names  # optional: KWOK nodes have no kubelet
    # the hooks (dispatcher, elastic controller) run exactly when their module can
    for hook in ("dispatcher", "elastic"):
        spec = stack_services.service(hook)
        assert (hook in names) == spec.available()
        assert (hook in [s.name for s in skipped]) != spec.available()
    assert not stack_services.ServiceSpec("x", ("alnair.not_built",), "P", "").available()
    assert not stack_services.ServiceSpec(
        "x", ("alnair.common",), "P", ""
    ).available()  # no __main__
    with_plugin, _ = devstack.wanted(devstack.UpOptions(extra=("deviceplugin",)))
    assert "deviceplugin" in [s.name for s in with_plugin]
    only, _ = devstack.wanted(devstack.UpOptions(only=("scheduler",)))
    assert [s.name for s in only] == ["scheduler"]


def test_misspelt_service_is_named() -> None:
    with pytest.raises(ConfigError, match="'schedular'"):
        devstack.wanted(devstack.UpOptions(extra=("schedular",)))


def test_busy_port_is_named_with_the_way_out() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = stack_services.service("scheduler")
        with pytest.raises(ConfigError, match=rf"{port} \(scheduler\).*FREE_PORTS=1"):
            devstack._check_free({"scheduler": port}, [spec])


def test_state_round_trips_and_writes_the_env_script(tmp_path: Path) -> None:
    proc = devstack.Proc("scheduler", 4242, 17, str(tmp_path / "s.log"), 8081)
    state = devstack.State(
        tmp_path,
        "nats://127.0.0.1:4222",
        "redis://127.0.0.1:6379/0",
        "/k/kubeconfig",
        "https://127.0.0.1:6443",
        ["gpu-v100m32-0001"],
        [devstack.Proc("etcd", 4141, 16, str(tmp_path / "etcd.log"))],
        {"scheduler": proc},
    )
    state.save()
    loaded = devstack.State.load(tmp_path)
    assert loaded == state
    env = (tmp_path / "env").read_text()
    assert "export KUBECONFIG=/k/kubeconfig\n" in env
    assert "export ALNAIR_SCHEDULER_URL=http://127.0.0.1:8081\n" in env
    assert devstack.url_variable("profiler-agent") == "ALNAIR_PROFILER_AGENT_URL"


def test_proc_alive_only_for_the_process_it_recorded(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        ticks = devstack._start_ticks(child.pid)
        assert ticks is not None
        live = devstack.Proc("x", child.pid, ticks, str(tmp_path / "x.log"))
        assert live.alive()
        # the same pid with another start time is some other process: never signalled
        assert not devstack.Proc("x", child.pid, ticks + 1, str(tmp_path / "x.log")).alive()
        live.stop(timeout_s=5)
        child.wait(timeout=5)
        assert not live.alive()
    finally:
        child.kill()
        child.wait()


def test_status_and_down_without_a_stack(tmp_path: Path) -> None:
    assert devstack.status(tmp_path) is None
    assert devstack.down(tmp_path) == []
    assert devstack.main(["--dir", str(tmp_path), "status"]) == 1


def test_a_service_that_dies_at_start_fails_with_its_log_tail(tmp_path: Path) -> None:
    # `python -m alnair.dev.devstack` without a command exits at once with its usage
    broken = stack_services.ServiceSpec("scheduler", ("alnair.dev.devstack",), "UNUSED_PORT", "x")
    state = devstack.State(tmp_path, "nats://n", "redis://r", "/k", "https://a", [])
    with pytest.raises(devstack.StartError, match=r"scheduler exited during start-up") as err:
        devstack._start_services(state, [broken], {"scheduler": 1}, devstack.UpOptions())
    assert "usage: python -m alnair.dev.devstack" in str(err.value)
    assert str(tmp_path / "logs" / "scheduler.log") in str(err.value)
    # the state file already names it, so `make down` and `make status` see it
    assert devstack.State.load(tmp_path).services["scheduler"].log.endswith("scheduler.log")
