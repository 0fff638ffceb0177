"""What the head prints when a job ends: steps and time, every rollback (a training group restarted from a
checkpoint: how many steps were trained again), held-out reward before and after (and which reward graded it), the
last rollout's best and worst sample, where the checkpoint, metrics, curves and traces are."""

from __future__ import annotations

from pathlib import Path


def print_summary(result: dict, run_dir: Path) -> None:
    print("")
    print(f"done: {result['steps']} steps in {result['seconds']} s, weight version {result['weight_version']}")
    if result.get("started_from"):
        sf = result["started_from"]
        print(f"resumed: from {sf['checkpoint']} (rollout {sf['rollout']})" + (
            f"; {sf['retrained']} rollout(s) the previous attempt trained after it are trained again"
            if sf.get("retrained") else ""))
    for line in rollback_lines(result.get("recoveries") or []):
        print(line)
    for name in sorted(set(result.get("eval_before", {})) | set(result.get("eval_after", {}))):
        b = result.get("eval_before", {}).get(name)
        a = result.get("eval_after", {}).get(name)
        delta = f"{a - b:+.3f}" if a is not None and b is not None else "?"
        grader = result.get("eval_graders", {}).get(name)
        print(f"held-out reward [{name}]: before {b if b is None else f'{b:.3f}'} -> after "
              f"{a if a is None else f'{a:.3f}'} ({delta})" + (f"   graded by {grader}" if grader else ""))
    if result.get("samples"):
        from ..samples import format_examples
        last = result["samples"]
        print(format_examples(last["rollout_id"], last["examples"], kind="last rollout"))
    if result.get("stopped"):
        st = result["stopped"]
        print(f"stopped early after rollout {st['rollout_id']} ({st['steps_left']} steps left): {st['reason']}")
        print(f"checkpoint: {st['checkpoint']}   (resume with --load; read the samples first: "
              f"slime-actors samples {run_dir} --rollout {st['rollout_id']})")
    from ..monitor.alarms import ALARMS_FILE
    alarms = run_dir / ALARMS_FILE
    if alarms.exists() and alarms.stat().st_size:
        n = sum(1 for line in alarms.read_text().splitlines() if line.strip())
        print(f"alarms:  {alarms}   ({n} reward-hacking alarm(s) tripped; docs/debugging.md section 3)")
    if result.get("checkpoint"):
        ck = Path(result["checkpoint"])
        print(f"checkpoint: {ck}" + (f"   (rolling: the newest only; slime-actors convert {ck.parent} OUT_DIR gives "
                                     "a Hugging Face directory)" if result.get("rolling_checkpoint") else ""))
    print(f"metrics: {result['metrics']}")
    if result.get("plot"):
        print(f"curves:  {result['plot']}")
    print(f"traces:  {run_dir / 'traces'}   (slime-actors trace summary {run_dir})")


def rollback_lines(recoveries: list[dict]) -> list[str]:
    """One line per training-group restart: where it failed, the checkpoint it went back to, the steps trained
    again."""
    out = []
    for rec in recoveries:
        failed, back = rec.get("failed_at_rollout"), rec.get("resumed_from")
        again = len((rec.get("buffer") or {}).get("trained_rollouts_discarded") or [])
        lost = f"{failed - back} step(s) redone" if isinstance(failed, int) and isinstance(back, int) else "?"
        src = Path(rec["checkpoint"]).name if rec.get("checkpoint") else "the initial weights (no checkpoint)"
        out.append(f"rolled back: at rollout {failed}, the training group restarted from {src} (rollout {back}): "
                   f"{lost}, {again} trained rollout(s) discarded and trained again -- {rec.get('reason', '')}"[:400])
    return out
