"""Side by side: our GRPO job against TRL's GRPOTrainer on the same job (docs/peer-comparison.md).

    bash scripts/compare_trl.sh [flags]        # the entry point: runs both, writes the report

Modules, one job each:
    run.py       the driver: data, model, each framework's run with the utilisation sampler, then the report
    trl_job.py   the TRL side (runs under the Python that has trl): GRPOTrainer, held-out callback, step timings
    sampler.py   GPU utilisation and memory every 0.5 s (NVML, else nvidia-smi; no GPU: host CPU and memory)
    split.py     where one of our steps goes, from the run's traces and metrics
    report.py    reads the runs back: the tables, the plots, report.md and summary.json
    ab.py        scripts/speed_gpu_ab.sh's runs of two trees (ours only) in one table, a column per run
"""
