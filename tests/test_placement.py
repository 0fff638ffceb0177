"""GPUs counted, not assumed; the placement checked before any process starts; one GPU colocates by itself;
--colocate implies the colocated transport and a memory split (issue 18). No GPU needed: the counts are given."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_actors.backends.sglang_launch import base_gpu_id, engine_command, flag_value
from slime_actors.config import ConfigError, parse_config
from slime_actors.gpus import GpuCount, count_gpus, slurm_gpus
from slime_actors.launch.job_config import build_job_config, build_placed_job_config
from slime_actors.launch.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
ARITH = str(ROOT / "examples" / "smollm2_arith" / "config.toml")
DIGITS = str(ROOT / "examples" / "digits" / "config.toml")
ONE, TWO, EIGHT = GpuCount(1, "test"), GpuCount(2, "test"), GpuCount(8, "test")


def placed(gpus: GpuCount, *flags: str, config: str = DIGITS, topology=None):
    return build_placed_job_config(["--config", config, "--device", "cuda", *flags], topology, gpus)


# -- counting -------------------------------------------------------------------------------------------------

def test_the_count_is_torchs_lowered_to_slurms_and_says_where_it_comes_from():
    def torch_sees(n):
        return lambda env: (n, "" if n else "no CUDA device or driver found")
    g = count_gpus({"CUDA_VISIBLE_DEVICES": "0"}, torch_sees(1))
    assert (g.count, g.source) == (1, "torch.cuda.device_count() with CUDA_VISIBLE_DEVICES='0'")
    assert g.describe() == "1 GPU visible (torch.cuda.device_count() with CUDA_VISIBLE_DEVICES='0')"
    g = count_gpus({"SLURM_GPUS_ON_NODE": "2"}, torch_sees(8))       # the allocation grants 2 of the 8
    assert g.count == 2 and "SLURM_GPUS_ON_NODE=2" in g.source and "torch sees 8" in g.source
    assert count_gpus({"SLURM_GPUS_PER_NODE": "h200:4"}, torch_sees(8)).count == 4
    assert count_gpus({"SLURM_GPUS_ON_NODE": "8"}, torch_sees(1)).count == 1   # never more than torch sees
    assert count_gpus({}, torch_sees(0)).describe() == ("0 GPUs visible (torch.cuda.device_count(); no CUDA device "
                                                        "or driver found)")
    assert slurm_gpus({"SLURM_GPUS_PER_NODE": "gpu:h100:8(x2)"}) == (8, "SLURM_GPUS_PER_NODE=gpu:h100:8(x2)")
    assert slurm_gpus({"SLURM_GPUS_ON_NODE": ""}) is None


class FakeNvml:
    """NVML as ctypes calls it (return codes, results written through byref) for a machine with these GPUs."""

    def __init__(self, gib: list[int], init: int = 0):
        self.gib, self.init, self.calls = gib, init, []

    def nvmlInit_v2(self):
        self.calls.append("init")
        return self.init

    def nvmlShutdown(self):
        self.calls.append("shutdown")
        return 0

    def nvmlDeviceGetCount_v2(self, ref):
        ref._obj.value = len(self.gib)
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, i, ref):
        if i >= len(self.gib):
            return 2   # NVML_ERROR_INVALID_ARGUMENT
        ref._obj.value = 1000 + i
        return 0

    def nvmlDeviceGetMemoryInfo(self, handle, ref):
        ref._obj.total = self.gib[handle.value - 1000] << 30
        return 0


def test_the_drivers_count_through_nvml_honours_cuda_visible_devices_as_cuda_does():
    """Where torch is a CUDA build, NVML counts (milliseconds; importing torch took the head seconds): every GPU, or
    those CUDA_VISIBLE_DEVICES lists up to the first index the machine lacks, with the smallest one's memory. A list
    in another form (UUIDs, MIG devices, a repeated index) is torch's to count, and so is a failing NVML."""
    from slime_actors.gpus import _nvml_count
    nvml = FakeNvml([80, 80, 40, 80])
    g = count_gpus({}, nvml=nvml)
    assert (g.count, g.memory_bytes, g.source) == (4, 40 << 30, "NVML (the driver's count)")
    assert nvml.calls == ["init", "shutdown"]
    g = count_gpus({"CUDA_VISIBLE_DEVICES": "3,1"}, nvml=FakeNvml([80, 80, 40, 80]))
    assert (g.count, g.memory_bytes) == (2, 80 << 30)
    assert g.describe() == "2 GPUs visible (NVML (the driver's count) with CUDA_VISIBLE_DEVICES='3,1')"
    assert count_gpus({"CUDA_VISIBLE_DEVICES": "1,7,0"}, nvml=FakeNvml([80, 80])).count == 1   # CUDA stops at 7
    g = count_gpus({"SLURM_GPUS_ON_NODE": "2"}, nvml=FakeNvml([80] * 8))
    assert g.count == 2 and "NVML sees 8" in g.source
    assert count_gpus({}, nvml=FakeNvml([])).describe() == ("0 GPUs visible (NVML (the driver's count); the driver "
                                                           "reports no GPU)")
    for cvd in ("GPU-5c1f8e2a", "MIG-1", "0,0", "", "-1", "0,x"):
        assert _nvml_count({"CUDA_VISIBLE_DEVICES": cvd}, FakeNvml([80])) is None, cvd
    assert _nvml_count({}, FakeNvml([80], init=9)) is None         # NVML failed to start: torch counts
    assert _nvml_count({}, object()) is None                       # not NVML at all


