"""lm-eval model class for masked diffusion LMs (FP or fake-quantized).

Likelihoods are the model authors' Monte-Carlo masked estimates, chosen by the family adapter's
``likelihood["estimator"]`` (never by family name):

``llada``  stratified mask counts. Per iteration, ``[context | target]`` is repeated ``b`` times;
           ``k`` is drawn in ``1..L`` and row ``i`` gets ``x_i = round(linspace(k, k + (b-1) L/b,
           b))_i``, wrapped into ``1..L``; exactly ``x_i`` target tokens (never the prompt) are
           masked at random. Loss = ``sum CE(masked) / (x_i / L)`` averaged over rows, then over
           ``mc_num // b`` iterations; log-likelihood = ``-loss``. Optional classifier-free
           guidance (``cfg_scale``): the unconditional pass masks the prompt too and
           ``logits = un + (cfg + 1)(cond - un)``.
``dream``  as DreamLM/Dream ``eval/eval.py``: EOS is appended to the continuation; per
           iteration ``t_i = (u0 + i/b) mod 1`` across the ``b`` rows, one uniform per position
           of the whole sequence masks it with ``p = (1-eps) t + eps``, but the prompt, the
           sequence's first position and its last (the EOS) are never masked, so EOS is
           visible and never scored; loss = ``sum CE(masked) / p`` averaged over rows and
           iterations.

``b`` (rows per forward) is lm-eval's ``--batch_size`` as in both authors' harnesses (8 in
LLaDA's script, 32 in Dream's): the mask-count distribution, hence the expected value, depends
on it. ``exact_below=N``: a target with fewer than ``N`` maskable tokens is scored by the exact
expectation over all its mask patterns (weighted by the estimator's own distribution for ``b``
rows), no sampling; identical noisy inputs are run once, so a question's single-token choices
share one forward.

Both are unbiased estimates of the same ELBO bound on ``log p(target | context)``. The random
draws of one request come from a generator seeded by ``(seed, context tokens, target tokens)``,
so a request scores identically whatever its batch, order or shard.

``is_greedy``: True when the argmax of ONE forward pass with the whole continuation masked
reproduces every continuation token (a cheap, deterministic proxy; a diffusion LM has no
left-to-right greedy decode to compare against). It costs one extra forward per request, so it
is skipped (reported False) when ``compute_greedy=False`` -- ``run.evaluate`` does that when all
tasks are multiple choice, where lm-eval never reads it.

From the shell: ``python -m fair_calib.cli.lm_eval_cli --model fair_calib_dlm --model_args
pretrained=DIR,calib_dir=DIR,mc_num=128 --tasks piqa --batch_size 8`` (lm-eval's own CLI with
this model registered; lm-eval 0.4.13 registers models on import only).

``generate_until`` runs the project decoder (``fair_calib.decoding.generate``) with the family's
default policy (adapter ``decoding``) merged with per-task overrides (``gen_length``, ``steps``,
``block_length``, ...). A diffusion LM decodes a fixed window, so the window length is the
policy's ``gen_length``, not lm-eval's ``max_gen_toks``. A prompt is never shortened (but for a
task's ``max_prompt_len``, Dream ``eval_instruct``'s cap): one that does not fit beside the window
in the model's context is refused, naming the task, document and lengths (:meth:`check_fits`).
Output is cut at the first EOS/pad token and then at the earliest ``until`` string; with ``escape_until`` (Dream's HumanEval) the text is
Dream's ``eval.py``'s, cut at the first EOS only. Instruct models get the tokenizer's chat
template. ``early_exit`` (default on) stops a row once that cut output is final
(``fair_calib.decoding.early_exit``; the outputs are those of the full run); ``decode_steps``
holds, per ``(task, doc_id)``, the decoding steps run and those a full run takes.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from fair_calib.evaluate.requests import (  # noqa: F401  (re-exported)
    RequestEncoding, continue_final_message, decoding_policy, generation_batches)
from fair_calib.models.adapters import LoadedModel

from fair_calib.evaluate.likelihood import (  # noqa: F401  (re-exported)
    LIKELIHOOD_ESTIMATORS, SETTING_KEYS, LikelihoodSettings, _bool, _logits, dream_iteration_losses,
    exact_loglikelihoods, greedy_match, likelihood_settings, llada_iteration_losses,
    mc_loglikelihood, request_generator, score_requests, use_exact)


def _model_max_length(loaded: LoadedModel) -> int:
    cfg = getattr(loaded.model, "config", None)
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions"):
        val = getattr(cfg, key, None)
        if isinstance(val, int) and val > 0:
            return val
    return 4096


DECODING_KEYS = ("policy", "steps", "gen_length", "block_length", "temperature", "alg_temp",
                 "top_p", "top_k", "logits_eos_inf", "confidence_eos_eot_inf")
BOOL_DECODING_KEYS = ("logits_eos_inf", "confidence_eos_eot_inf")   # "true" from --model_args


def _hub_config_file(repo_id: str):
    """A hub checkpoint's config.json (from the local cache, else the hub), or None."""
    from pathlib import Path

    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id, "config.json"))
    except Exception:  # offline and not cached, or no such repository: the caller says so
        return None


