"""Benchmark evaluation through lm-eval.

``likelihood``     the model authors' masked likelihood estimators (LLaDA, Dream) and exact mode
``lm``             the lm-eval model class ``fair_calib_dlm`` (likelihoods, diffusion decoding)
``offline_data``   readers/converters for the local data copies and the offline task YAMLs
``task_settings``  a task's settings per model family and model (``by_family``, ``by_model``)
``run``            the ``fair-calib evaluate`` stage: ``evaluate``, ``gather``, ``run_cli``
"""