def test_this_machine_is_counted_with_its_reason():
    """The real count here (a CPU build of torch on a CPU machine: 0, and why); an empty CUDA_VISIBLE_DEVICES hides
    every GPU whatever the machine has."""
    import torch
    g = count_gpus()
    assert g.count == torch.cuda.device_count()
    if torch.version.cuda is None:
        assert g.detail == f"torch {torch.__version__} is a CPU build"
    if torch.version.cuda is not None:
        assert count_gpus({"CUDA_VISIBLE_DEVICES": ""}).count == 0


# -- one GPU: the plain command colocates by itself -----------------------------------------------------------

def test_one_gpu_and_no_placement_flags_colocate_by_themselves():
    """The plain one-GPU command of issue 18: `--device cuda`, nothing else. Today's main placed the engine on GPU 1
    (invalid device ordinal); here the trainer and the engine share GPU 0, weights go by CUDA IPC, the engine keeps
    to 40% of the memory, and the plan says so."""
    cfg, _, plan = placed(ONE, config=ARITH)
    assert cfg.engine.colocate and plan.by_itself
    assert cfg.weights.update_weight_transport == "colocated"
    assert cfg.engine.num_gpus_per_node == 1
    assert flag_value(cfg.engine.sglang_args, "--mem-fraction-static") == "0.4"
    assert base_gpu_id(cfg, 0, placed="") == 0
    _, argv = engine_command(cfg, 0, 30000)
    assert argv[argv.index("--base-gpu-id") + 1] == "0" and argv[argv.index("--mem-fraction-static") + 1] == "0.4"
    assert plan.trainer == [("trainer/0", [0])] and plan.engines == [("rollout/0", [0])]
    text = "\n".join(plan.lines())
    assert text.startswith("1 GPU visible (test): trainer/0 on GPU 0; rollout/0 on GPU 0")
    assert "as with --colocate" in text and "--update-weight-transport colocated" in text
    assert "each engine keeps to 40% of its GPU's memory (--sglang-mem-fraction-static 0.4)" in text
    # what the actors get (job.json) is the same config, typed back
    from slime_actors.config import JobConfig
    back = JobConfig.from_dict(cfg.to_dict())
    assert back.engine.colocate and back.weights.update_weight_transport == "colocated"


def test_one_gpu_keeps_the_users_transport_and_memory_when_they_work_on_one_device():
    cfg, _, plan = placed(ONE, "--update-weight-transport", "disk", "--sglang-mem-fraction-static", "0.25")
    assert cfg.engine.colocate and cfg.weights.update_weight_transport == "disk"
    assert cfg.engine.sglang_args == ["--mem-fraction-static", "0.25"] and plan.mem_fraction == "0.25"


