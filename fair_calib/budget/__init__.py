"""What a config's DAG costs before it runs: the census of the grid's forwards (shapes x counts,
``fair-calib census``) and its GPU-hours (``fair-calib cost``).

``census``            the forwards each evaluation and calibration job makes
``census_tokenizer``  a stand-in tokenizer where a model's own is not on disk
``cost``              the census priced in GPU-hours, per job and in total
"""
