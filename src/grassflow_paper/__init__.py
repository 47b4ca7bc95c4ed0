"""The reproduction of the GrCNF paper's experiments, and the comparisons with E-NF and the
equivariant flow-matching baseline (EFM), on top of the :mod:`grassflow` library.

``grassflow reproduce ...`` runs them (:mod:`.commands`); each module is one experiment:

- :mod:`.textures_figures`: §5.1, Figures 3 and 4 and the NLL table;
- :mod:`.fm_vs_mle`: maximum likelihood against flow matching on the textures;
- :mod:`.table1`: §5.2, DW4 and LJ13 against the training size;
- :mod:`.qm9_runs` and :mod:`.qm9_report`: §5.3, QM9 positional (Table 2, Figure 5);
- :mod:`.vs_enf`, :mod:`.efm`, :mod:`.vs_report` and :mod:`.boltzmann_report`: Cartesian NLLs
  on E-NF's splits, the EFM baseline, and Boltzmann-generator metrics.

The library never imports this package: it plugs into the CLI through entry points.
"""
