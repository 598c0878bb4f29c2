"""gepard-server's GPU placement settings as an operator sees them: the log, /health, and the
refusal of a bad value at start. (The parsing itself: tests/test-server-config.c.)"""

import json
import os
import subprocess

import pytest

import gepard_server_process as gsp

if gsp.skip_reason():
    pytest.skip(gsp.skip_reason(), allow_module_level=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return gsp.make_test_model(tmp_path_factory.mktemp("model"))


def test_health_reports_placement_and_mps(model, tmp_path):
    pipes = tmp_path / "mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")
    server = gsp.GepardServer(model, tmp_path, env={
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes), "GPU_DEVICE_IDS": "0,1",
        "TTS_GPU_MEMORY_UTILIZATION": "0.7"})
    try:
        status, _, body = server.request("GET", "/health")
        assert status == 200
        health = json.loads(body)
        assert health["gpu"] == {"device_ids": [0, 1], "memory_utilization": 0.7, "mps": True}
        # no GPU here: one engine, on the CPU, whatever the list says
        assert [(e["gpu"], e["running"]) for e in health["engines"]] == [(None, 0)]
        assert health["engines"][0]["device"] == health["engine"]["device"]
        metrics = server.metrics()
        assert metrics['gepard_device_batch_size{device="cpu"}'] == 0
        assert [k for k in metrics if k.startswith("gepard_device_batch_size")] == \
            ['gepard_device_batch_size{device="cpu"}']
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert f"NVIDIA MPS daemon found (control pipe in {pipes})" in log
    assert "GPU ids 0,1" in log and "GPUs 1 are listed but unused" in log


def test_health_without_mps(model, tmp_path):
    server = gsp.GepardServer(model, tmp_path, env={"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    try:
        status, _, body = server.request("GET", "/health")
        assert json.loads(body)["gpu"] == {"device_ids": [0], "memory_utilization": 0.5,
                                           "mps": False}
    finally:
        server.stop()
    assert f"no NVIDIA MPS daemon (no control pipe in {tmp_path})" in server.log_path.read_text()


@pytest.mark.parametrize("variable,value,message", [
    ("TTS_GPU_DEVICE_IDS", "0,,1", "TTS_GPU_DEVICE_IDS=0,,1: an empty GPU id"),
    ("GPU_DEVICE_IDS", "gpu0", "gpu0 is not a GPU index"),
    ("TTS_GPU_MEMORY_UTILIZATION", "90%", "TTS_GPU_MEMORY_UTILIZATION=90%: not a fraction"),
])
def test_bad_values_stop_the_server_at_start(model, variable, value, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TTS_", "GPU_"))}
    env[variable] = value
    result = subprocess.run([str(gsp.SERVER), "--model", str(model), "--port", "0"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
