"""`serve --device sim` on an instance type the simulated device refused before the hardware catalogue."""

from __future__ import annotations

from pathlib import Path

from harness.engine_server import ServerPool, write_engine_config

MODEL = "neuronfleet/tiny"


def test_a_trn2_3xlarge_serves_a_completion_on_all_four_of_its_cores(servers: ServerPool, tmp_path: Path) -> None:
    config = write_engine_config(
        tmp_path, max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512, tensor_parallel_size=4
    )
    sim = ["--device", "sim", "--clock", "virtual", "--target", "trn2", "--instance-type", "trn2.3xlarge"]
    server = servers.start("--config", str(config), "--model", f"hf://{MODEL}", *sim)
    response = server.post("/v1/completions", {"model": MODEL, "prompt": "one two three", "max_tokens": 5})
    assert response.status == 200, response.body
    assert response.json()["usage"]["completion_tokens"] == 5
    assert "tiny on trn2.3xlarge, tensor parallel 4" in server.log.read_text()