def test_one_gpu_refuses_nccl_between_two_processes_of_that_gpu():
    with pytest.raises(ConfigError, match=r"1 GPU visible \(test\), so the trainer and the engine share it: "
                                          r"--colocate .* NCCL .*Duplicate GPU detected.*leave the flag out"):
        placed(ONE, "--update-weight-transport", "distributed")


@pytest.mark.parametrize("flags, message", [
    (["--actor-num-gpus-per-node", "2", "--rollout-batch-size", "16"],
     r"^1 GPU visible \(test\): the trainer needs 2 and 1 engine of 1 GPU need 1 more -- use fewer trainer ranks"),
    (["--rollout-num-engines", "2"],
     r"^1 GPU visible \(test\): the trainer needs 1 and 2 engines of 1 GPU need 2 more -- use fewer"),
    (["--num-gpus-per-node", "8"],
     r"^--num-gpus-per-node 8 but 1 GPU visible \(test\): leave the flag out"),
    (["--num-gpus-per-node", "1"],   # the user places the job: no colocation by itself, the fix is named
     r"^1 GPU visible \(test\): the trainer needs 1 and 1 engine of 1 GPU need 1 more -- pass --colocate"),
    (["--colocate", "--rollout-num-engines", "2"],
     r"^1 GPU visible \(test\): with --colocate the trainer needs 1 and 2 engines of 1 GPU need 2"),
])
def test_a_plan_that_cannot_fit_one_gpu_is_refused_with_the_numbers_and_the_fix(flags, message):
    with pytest.raises(ConfigError, match=message):
        placed(ONE, *flags)


def test_no_gpu_at_all_is_refused_before_anything_starts():
    with pytest.raises(ConfigError, match=r"--device cuda but no GPU is visible here \(torch.cuda.device_count\(\): "
                                          r"torch 2.13.0\+cpu is a CPU build\): use --device cpu"):
        placed(GpuCount(0, "torch.cuda.device_count()", "torch 2.13.0+cpu is a CPU build"))


def test_cpu_jobs_are_not_placed():
    cfg, _, plan = build_placed_job_config(["--config", DIGITS], None, GpuCount(0, "test"))
    assert plan is None and not cfg.engine.colocate and cfg.weights.update_weight_transport == "distributed"
    assert cfg.engine.num_gpus_per_node is None and cfg.engine.sglang_args == []


# -- more GPUs ------------------------------------------------------------------------------------------------

def test_two_gpus_place_trainer_and_engine_apart_with_nccl():
    cfg, _, plan = placed(TWO)
    assert not cfg.engine.colocate and not plan.by_itself
    assert cfg.weights.update_weight_transport == "distributed" and cfg.engine.num_gpus_per_node == 2
    assert plan.trainer == [("trainer/0", [0])] and plan.engines == [("rollout/0", [1])]
    assert base_gpu_id(cfg, 0, placed="") == 1 and plan.mem_fraction is None
    assert cfg.engine.sglang_args == []
    with pytest.raises(ConfigError, match=r"^2 GPUs visible \(test\): the trainer needs 1 and 2 engines of 1 GPU "
                                          r"need 2 more -- pass --colocate"):
        placed(TWO, "--rollout-num-engines", "2")


def test_eight_gpus_colocated_and_disaggregated_as_slime_places_them():
    cfg, _, plan = placed(EIGHT, "--actor-num-gpus-per-node", "4", "--rollout-num-engines", "2",
                          "--rollout-num-gpus-per-engine", "2", "--rollout-engine", "sglang")
    assert [g for _, g in plan.engines] == [[4, 5], [6, 7]] and [base_gpu_id(cfg, i, "") for i in (0, 1)] == [4, 6]
    cfg, _, plan = placed(EIGHT, "--colocate", "--actor-num-gpus-per-node", "8", "--rollout-num-engines", "4",
                          "--rollout-num-gpus-per-engine", "2", "--rollout-engine", "sglang")
    assert [g for _, g in plan.engines] == [[0, 1], [2, 3], [4, 5], [6, 7]] and plan.mem_fraction == "0.4"
    assert cfg.weights.update_weight_transport == "colocated"
    assert plan.lines()[0].startswith("8 GPUs visible (test): trainer/0 on GPU 0; ") and plan.lines()[0].endswith(
        "trainer/7 on GPU 7; rollout/0 on GPU 0,1; rollout/1 on GPU 2,3; rollout/2 on GPU 4,5; rollout/3 on GPU 6,7")


