"""The samples a run shows its user while it trains: which two to pick from a rollout (the buffer picks them, at
the end of each rollout, beside its state: buffer_state.py), and how they read -- on the console (the controller,
the launcher's summary) and as TensorBoard markdown (metric_sinks.py). Where held-out responses are saved (EVAL_DIR).

The `slime-actors samples` command that reads a finished run's samples back is samples.py, a floor above."""

from __future__ import annotations

import re

EVAL_DIR = "evals"


# ------------------------------------------------------------------------------------------------ picking
def pick_examples(samples: list) -> list[dict]:
    """The best and the worst sample of one group -- the group whose rewards differ most (what is rewarded
    against what is not; the lowest group index among equals) -- as display records."""
    groups: dict[int, list] = {}
    for s in samples:
        if s.reward is not None:
            groups.setdefault(s.group_index, []).append(s)
    if not groups:
        return []

    def spread(g):
        rs = [s.reward for s in groups[g]]
        return max(rs) - min(rs)
    gi = max(sorted(groups), key=spread)
    members = sorted(groups[gi], key=lambda s: (-s.reward, s.index))
    picks = [("best", members[0])] + ([("worst", members[-1])] if len(members) > 1 else [])
    return [example_record(which, s, len(members)) for which, s in picks]


def example_record(which: str, s, group_size: int | None = None) -> dict:
    return {"which": which, "index": s.index, "group_index": s.group_index, "rollout_id": s.rollout_id,
            "prompt": s.prompt if isinstance(s.prompt, str) else _messages_text(s.prompt),
            "response": s.response, "reward": s.reward, "label": s.label, "status": s.status,
            "finish_reason": s.finish_reason, "response_tokens": len(s.response_tokens),
            "group_size": group_size}


def _messages_text(prompt) -> str:
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1] if users else prompt[-1])
    return str(prompt)


# ------------------------------------------------------------------------------------------------ formatting
_SPECIAL = re.compile(r"<\|[^|>]{1,40}\|>")


def prompt_text(prompt) -> str:
    """The part of a prompt worth showing: for a chat-template prompt the last user turn, without the
    template's markers."""
    text = _messages_text(prompt)
    for marker in ("<|im_start|>user", "<|start_header_id|>user<|end_header_id|>", "[INST]"):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
            break
    for end in ("<|im_end|>", "<|eot_id|>", "[/INST]"):
        if end in text:
            text = text.split(end, 1)[0]
    return _SPECIAL.sub(" ", text).strip()


def one_line(text, width: int | None = None) -> str:
    """Whitespace runs collapsed, newlines shown as ⏎, cut to `width` characters (…)."""
    s = str(text).replace("\r", "").strip()
    s = re.sub(r"[ \t]+", " ", s).replace("\n", " ⏎ ")
    if width is not None and len(s) > width:
        s = s[: max(1, width - 1)] + "…"
    return s


def reward_text(r) -> str:
    return "  none" if r is None else f"{float(r):6.3f}"


def format_examples(rollout_id, examples: list[dict], width: int = 160, kind: str = "rollout") -> str:
    """The console block the controller prints for a rollout: a header, then one line each for the prompt and
    the response of the best and the worst sample."""
    if not examples:
        return f"{kind} {rollout_id}: no scored samples"
    g = examples[0]
    rewards = ", ".join(f"{e['which']} {float(e['reward']):.3f}" for e in examples if e.get("reward") is not None)
    lines = [f"{kind} {rollout_id} samples (group {g.get('group_index')}, {g.get('group_size') or '?'} samples; "
             f"{rewards}; label {one_line(g.get('label'), 40)!s})",
             f"  prompt   {one_line(prompt_text(g.get('prompt', '')), width)}"]
    for e in examples:
        tail = "" if e.get("finish_reason") in (None, "stop") else f" [{e.get('finish_reason')}]"
        lines.append(f"  {e['which']:<5} {reward_text(e.get('reward'))}  {one_line(e.get('response', ''), width)}{tail}")
    return "\n".join(lines)


def examples_markdown(rollout_id, examples: list[dict]) -> str:
    """The same as TensorBoard text (markdown)."""
    if not examples:
        return f"rollout {rollout_id}: no scored samples"
    rows = [f"**prompt** (group {examples[0].get('group_index')}, label `{one_line(examples[0].get('label'), 80)}`): "
            f"{markdown_cell(prompt_text(examples[0].get('prompt', '')), 600)}", ""]
    for e in examples:
        rows.append(f"**{e['which']}** (reward {reward_text(e.get('reward')).strip()}): {markdown_cell(e.get('response', ''), 1500)}")
        rows.append("")
    return "\n".join(rows)


def markdown_cell(text, width: int | None = None) -> str:
    """Text for one markdown table cell / line: pipes escaped, newlines as <br>."""
    s = str(text).replace("\r", "").strip()
    if width is not None and len(s) > width:
        s = s[: width - 1] + "…"
    return s.replace("|", "\\|").replace("\n", "<br>")
