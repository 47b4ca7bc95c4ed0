"""The reproduction of the GrCNF paper's experiments, and the comparisons with E-NF and the
equivariant flow-matching baseline (EFM), on top of the `grassflow` library.

``grassflow reproduce ...`` runs them (`commands`); each module is one experiment:

- `textures_figures`: §5.1, Figures 3 and 4 and the NLL table;
- `fm_vs_mle`: maximum likelihood against flow matching on the textures;
- `table1`: §5.2, DW4 and LJ13 against the training size;
- `qm9_runs` and `qm9_report`: §5.3, QM9 positional (Table 2, Figure 5);
- `vs_enf`, `efm`, `vs_report` and `boltzmann_report`: Cartesian NLLs
  on E-NF's splits, the EFM baseline, and Boltzmann-generator metrics; `enf_protocol`: the
  splits and the evaluation line both comparisons share.

The library never imports this package: it plugs into the CLI through entry points.
"""
