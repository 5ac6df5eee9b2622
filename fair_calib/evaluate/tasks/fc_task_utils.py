"""Functions referenced by the offline task YAMLs (copied next to the rendered YAMLs).

Self-contained on purpose: lm-eval's own ``truthfulqa/utils.py`` imports sacrebleu/rouge at
import time and ``humaneval/utils.py`` downloads HF ``evaluate``'s ``code_eval`` from the hub.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from lm_eval.api.samplers import ContextSampler


def process_results_mc2(doc, results):
    """TruthfulQA MC2: normalised probability mass on the true answers (as lm-eval)."""
    ll, _ = zip(*results)
    probs = np.exp(np.array(ll, dtype=np.float64) - max(ll))  # shift: same ratios, no underflow
    probs_norm = probs / probs.sum()
    labels = np.array(doc["mc2_targets"]["labels"])
    return {"acc": float(probs_norm[labels == 1].sum())}


def build_predictions(resps, docs):
    """HumanEval: the program is the prompt followed by the completion (as lm-eval)."""
    return [[doc["prompt"] + r for r in resp] for resp, doc in zip(resps, docs)]


def _run_program(program: str, timeout: float) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "prog.py")
        with open(path, "w") as fh:
            fh.write(program)
        try:
            proc = subprocess.run([sys.executable, path], cwd=tmp, capture_output=True,
                                  timeout=timeout, env={"PATH": os.environ.get("PATH", "")})
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0


class NoFewshotPool(ContextSampler):
    """Few-shot sampler of offline tasks whose data copy has no `train` split (lm-eval's pool):
    lm-eval would otherwise fall back to drawing examples from the evaluation split itself."""

    def sample(self, n, eval_doc=None, df=None, **kwargs):
        raise ValueError(
            f"{n}-shot needs lm-eval's few-shot pool, the `train` split, which the offline data "
            f"copy (data_dir / FAIR_CALIB_DATA_DIR) does not have; use lm-eval's own task "
            f"(data_source: hub, or no --include_path) or 0-shot")


def pass_at_k(references, predictions, k=None, timeout: float = 10.0):
    """``{"pass@1": ...}`` as lm-eval's humaneval task reports it (its ``pass_at_k`` returns HF
    ``code_eval``'s dict, whose keys become the metric names): one greedy sample per problem,
    passed when the program plus its tests exits with 0.

    Runs model-written code in a subprocess (fresh interpreter, temporary cwd, timeout); only
    allowed when HF_ALLOW_CODE_EVAL=1, which ``fair_calib.evaluate.run`` sets for an opted-in
    job alone.
    """
    if os.environ.get("HF_ALLOW_CODE_EVAL") != "1":
        raise PermissionError("HumanEval executes model-written code; it runs only with "
                              "task.allow_code_execution: true (which sets HF_ALLOW_CODE_EVAL=1)")
    if sorted(set(k if isinstance(k, (list, tuple)) else [k or 1])) != [1]:
        raise ValueError(f"only pass@1 is computed (one sample per problem), got k={k}")
    passed = []
    for ref, preds in zip(references, predictions):
        pred = preds[0] if isinstance(preds, (list, tuple)) else preds
        passed.append(float(_run_program(pred + "\n\n" + ref + "\n", timeout)))
    return {"pass@1": float(np.mean(passed)) if passed else 0.0}