# -- --colocate means what slime means -----------------------------------------------------------------------

def test_colocate_implies_the_colocated_transport_and_nccl_on_one_gpu_is_refused():
    cfg = parse_config(["--config", DIGITS, "--device", "cuda", "--colocate"])
    assert cfg.weights.update_weight_transport == "colocated"
    assert parse_config(["--config", DIGITS, "--device", "cuda"]).weights.update_weight_transport == "distributed"
    for t in ("distributed", "nccl"):
        with pytest.raises(ConfigError, match=r"--colocate .*--update-weight-transport distributed .*NCCL group"):
            parse_config(["--config", DIGITS, "--device", "cuda", "--colocate", "--update-weight-transport", t])
    assert parse_config(["--config", DIGITS, "--device", "cuda", "--colocate", "--update-weight-transport",
                         "disk"]).weights.update_weight_transport == "disk"
    # on CPU the distributed transport is gloo, which two processes of one machine share fine
    assert parse_config(["--config", DIGITS, "--colocate", "--update-weight-transport", "distributed"]
                        ).weights.update_weight_transport == "distributed"


def test_a_topology_that_colocates_rollout_with_the_trainer_is_colocate():
    topo = load_topology(ROOT / "examples" / "launch" / "colocated-1node.toml")
    cfg, changed = build_job_config(["--config", DIGITS, "--device", "cuda"], topo)
    assert cfg.engine.colocate and cfg.weights.update_weight_transport == "colocated"
    assert "--colocate False -> True" in changed
    cfg, _, plan = placed(EIGHT, topology=topo)
    assert plan.from_topology and len(plan.engines) == 8 and cfg.engine.sglang_args[-2:] == ["--mem-fraction-static",
                                                                                            "0.4"]
    with pytest.raises(ConfigError, match=r"colocated-1node.toml: trainer/1 is placed on GPU 1 but 1 GPU visible "
                                          r"\(test\) -- GPU 1 does not exist here"):
        placed(ONE, topology=topo)
    with pytest.raises(ConfigError, match=r"colocated-1node.toml colocates the rollout workers with the trainer: "
                                          r"--colocate .*NCCL"):
        build_job_config(["--config", DIGITS, "--device", "cuda", "--update-weight-transport", "distributed"], topo)


# -- the commands --------------------------------------------------------------------------------------------

def _cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "slime_actors.cli", *args], capture_output=True, text=True,
                          cwd=str(ROOT), env={**os.environ, **(env or {})}, timeout=timeout, check=False)


def test_launch_refuses_a_topology_that_needs_gpus_this_machine_lacks(tmp_path):
    r = _cli("launch", str(ROOT / "examples" / "launch" / "separate-1node.toml"), "--config", DIGITS, "--device", "cuda",
             "--run-dir", str(tmp_path / "run"), env={"CUDA_VISIBLE_DEVICES": ""})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("slime-actors launch: error: --device cuda but no GPU is "
                                                        "visible here"), r.stderr
    assert not (tmp_path / "run").exists()


def test_training_device_is_the_flag_and_refuses_cuda_without_it():
    """Both training backends take their device from gpus.training_device: --device as given; "cuda" on a machine
    without CUDA is refused by name (the start-up check then ends the job with that cause)."""
    import torch

    from slime_actors.gpus import training_device
    assert training_device("cpu", 3) == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="--device cuda but no CUDA device is available"):
            training_device("cuda", 0)


# -- the colocated engine's memory share, sized for the model (issue 33) ------------------------------------------

def smollm2_shaped(model: Path) -> Path:
    """A model directory with SmolLM2-135M's config.json (no weights: the placement reads only the shape)."""
    import json
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "vocab_size": 49152, "intermediate_size": 1536, "tie_word_embeddings": True}))
    return model


