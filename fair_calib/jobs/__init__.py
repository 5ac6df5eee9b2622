"""What a stage run as a job needs to run safely (nothing here imports a stage).

``io``             Parquet with schemas and provenance, safetensors, JSON/JSONL; atomic writes
``job_lock``       one job per output: the exclusive lock a stage holds for its whole life
``job_log``        the job's log (opened once it holds its lock; side logs of waiting jobs)
``job_watch``      a forked watcher that reports a death by signal (SIGKILL: out of memory)
``failures``       a failed job's one-line cause, for Snakemake's console (the Snakefile)
``preflight``      refusals before any job: locks, corrupt or incomplete intermediates
``gpu_slots``      a card per ``device: cuda`` job on one machine
``job_resources``  a rule's memory, threads and runtime (the Snakefile's resources)
``environment``    can this machine run the settings (device: cuda, dtype), checked before a job;
                   ``env_choice`` for the FAIR_CALIB_* switches
``numerics``       pinned CPU numerics (the same bits on x86-64 CPUs of one vendor), and the
                   check of the tiny models against tests/recorded_hashes.json (.ci/run)
``memory``         a calibration's peak memory (the calib_memory table)
``model_identity`` a model's weights hash, and the calibration-to-weights pairing
``model_tracking`` weights changed in place replan the jobs that read them (the Snakefile)
"""
