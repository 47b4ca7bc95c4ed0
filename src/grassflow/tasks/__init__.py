"""Runs that ``grassflow train`` makes and ``eval``, ``sample`` and ``plot`` read: one module
per kind of run (:mod:`.texture_runs`, :mod:`.particle_runs`, :mod:`.shape_runs`), the run
directory's identity and preset (:mod:`.run_dir`), and the registry of kinds
(:mod:`.registry`), which other packages extend through entry points.

Each kind module has a preset dataclass (``...Experiment``), ``run(exp, run_dir)`` (train or
continue, resumably), ``load_run(run_dir)`` and ``evaluate(run_dir)``.
"""