def infer_family(source: str, calib_dir: str | None = None) -> str:
    """The adapter of a checkpoint when ``family=`` is not given: the embedded model's
    ``fair_calib.json``, an adapter's hub id, or the checkpoint config's ``model_type``."""
    import json
    from pathlib import Path

    from fair_calib.models.adapters import ADAPTERS

    meta = Path(source) / "fair_calib.json"
    if meta.is_file():
        return json.loads(meta.read_text())["family"]
    for name, adapter in ADAPTERS.items():
        if source in adapter.hub_ids:
            return name
    cfg = Path(source) / "config.json"
    if not cfg.is_file() and source.count("/") == 1 and not Path(source).exists():
        cfg = _hub_config_file(source) or cfg           # a hub id: its config.json
    model_type = json.loads(cfg.read_text()).get("model_type", "") if cfg.is_file() else ""
    if model_type.lower() in ADAPTERS:
        return model_type.lower()
    raise ValueError(f"cannot tell the model family of {source!r}; pass family=<one of "
                     f"{sorted(ADAPTERS)}> in --model_args")


class CalibrationMismatchError(ValueError):
    """A ``calib_dir`` made for another model than the checkpoint it is applied to."""


def calibrated_model(calib_dir: str) -> dict[str, Any]:
    """What a calibration's ``meta.json`` says of the model it was made on: ``name``,
    ``family``, ``model_dir`` (empty where an older meta.json does not say)."""
    from pathlib import Path

    from fair_calib.jobs import io

    meta = io.read_json(Path(calib_dir) / "meta.json")
    run = (meta.get("provenance") or {}).get("config") or {}
    model = (run.get("settings") or {}).get("model") or {}
    return {"name": model.get("name"), "family": model.get("family"),
            "model_dir": run.get("model_dir")}


def _same_checkpoint(a: str, b: str) -> bool | None:
    """Whether two model sources are one checkpoint; None where this machine cannot tell (a
    folder recorded on another machine)."""
    from pathlib import Path

    if Path(a).exists() and Path(b).exists():
        return Path(a).resolve() == Path(b).resolve()
    if not Path(a).exists() and not Path(b).exists() and a.count("/") == 1 == b.count("/"):
        return a == b                                   # two hub ids
    return None


def check_calibration_pairing(calib_dir: str, source: str, family: str) -> None:
    """Refuse a calibration made on another model (its meta.json names it): a calibration of
    tiny-dream applied to tiny-llada runs, and reports a meaningless accuracy."""
    from pathlib import Path

    if not Path(calib_dir).is_dir():       # before the model loads (minutes for 8B weights)
        raise FileNotFoundError(f"calib_dir {calib_dir} does not exist: calibrate first "
                                f"(snakemake {calib_dir}/meta.json), or pass an existing one")
    if not (Path(calib_dir) / "meta.json").is_file():
        return  # load_quantized names the missing file
    from fair_calib.jobs.model_identity import (CalibrationOfOtherWeightsError,
                                                check_calibration_content)

    try:
        check_calibration_content(calib_dir, source)
    except CalibrationOfOtherWeightsError as err:
        raise CalibrationMismatchError(str(err)) from None
    made = calibrated_model(calib_dir)
    same = _same_checkpoint(made["model_dir"], source) if made["model_dir"] else None
    if (made["family"] and made["family"] != family) or same is False:
        raise CalibrationMismatchError(
            f"calib_dir={calib_dir} was calibrated on model {made['name']!r} "
            f"({made['model_dir']}, family {made['family']}), not on pretrained={source} "
            f"(family {family}); pass the calibration made for this model "
            "(results/calib/<model>/<method>/<bits>)")


