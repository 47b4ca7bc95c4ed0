"""Data: the paper's textures, DW4 and LJ13 (energies, MCMC, the published files), QM9
positional, users' own point clouds (``.npy``, ``.npz``, ``.xyz``, ``.sdf``; molecules keep
their bonds) and conformer ensembles of their molecules. The Grassmann representation of
clouds is `grassflow.manifolds.shape_space`.
"""

from .cloud_chemistry import PointClouds
from .conformers import ConformerEnsemble, conformer_ensemble
from .mcmc import make_dataset, sample_mcmc
from .molecule_files import read_sdf, write_sdf
from .particle_files import load_splits
from .particles import get_system
from .point_clouds import load_point_clouds, save_clouds, write_xyz
from .qm9 import load_qm9_positional
from .textures import TEXTURES, sample_texture, texture_splits

__all__ = [
    "TEXTURES",
    "ConformerEnsemble",
    "PointClouds",
    "conformer_ensemble",
    "get_system",
    "load_point_clouds",
    "load_qm9_positional",
    "load_splits",
    "make_dataset",
    "read_sdf",
    "sample_mcmc",
    "sample_texture",
    "save_clouds",
    "texture_splits",
    "write_sdf",
    "write_xyz",
]
