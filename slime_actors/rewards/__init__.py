"""Rewards: built-in rules (math, boxed, exact_match, f1, ...), a remote reward model, user functions.

    from slime_actors.rewards import compute_reward, compute_group_rewards, score_batch, RewardError
    r = await compute_reward(args, sample)                       # float, or RewardError (sample untouched)
    rs = await compute_group_rewards(args, group)                # list[float]
    rewards, errors = await score_batch(args, samples, concurrency=64)
    math_reward(response, label)                                 # the final answer, graded (rules.py)

See `slime_actors.rewards.dispatch` for how the function is chosen and how failures are reported.
"""

from slime_actors.rewards.answers import Answer, extract_answer
from slime_actors.rewards.dispatch import (BUILTIN_RMS, RewardConfigError, RewardError, check_reward_args,
                                           compute_group_rewards, compute_reward, register_reward, score_batch,
                                           score_samples, to_reward)
from slime_actors.rewards.grading import GradingError, grading_pool, grading_stats
from slime_actors.rewards.remote import RemoteRMConfig, RemoteRMError, close_sessions, post_reward, remote_rm
from slime_actors.rewards.rules import (Grade, agrade_math, boxed_only_math_reward, boxed_reward, dapo_reward,
                                        exact_match_reward, extract_boxed, f1_reward, grade_math, math_reward,
                                        normalize_boxed)

__all__ = ["BUILTIN_RMS", "RewardConfigError", "RewardError", "check_reward_args", "compute_group_rewards",
           "compute_reward", "register_reward", "score_batch", "score_samples", "to_reward",
           "RemoteRMConfig", "RemoteRMError",
           "close_sessions", "post_reward", "remote_rm", "boxed_reward", "exact_match_reward", "extract_boxed",
           "f1_reward", "math_reward", "normalize_boxed", "Answer", "extract_answer", "GradingError", "grading_pool",
           "grading_stats", "Grade", "agrade_math", "boxed_only_math_reward", "dapo_reward", "grade_math"]
