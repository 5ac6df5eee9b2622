"""Masked-diffusion decoding: commit policies, batched generation, trajectory recording."""
from fair_calib.decoding.early_exit import StopRule
from fair_calib.decoding.generate import (Decoded, decode, generate, model_context, pad_left, uniform,
                                         window_logits)
from fair_calib.decoding import policies
from fair_calib.decoding.policies import (BLOCK_POLICIES, POLICIES, RANDOM_COMMIT_POLICIES,
                                          SCHEDULE_POLICIES, DecodePolicy, block_commit_counts, make_policy,
                                        schedule_commit_count)
from fair_calib.decoding.trajectory import (TRAJECTORY_SCHEMA, CommitRecorder, TrajectoryRecorder,
                                            record_trajectory, step_stats, teacher_force)

__all__ = [
    "Decoded", "StopRule", "decode", "generate", "model_context", "pad_left", "uniform", "window_logits",
    "policies", "POLICIES", "BLOCK_POLICIES", "RANDOM_COMMIT_POLICIES", "SCHEDULE_POLICIES", "DecodePolicy",
    "block_commit_counts", "make_policy", "schedule_commit_count",
    "TRAJECTORY_SCHEMA", "CommitRecorder", "TrajectoryRecorder", "record_trajectory",
    "step_stats", "teacher_force",
]
