"""How the evaluation turns lm-eval's requests into token ids and batches (no model needed).

:class:`RequestEncoding` is the part of the evaluator's lm-eval model
(:class:`fair_calib.evaluate.lm.DiffusionLM`) that reads only the tokenizer and the settings:
a likelihood request's ``(context, continuation)`` becomes ``(prefix ids, scored target ids)``
(BOS text, whitespace moved to the continuation, Dream's appended EOS, the model's context),
a generation request's context becomes its prompt ids (an Instruct model's chat template,
lm-eval's rendered chat turns, ``max_prompt_len``, room for the window), and prompts are
batched longest first. The evaluator and the census (:mod:`fair_calib.budget.census`) both use it,
so the census counts the ids the model receives.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence


def continue_final_message(rendered: str, final_message: Mapping[str, Any]) -> str:
    """The chat text ``rendered`` (closed, no generation prompt) cut to continue its last
    turn as transformers 4.46.2's ``apply_chat_template(continue_final_message=True)`` cuts it,
    the version Dream's README pins for its evaluation: the turn's content is stripped, the
    text ends where that stripped content last occurs, and trailing whitespace goes. Dream's
    HumanEval ``gen_prefix`` (the prompt, then a newline) thus ends at the prompt's closing
    docstring quotes; transformers 5 keeps the content as written, newlines included."""
    content = final_message["content"]
    if isinstance(content, (list, tuple)):       # a multimodal turn: its last part's text
        content = content[-1]["text"]
    content = content.strip()
    end = rendered.rfind(content)
    if end < 0:
        raise ValueError("continue_final_message: the chat template does not render the final "
                         "message's content, so it cannot be continued")
    return rendered[:end + len(content)].rstrip()


def decoding_policy(adapter, overrides: Mapping[str, Any] | None = None):
    """The policy ``generate_until`` decodes with: the family adapter's default ``decoding``
    with ``overrides`` over it (None values left out). Validated here, so a caller can refuse
    bad settings before the model loads."""
    from fair_calib.decoding import make_policy  # lazy: decoding is only for generation
    from fair_calib.decoding.policies import BLOCK_POLICIES

    overrides = {k: v for k, v in dict(overrides or {}).items() if v is not None}
    name = overrides.get("policy", overrides.get("name", adapter.decoding.get("policy")))
    # A task's block_length is for families that decode in blocks (LLaDA); one task entry
    # serves every family, so a whole-window policy (Dream's) ignores it unless the task
    # also names that policy explicitly.
    if name not in BLOCK_POLICIES and "policy" not in overrides and "name" not in overrides:
        overrides.pop("block_length", None)
    return make_policy(adapter.decoding, overrides)


class RequestEncoding:
    """Token ids of lm-eval requests as the evaluator's model forms them. Set up by
    :meth:`init_encoding`; needs ``tokenizer`` (a transformers tokenizer, or anything with its
    ``__call__``, ``bos_token``, ``eos_token`` and ``apply_chat_template``)."""

    def init_encoding(self, tokenizer: Any, adapter: Any, lik: Any, eos_id: int | None,
                      max_length: int, *, instruct: bool = False, add_bos_token: bool = False,
                      chat_by_lm_eval: bool = False, chat_add_special_tokens: bool = False,
                      max_prompt_len: int | None = None,
                      decoding: Mapping[str, Any] | None = None,
                      gen_batch_size: int | None = None) -> None:
        from fair_calib.evaluate.likelihood import _bool

        self.tokenizer = tokenizer
        self.adapter = adapter
        self.lik = lik
        self.eos_id = None if eos_id is None else int(eos_id)
        self.max_length = int(max_length)
        self.instruct = _bool(instruct)
        self.add_bos_token = _bool(add_bos_token)
        self.chat_by_lm_eval = _bool(chat_by_lm_eval)
        self.chat_add_special_tokens = _bool(chat_add_special_tokens)
        self.max_prompt_len = None if max_prompt_len in (None, "") else int(max_prompt_len)
        self.decoding_overrides = {k: v for k, v in dict(decoding or {}).items() if v is not None}
        self.gen_batch_size = int(gen_batch_size or lik.batch_size)

    # ------------------------------------------------------------------ likelihood requests
    def _enc(self, text: str, special: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def _bos(self, context: str) -> str:
        """``add_bos_token`` (Dream's scripts): the BOS text goes in front of the context."""
        bos = getattr(self.tokenizer, "bos_token", None)
        return bos + context if self.add_bos_token and bos else context

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context (with the tokenizer's special prefix) and continuation ids; trailing
        whitespace of the context moves to the continuation (as lm-eval's HF model does)."""
        context = self._bos(context)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces > 0:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self._enc(context + continuation, special=True)
        ctx = self._enc(context, special=True)
        if whole[:len(ctx)] == ctx and len(whole) > len(ctx):
            return ctx, whole[len(ctx):]
        return ctx, self._enc(continuation, special=False)

    def _fit(self, prefix: list[int], target: list[int]) -> tuple[list[int], list[int]]:
        room = self.max_length - len(target)
        if room < 0:   # target alone too long: keep its tail, drop the context
            return [], target[-self.max_length:]
        return prefix[-room:] if room else [], target

    def _scored(self, target: list[int]) -> list[int]:
        """Dream's harness appends EOS to every continuation (visible, never scored)."""
        if self.lik.estimator == "dream" and self.lik.append_eos and self.eos_id is not None:
            return list(target) + [self.eos_id]
        return list(target)

    def likelihood_items(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int], int]]:
        """``(prefix, scored target, target tokens)`` of each ``(context, continuation)``:
        what :func:`fair_calib.evaluate.likelihood.score_requests` scores."""
        out = []
        for context, continuation in pairs:
            prefix, target = self.encode_pair(context, continuation)
            out.append(self._fit(prefix, self._scored(target)) + (len(target),))
        return out

    # ------------------------------------------------------------------ chat (lm-eval's API)
    @property
    def tokenizer_name(self) -> str:
        """lm-eval fingerprints its request cache with it when it applies a chat template."""
        return str(getattr(self.tokenizer, "name_or_path", "") or "").replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The tokenizer's chat template (what lm-eval records of the run); None when off."""
        if chat_template is False or chat_template is None:
            return None
        template = getattr(self.tokenizer, "chat_template", None)
        if isinstance(template, dict):
            template = template.get(chat_template if isinstance(chat_template, str) else "default")
        return template

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        """lm-eval's chat hook (``apply_chat_template`` / ``fewshot_as_multiturn`` of a task):
        the tokenizer's template over the turns, as lm-eval's HF model (and the authors'
        harnesses) render them; a history ending in an assistant turn (a task's ``gen_prefix``)
        is continued, not closed, as transformers 4.46.2 continues it
        (:func:`continue_final_message`), whatever transformers is installed."""
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(f"apply_chat_template: the tokenizer of this {self.adapter.name} "
                             f"model has no chat template; run the task without it")
        text = self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt)
        return text if add_generation_prompt else continue_final_message(text, chat_history[-1])

    # ------------------------------------------------------------------ generation requests
    def _prompt_ids(self, context: str) -> list[int]:
        """The prompt's ids: lm-eval already rendered the chat turns (``chat_by_lm_eval``; the
        text is then tokenized with the tokenizer's special prefix only where
        ``chat_add_special_tokens``, as OpenCompass's LLaDA model does), or an Instruct model's
        template over one user turn, or the plain text."""
        if self.chat_by_lm_eval:
            return self._enc(context, special=self.chat_add_special_tokens)
        if self.instruct and self.adapter.chat_template:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": context}],
                                                      add_generation_prompt=True, tokenize=False)
            return self._enc(text, special=False)
        return self._enc(self._bos(context), special=True)

    def policy(self):
        return decoding_policy(self.adapter, self.decoding_overrides)

    def check_fits(self, prompt: Sequence[int], gen_length: int, req: Any = None) -> None:
        """Refuse a prompt that does not fit the model with its generation window. The authors'
        generation harnesses cut nothing (OpenCompass's LLaDA model runs with ``max_seq_len``
        None; LLaDA's ``eval_llada.py`` and Dream's ``eval.py`` pass the prompt whole: the
        latter's cut compares the batch size, not the length), Dream ``eval_instruct`` only its
        1024-token cap (``max_prompt_len``), so a prompt is never shortened here either."""
        total = len(prompt) + int(gen_length)
        if total > self.max_length:
            where = "" if req is None else \
                f"task {getattr(req, 'task_name', None)!r}, document {getattr(req, 'doc_id', None)}: "
            raise ValueError(
                f"{where}prompt of {len(prompt)} tokens + gen_length {gen_length} = {total} tokens "
                f"exceeds the model's limit of {self.max_length} (its config's "
                f"max_position_embeddings / max_sequence_length, or max_length=); the authors' "
                f"harness does not cut this prompt, so it is refused rather than truncated")

    def generation_prompt(self, context: str, gen_length: int, req: Any = None) -> list[int]:
        """The prompt ids a generation request decodes after: never cut (but for
        ``max_prompt_len``, Dream ``eval_instruct``'s cap); one that does not fit beside the
        ``gen_length`` window is refused (:meth:`check_fits`)."""
        prompt = self._prompt_ids(context)
        if self.max_prompt_len is not None:      # eval_instruct's diffllm: ids[-1024:]
            prompt = prompt[-self.max_prompt_len:]
        self.check_fits(prompt, gen_length, req)
        return prompt


def generation_batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Indices of the prompts in decoding batches: longest prompts first (less padding per
    batch), ``batch_size`` a batch."""
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]
