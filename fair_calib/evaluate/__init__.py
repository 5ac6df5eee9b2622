"""Benchmark evaluation through lm-eval.

``lm``            the lm-eval model class ``fair_calib_dlm`` (MC masked likelihoods, decoding)
``offline_data``  readers/converters for the local data copies and the offline task YAMLs
``run``           the ``fair-calib evaluate`` stage: ``evaluate``, ``gather``, ``run_cli``
"""
