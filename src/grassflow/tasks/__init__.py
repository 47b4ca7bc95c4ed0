"""Runs that ``grassflow train`` makes and ``eval``, ``sample`` and ``plot`` read: one module
per kind of run (`texture_runs`, `particle_runs`, `shape_runs`), the run
directory's identity and preset (`run_dir`), and the registry of kinds
(`registry`), which other packages extend through entry points.

Each kind module has a preset dataclass (``...Experiment``), ``run(exp, run_dir)`` (train or
continue, resumably), ``load_run(run_dir)`` and ``evaluate(run_dir)``.
"""