def test_colocated_engine_share_is_sized_for_the_model(tmp_path):
    """A 135M-parameter model on an H200 needs a few GiB, not 40 % of the GPU; the share grows with the requests in
    flight and their length, stays between 0.05 and 0.4, and an explicit --sglang-mem-fraction-static wins. Without
    the model's config.json or the GPU's memory the fixed 0.4 stays."""
    from slime_actors.launch.placement import model_memory
    model = smollm2_shaped(tmp_path / "model")
    h200 = GpuCount(1, "test", memory_bytes=141 << 30)

    def share(*flags, gpus=h200):
        cfg, _, plan = placed(gpus, "--hf-checkpoint", str(model), "--rollout-engine", "sglang", *flags)
        assert flag_value(cfg.engine.sglang_args, "--mem-fraction-static") == plan.mem_fraction
        return plan.mem_fraction
    weights, per_token = model_memory(placed(h200, "--hf-checkpoint", str(model), "--rollout-engine", "sglang")[0])
    assert 134e6 * 2 < weights < 136e6 * 2 and per_token == 2 * 30 * 3 * 64 * 2      # fp16 weights and KV
    assert share() == "0.05"                                                         # the floor
    assert share("--rollout-concurrency", "2048", "--rollout-max-response-len", "4096") == "0.40"   # the ceiling
    mid = share("--rollout-concurrency", "512", "--rollout-max-response-len", "1024")
    assert 0.05 < float(mid) < 0.4
    need = (weights + per_token * 512 * (1024 + 1024)) * 1.5 + (1 << 30)
    assert float(mid) - 0.01 < need / (141 << 30) <= float(mid)
    assert share("--sglang-mem-fraction-static", "0.3") == "0.3"                      # the user's
    assert share(gpus=GpuCount(1, "test")) == "0.4"                                  # GPU memory unknown
    cfg, _, plan = placed(h200, "--hf-checkpoint", str(tmp_path), "--rollout-engine", "sglang")  # no config.json
    assert plan.mem_fraction == "0.4" and model_memory(cfg) is None


def test_the_engines_share_follows_the_longest_prompt_in_the_data(tmp_path):
    """Without --rollout-max-prompt-len the KV cache is sized for the longest prompt the launcher read in the job's
    prompt files (the bytes of its text, plus TEMPLATE_TOKENS for a chat template), not a 1024-token guess: short
    prompts leave the GPU's memory to the trainer, long ones get the cache they need. --rollout-max-prompt-len
    wins; a plan that read no data keeps the guess."""
    import json

    from slime_actors.launch.job_config import plan_job
    from slime_actors.launch.placement import PROMPT_TOKENS_GUESS, TEMPLATE_TOKENS, prompt_tokens_bound
    from slime_actors.rows import text_bytes
    model = smollm2_shaped(tmp_path / "model")
    h200 = GpuCount(1, "test", memory_bytes=141 << 30)

    def plan(prompt: str, *flags, data=True):
        f = tmp_path / f"p{len(prompt)}.jsonl"
        f.write_text(json.dumps({"input": prompt, "label": "1"}) + "\n" + json.dumps({"input": "1 2 first =",
                                                                                      "label": "1"}) + "\n")
        p = plan_job(["--config", DIGITS, "--device", "cuda", "--hf-checkpoint", str(model), "--rollout-engine",
                      "sglang", "--prompt-data", str(f), "--rollout-concurrency", "512", *flags], place=True,
                     data=data, gpus=h200)
        return p.cfg, p.gpus.mem_fraction
    short = "\u00e9" * 100 + " first ="                     # 100 two-byte letters: 208 bytes
    assert text_bytes(short) == 208 and text_bytes([{"role": "user", "content": short}]) == 212
    # a lone surrogate (JSON's "\\ud800" decodes to one) is counted, not a UnicodeEncodeError in the head's check
    assert text_bytes([{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]) == 4 + 4 + 3
    cfg, small = plan(short)
    assert cfg.prompt_bytes_max == 208 and prompt_tokens_bound(cfg) == 208 + TEMPLATE_TOKENS
    cfg, large = plan("x " * 10000)
    assert cfg.prompt_bytes_max == 20000 and float(large) > float(small)
    cfg, given = plan("x " * 10000, "--rollout-max-prompt-len", "64")
    assert prompt_tokens_bound(cfg) == 64 and float(given) < float(large)
    cfg, _ = plan(short, data=False)
    assert cfg.prompt_bytes_max is None and prompt_tokens_bound(cfg) == PROMPT_TOKENS_GUESS
