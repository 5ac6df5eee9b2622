def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slurm: end-to-end runs through a real SLURM cluster (tests/slurm/slurm_up.sh); "
        "skipped unless FAIR_CALIB_SLURM_TEST=1")