def _device(device: str | None) -> str:
    """lm-eval's CLI defaults to ``cuda``; like its HF model, use the CPU where CUDA is absent."""
    if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device)


def _rows(batch_size: Any) -> int | None:
    """lm-eval's ``--batch_size`` is the rows per forward; ``auto`` has no meaning here."""
    if batch_size is None:
        return None
    if isinstance(batch_size, str) and not batch_size.strip().isdigit():
        raise ValueError(f"batch_size {batch_size!r}: pass an integer (the rows per forward, "
                         f"8 in LLaDA's scripts, 32 in Dream's)")
    return int(batch_size)


@register_model("fair_calib_dlm")
class DiffusionLM(RequestEncoding, LM):
    # called with (request index, completion) as each generation finishes (fair-calib generate)
    on_generated = None
    """lm-eval wrapper of a :class:`LoadedModel` (FP, or fake-quantized via ``calib_dir``).

    Build it from a loaded model (``DiffusionLM(loaded, ...)``) or from keyword arguments as
    lm-eval does (``create_from_arg_obj`` / ``create_from_arg_string`` pass ``--model_args``
    plus ``batch_size``, ``max_batch_size`` and ``device`` straight to this constructor):
    ``pretrained`` (or ``model_dir``), optional ``family`` (else inferred), ``loader``
    (``native`` by default, ``remote``: the authors' modeling files), ``calib_dir``, and
    flat likelihood (``mc_num``, ``cfg``, ``exact_below``, ...) and decoding (``steps``,
    ``gen_length``, ...) settings. ``batch_size`` is the likelihood estimator's rows per
    forward, as in the authors' harnesses. ``early_exit=false`` decodes every row for every
    step (the outputs are the same; for checking).
    """

    def __init__(self, loaded: LoadedModel | None = None, *, model_dir: str | None = None,
                 pretrained: str | None = None, family: str | None = None,
                 dtype: str = "float32", device: str | None = None,
                 calib_dir: str | None = None, instruct: bool = False, seed: int = 0,
                 likelihood: Mapping[str, Any] | None = None,
                 decoding: Mapping[str, Any] | None = None,
                 gen_batch_size: int | None = None, max_length: int | None = None,
                 compute_greedy: bool = True, add_bos_token: bool = False,
                 batch_size: int | str | None = None, max_batch_size: int | None = None,
                 loader: str | None = None, escape_until: bool = False,
                 early_exit: bool | str = True, whole_window: bool | str = False,
                 chat_by_lm_eval: bool | str = False,
                 chat_add_special_tokens: bool | str = False, eos_split_until: bool | str = False,
                 max_prompt_len: int | None = None, **flat: Any) -> None:
        super().__init__()
        likelihood, decoding = self._split_flat(flat, likelihood, decoding, batch_size)
        if loaded is None:
            source = model_dir or pretrained
            if source is not None:      # bad likelihood settings fail before the model loads
                from fair_calib.models.adapters import get_adapter
                family = family or infer_family(str(source), calib_dir)
                likelihood_settings(get_adapter(family).likelihood, likelihood)
            loaded = self._load(source, family, dtype, _device(device), calib_dir, loader)
        elif calib_dir is not None:
            from fair_calib.methods import load_quantized  # lazy: only for quantized runs

            loaded = load_quantized(loaded, calib_dir)
        self.loaded = loaded
        loaded.replay_graphs()        # the model is final: repeated forwards replay on CUDA
        self.init_encoding(loaded.tokenizer, loaded.adapter,
                           likelihood_settings(loaded.adapter.likelihood, likelihood),
                           loaded.eos_id, int(max_length or _model_max_length(loaded)),
                           instruct=instruct, add_bos_token=add_bos_token,
                           chat_by_lm_eval=chat_by_lm_eval,
                           chat_add_special_tokens=chat_add_special_tokens,
                           max_prompt_len=max_prompt_len, decoding=decoding,
                           gen_batch_size=gen_batch_size)
        self.escape_until = _bool(escape_until)
        self.whole_window = _bool(whole_window)
        self.eos_split_until = _bool(eos_split_until)
        self.seed = int(seed)
        # is_greedy costs one extra forward per request; multiple-choice tasks never read it.
        self.compute_greedy = _bool(compute_greedy)
        self.early_exit = _bool(early_exit)
        # (task, doc_id) -> [steps run, steps of a full run], summed over the doc's requests
        self.decode_steps: dict[tuple[str | None, int | None], list[int]] = {}
        self.stop_ids = {i for i in (loaded.eos_id, getattr(self.tokenizer, "eos_token_id", None))
                         if i is not None}
        if loaded.pad_id is not None and loaded.pad_id != loaded.mask_id:
            self.stop_ids.add(int(loaded.pad_id))

    @staticmethod
    def _split_flat(flat: dict, likelihood, decoding, batch_size):
        """Route flat ``--model_args`` keys to the likelihood and decoding settings."""
        likelihood, decoding = dict(likelihood or {}), dict(decoding or {})
        for key, val in flat.items():
            if key in SETTING_KEYS or key == "cfg":
                likelihood[key] = val
            elif key in DECODING_KEYS:
                decoding[key] = _bool(val) if key in BOOL_DECODING_KEYS else val
            else:
                raise TypeError(f"fair_calib_dlm: unknown argument {key!r}; likelihood keys "
                                f"{sorted(SETTING_KEYS)}, decoding keys {sorted(DECODING_KEYS)}")
        rows = _rows(batch_size)
        if rows is not None:
            likelihood["batch_size"] = rows
        return likelihood, decoding

    @staticmethod
    def _load(source, family, dtype, device, calib_dir, loader=None) -> LoadedModel:
        if source is None:
            raise ValueError("DiffusionLM needs a LoadedModel or pretrained=<hub id or folder>")
        from fair_calib.models.adapters import load_model

        family = family or infer_family(str(source), calib_dir)
        if calib_dir is not None:
            check_calibration_pairing(calib_dir, str(source), family)
        loaded = load_model(source, family, dtype=dtype, device=device, loader=loader)
        if calib_dir is not None:
            from fair_calib.methods import load_quantized  # lazy: only for quantized runs

            loaded = load_quantized(loaded, calib_dir)
        return loaded

    def _greedy(self, prefix: list[int], scored: list[int], n_target: int) -> bool:
        return self.compute_greedy and greedy_match(self.loaded, prefix, scored[:n_target],
                                                    self.lik.cfg_scale)

    def score_pairs(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Log-likelihoods of ``(prefix, target)`` id pairs: exact (batched, identical noisy
        inputs run once) where ``exact_below`` allows, else the seeded MC estimate."""
        items = [self._fit(p, self._scored(t)) + (len(t),) for p, t in pairs]
        values = score_requests(self.loaded, [(p, s) for p, s, _ in items], self.lik, self.seed)
        from fair_calib.models.finite import check_finite_scores

        check_finite_scores(values, "evaluation")
        return [(v, self._greedy(p, s, min(n, len(s)))) for v, (p, s, n) in zip(values, items)]

    # ------------------------------------------------------------------ lm-eval API
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self.score_pairs([self.encode_pair(r.args[0], r.args[1]) for r in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The same estimator over the whole text: the text is cut into disjoint windows of
        ``max_length`` tokens (no shared context) whose estimates are summed. None of the
        configured tasks (the ten benchmarks, synth_mc, synth_gen) uses it."""
        out = []
        for req in requests:
            text = req.args[0]
            special = self._enc("", special=True)         # e.g. [BOS], the only context
            ids = self._enc(text, special=False)
            width = max(self.max_length - len(special), 1)
            total = 0.0
            for start in range(0, len(ids), width):
                chunk = ids[start:start + width]
                gen = request_generator(self.seed, "rolling", special, chunk)
                if self.lik.estimator == "dream" and self.lik.append_eos and \
                        self.loaded.eos_id is not None and start + width >= len(ids):
                    chunk = chunk + [int(self.loaded.eos_id)]
                ll, _ = mc_loglikelihood(self.loaded, special, chunk, self.lik, gen)
                total += ll
            out.append(total)
        from fair_calib.models.finite import check_finite_scores

        check_finite_scores(out, "evaluation (rolling)")
        return out

    def postprocess(self, ids: Sequence[int], until: Sequence[str]) -> str:
        """Cut at the first EOS/pad token, decode, then cut at the earliest ``until`` string.
        ``escape_until`` (Dream's ``eval/eval.py`` argument): the text is Dream's, the whole
        window decoded and cut at the first EOS text, and ``until`` is not applied.
        ``whole_window`` (OpenCompass's LLaDA model): the whole window decoded with the special
        tokens skipped, nothing cut. ``eos_split_until`` (Dream ``eval_instruct``'s ``diffllm``):
        Dream's text (as ``escape_until``), then cut at each ``until`` string in turn."""
        if self.whole_window:
            return self.tokenizer.decode(list(ids), skip_special_tokens=True)
        if self.escape_until or self.eos_split_until:
            text = self.tokenizer.decode(list(ids)).split(self.tokenizer.eos_token)[0]
            if self.escape_until:
                return text
            for stop in until:             # eval_instruct's diffllm: r = r.split(s)[0] in turn
                text = text.split(stop)[0]
            return text
        ids = list(ids)
        for i, tok in enumerate(ids):
            if tok in self.stop_ids:
                ids = ids[:i]
                break
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = len(text)
        for stop in until:
            if stop:
                j = text.find(stop)
                if j != -1:
                    cut = min(cut, j)
        return text[:cut]

    def stop_rule(self, untils: Sequence[Sequence[str]]):
        """What ends each row's output: the stop tokens and strings :meth:`postprocess` cuts at
        (with ``escape_until``: the EOS token alone, whose text the output is split at)."""
        from fair_calib.decoding import StopRule

        if self.escape_until or self.eos_split_until:
            # the text before the first EOS is final once it is committed and all before it;
            # the stop strings are cut from that final text
            eos = getattr(self.tokenizer, "eos_token_id", None)
            return StopRule(frozenset() if eos is None else frozenset({int(eos)}))
        return StopRule(frozenset(self.stop_ids), [list(u) for u in untils],
                        lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True))

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from fair_calib.decoding import decode

        policy = self.policy()
        prompts, untils = [], []
        for req in requests:
            context, gen_kwargs = req.args[0], dict(req.args[1] or {})
            until = gen_kwargs.get("until") or []
            if isinstance(until, str):
                until = [until]
            prompts.append(self.generation_prompt(context, policy.gen_length, req))
            untils.append(list(until))
        results: list[str] = [""] * len(prompts)
        for idx in generation_batches(prompts, self.gen_batch_size):
            gens = [request_generator(self.seed, "gen", prompts[i]) for i in idx]
            if self.loaded.device.type != "cpu":   # generate() draws on the model's device
                gens = [torch.Generator(device=self.loaded.device).manual_seed(g.initial_seed())
                        for g in gens]
            # whole_window keeps text after an EOS: no row is final before the last step
            stop = self.stop_rule([untils[i] for i in idx]) \
                if self.early_exit and not self.whole_window else None
            out = decode(self.loaded, [prompts[i] for i in idx], policy, gens, stop=stop)
            for row, i in enumerate(idx):
                results[i] = self.postprocess(out.tokens[row].tolist(), untils[i])
                if self.on_generated is not None:     # `fair-calib generate` prints it now
                    self.on_generated(i, results[i])
                req = requests[i]
                steps = self.decode_steps.setdefault((req.task_name, req.doc_id), [0, 0])
                steps[0] += out.steps[row]
                steps[1] += policy.steps
        return results
